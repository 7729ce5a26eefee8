"""caffe.proto's deprecated V1 (``layers { type: CONVOLUTION }``) and V0 (``layers { layer { type: "conv" } }``) layer messages."""

PROTO = r"""
message V1LayerParameter {
  enum LayerType {
    NONE = 0; ABSVAL = 35; ACCURACY = 1; ARGMAX = 30; BNLL = 2; CONCAT = 3; CONTRASTIVE_LOSS = 37;
    CONVOLUTION = 4; DATA = 5; DECONVOLUTION = 39; DROPOUT = 6; DUMMY_DATA = 32; EUCLIDEAN_LOSS = 7;
    ELTWISE = 25; EXP = 38; FLATTEN = 8; HDF5_DATA = 9; HDF5_OUTPUT = 10; HINGE_LOSS = 28; IM2COL = 11;
    IMAGE_DATA = 12; INFOGAIN_LOSS = 13; INNER_PRODUCT = 14; LRN = 15; MEMORY_DATA = 29;
    MULTINOMIAL_LOGISTIC_LOSS = 16; MVN = 34; POOLING = 17; POWER = 26; RELU = 18; SIGMOID = 19;
    SIGMOID_CROSS_ENTROPY_LOSS = 27; SILENCE = 36; SOFTMAX = 20; SOFTMAX_LOSS = 21; SPLIT = 22;
    SLICE = 33; TANH = 23; WINDOW_DATA = 24; THRESHOLD = 31;
  }
  enum DimCheckMode { STRICT = 0; PERMISSIVE = 1; }
  repeated string bottom = 2;
  repeated string top = 3;
  optional string name = 4;
  repeated NetStateRule include = 32;
  repeated NetStateRule exclude = 33;
  optional LayerType type = 5;
  repeated BlobProto blobs = 6;
  repeated string param = 1001;
  repeated DimCheckMode blob_share_mode = 1002;
  repeated float blobs_lr = 7;
  repeated float weight_decay = 8;
  repeated float loss_weight = 35;
  optional AccuracyParameter accuracy_param = 27;
  optional ArgMaxParameter argmax_param = 23;
  optional ConcatParameter concat_param = 9;
  optional ContrastiveLossParameter contrastive_loss_param = 40;
  optional ConvolutionParameter convolution_param = 10;
  optional DataParameter data_param = 11;
  optional DropoutParameter dropout_param = 12;
  optional DummyDataParameter dummy_data_param = 26;
  optional EltwiseParameter eltwise_param = 24;
  optional ExpParameter exp_param = 41;
  optional HDF5DataParameter hdf5_data_param = 13;
  optional HDF5OutputParameter hdf5_output_param = 14;
  optional HingeLossParameter hinge_loss_param = 29;
  optional ImageDataParameter image_data_param = 15;
  optional InfogainLossParameter infogain_loss_param = 16;
  optional InnerProductParameter inner_product_param = 17;
  optional LRNParameter lrn_param = 18;
  optional MemoryDataParameter memory_data_param = 22;
  optional MVNParameter mvn_param = 34;
  optional PoolingParameter pooling_param = 19;
  optional PowerParameter power_param = 21;
  optional ReLUParameter relu_param = 30;
  optional SigmoidParameter sigmoid_param = 38;
  optional SoftmaxParameter softmax_param = 39;
  optional SliceParameter slice_param = 31;
  optional TanHParameter tanh_param = 37;
  optional ThresholdParameter threshold_param = 25;
  optional WindowDataParameter window_data_param = 20;
  optional TransformationParameter transform_param = 36;
  optional LossParameter loss_param = 42;
  optional V0LayerParameter layer = 1;
}

message V0LayerParameter {
  enum PoolMethod { MAX = 0; AVE = 1; STOCHASTIC = 2; }
  optional string name = 1;
  optional string type = 2;
  optional uint32 num_output = 3;
  optional bool biasterm = 4 [default = true];
  optional FillerParameter weight_filler = 5;
  optional FillerParameter bias_filler = 6;
  optional uint32 pad = 7 [default = 0];
  optional uint32 kernelsize = 8;
  optional uint32 group = 9 [default = 1];
  optional uint32 stride = 10 [default = 1];
  optional PoolMethod pool = 11 [default = MAX];
  optional float dropout_ratio = 12 [default = 0.5];
  optional uint32 local_size = 13 [default = 5];
  optional float alpha = 14 [default = 1.0];
  optional float beta = 15 [default = 0.75];
  optional float k = 22 [default = 1.0];
  optional string source = 16;
  optional float scale = 17 [default = 1];
  optional string meanfile = 18;
  optional uint32 batchsize = 19;
  optional uint32 cropsize = 20 [default = 0];
  optional bool mirror = 21 [default = false];
  repeated BlobProto blobs = 50;
  repeated float blobs_lr = 51;
  repeated float weight_decay = 52;
  optional uint32 rand_skip = 53 [default = 0];
  optional float det_fg_threshold = 54 [default = 0.5];
  optional float det_bg_threshold = 55 [default = 0.5];
  optional float det_fg_fraction = 56 [default = 0.25];
  optional uint32 det_context_pad = 58 [default = 0];
  optional string det_crop_mode = 59 [default = "warp"];
  optional int32 new_num = 60 [default = 0];
  optional int32 new_channels = 61 [default = 0];
  optional int32 new_height = 62 [default = 0];
  optional int32 new_width = 63 [default = 0];
  optional bool shuffle_images = 64 [default = false];
  optional uint32 concat_dim = 65 [default = 1];
  optional HDF5OutputParameter hdf5_output_param = 1001;
}
"""
