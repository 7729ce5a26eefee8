"""caffe.proto's LayerParameter and every BVLC layer parameter message, by Caffe's numbers and defaults."""

# LayerParameter also names the fork parameters real nets carry (SSD's 200-207 as SSD numbers
# them; upsample_param as most forks do; interp_param and ceil_mode, which collide with BVLC
# numbers in their forks, moved above 1000: prototxt is text, and .caffemodel weights are read
# by layer name and blobs only).
PROTO = r"""
message LayerParameter {
  optional string name = 1;
  optional string type = 2;
  repeated string bottom = 3;
  repeated string top = 4;
  optional Phase phase = 10;
  repeated float loss_weight = 5;
  repeated ParamSpec param = 6;
  repeated BlobProto blobs = 7;
  repeated bool propagate_down = 11;
  repeated NetStateRule include = 8;
  repeated NetStateRule exclude = 9;
  optional TransformationParameter transform_param = 100;
  optional LossParameter loss_param = 101;
  optional AccuracyParameter accuracy_param = 102;
  optional ArgMaxParameter argmax_param = 103;
  optional BatchNormParameter batch_norm_param = 139;
  optional BiasParameter bias_param = 141;
  optional ClipParameter clip_param = 148;
  optional ConcatParameter concat_param = 104;
  optional ContrastiveLossParameter contrastive_loss_param = 105;
  optional ConvolutionParameter convolution_param = 106;
  optional CropParameter crop_param = 144;
  optional DataParameter data_param = 107;
  optional DropoutParameter dropout_param = 108;
  optional DummyDataParameter dummy_data_param = 109;
  optional EltwiseParameter eltwise_param = 110;
  optional ELUParameter elu_param = 140;
  optional EmbedParameter embed_param = 137;
  optional ExpParameter exp_param = 111;
  optional FlattenParameter flatten_param = 135;
  optional HDF5DataParameter hdf5_data_param = 112;
  optional HDF5OutputParameter hdf5_output_param = 113;
  optional HingeLossParameter hinge_loss_param = 114;
  optional ImageDataParameter image_data_param = 115;
  optional InfogainLossParameter infogain_loss_param = 116;
  optional InnerProductParameter inner_product_param = 117;
  optional InputParameter input_param = 143;
  optional LogParameter log_param = 134;
  optional LRNParameter lrn_param = 118;
  optional MemoryDataParameter memory_data_param = 119;
  optional MVNParameter mvn_param = 120;
  optional ParameterParameter parameter_param = 145;
  optional PoolingParameter pooling_param = 121;
  optional PowerParameter power_param = 122;
  optional PReLUParameter prelu_param = 131;
  optional PythonParameter python_param = 130;
  optional RecurrentParameter recurrent_param = 146;
  optional ReductionParameter reduction_param = 136;
  optional ReLUParameter relu_param = 123;
  optional ReshapeParameter reshape_param = 133;
  optional ScaleParameter scale_param = 142;
  optional SigmoidParameter sigmoid_param = 124;
  optional SoftmaxParameter softmax_param = 125;
  optional SPPParameter spp_param = 132;
  optional SliceParameter slice_param = 126;
  optional SwishParameter swish_param = 147;
  optional TanHParameter tanh_param = 127;
  optional ThresholdParameter threshold_param = 128;
  optional TileParameter tile_param = 138;
  optional WindowDataParameter window_data_param = 129;
  optional AnnotatedDataParameter annotated_data_param = 200;
  optional MultiBoxLossParameter multibox_loss_param = 201;
  optional PermuteParameter permute_param = 202;
  optional PriorBoxParameter prior_box_param = 203;
  optional DetectionOutputParameter detection_output_param = 204;
  optional DetectionEvaluateParameter detection_evaluate_param = 205;
  optional NormalizeParameter norm_param = 206;
  optional VideoDataParameter video_data_param = 207;
  optional UpsampleParameter upsample_param = 149;
  optional InterpParameter interp_param = 2143;
}

message TransformationParameter {
  optional float scale = 1 [default = 1];
  optional bool mirror = 2 [default = false];
  optional uint32 crop_size = 3 [default = 0];
  optional uint32 crop_h = 11 [default = 0];
  optional uint32 crop_w = 12 [default = 0];
  optional string mean_file = 4;
  repeated float mean_value = 5;
  optional bool force_color = 6 [default = false];
  optional bool force_gray = 7 [default = false];
  optional ResizeParameter resize_param = 8;
  optional NoiseParameter noise_param = 9;
  optional DistortionParameter distort_param = 13;
  optional ExpansionParameter expand_param = 14;
  optional EmitConstraint emit_constraint = 10;
}

message LossParameter {
  enum NormalizationMode { FULL = 0; VALID = 1; BATCH_SIZE = 2; NONE = 3; }
  optional int32 ignore_label = 1;
  optional NormalizationMode normalization = 3 [default = VALID];
  optional bool normalize = 2;
}

message AccuracyParameter {
  optional uint32 top_k = 1 [default = 1];
  optional int32 axis = 2 [default = 1];
  optional int32 ignore_label = 3;
}

message ArgMaxParameter {
  optional bool out_max_val = 1 [default = false];
  optional uint32 top_k = 2 [default = 1];
  optional int32 axis = 3;
}

message BatchNormParameter {
  optional bool use_global_stats = 1;
  optional float moving_average_fraction = 2 [default = 0.999];
  optional float eps = 3 [default = 1e-5];
}

message BiasParameter {
  optional int32 axis = 1 [default = 1];
  optional int32 num_axes = 2 [default = 1];
  optional FillerParameter filler = 3;
}

message ClipParameter {
  optional float min = 1;
  optional float max = 2;
}

message ConcatParameter {
  optional int32 axis = 2 [default = 1];
  optional uint32 concat_dim = 1 [default = 1];
}

message ContrastiveLossParameter {
  optional float margin = 1 [default = 1.0];
  optional bool legacy_version = 2 [default = false];
}

message ConvolutionParameter {
  enum Engine { DEFAULT = 0; CAFFE = 1; CUDNN = 2; }
  optional uint32 num_output = 1;
  optional bool bias_term = 2 [default = true];
  repeated uint32 pad = 3;
  repeated uint32 kernel_size = 4;
  repeated uint32 stride = 6;
  repeated uint32 dilation = 18;
  optional uint32 pad_h = 9 [default = 0];
  optional uint32 pad_w = 10 [default = 0];
  optional uint32 kernel_h = 11;
  optional uint32 kernel_w = 12;
  optional uint32 stride_h = 13;
  optional uint32 stride_w = 14;
  optional uint32 group = 5 [default = 1];
  optional FillerParameter weight_filler = 7;
  optional FillerParameter bias_filler = 8;
  optional Engine engine = 15 [default = DEFAULT];
  optional int32 axis = 16 [default = 1];
  optional bool force_nd_im2col = 17 [default = false];
}

message CropParameter {
  optional int32 axis = 1 [default = 2];
  repeated uint32 offset = 2;
}

message DataParameter {
  enum DB { LEVELDB = 0; LMDB = 1; }
  optional string source = 1;
  optional uint32 batch_size = 4;
  optional uint32 rand_skip = 7 [default = 0];
  optional DB backend = 8 [default = LEVELDB];
  optional float scale = 2 [default = 1];
  optional string mean_file = 3;
  optional uint32 crop_size = 5 [default = 0];
  optional bool mirror = 6 [default = false];
  optional bool force_encoded_color = 9 [default = false];
  optional uint32 prefetch = 10 [default = 4];
}

message DropoutParameter { optional float dropout_ratio = 1 [default = 0.5]; }

message DummyDataParameter {
  repeated FillerParameter data_filler = 1;
  repeated BlobShape shape = 6;
  repeated uint32 num = 2;
  repeated uint32 channels = 3;
  repeated uint32 height = 4;
  repeated uint32 width = 5;
}

message EltwiseParameter {
  enum EltwiseOp { PROD = 0; SUM = 1; MAX = 2; }
  optional EltwiseOp operation = 1 [default = SUM];
  repeated float coeff = 2;
  optional bool stable_prod_grad = 3 [default = true];
}

message ELUParameter { optional float alpha = 1 [default = 1]; }

message EmbedParameter {
  optional uint32 num_output = 1;
  optional uint32 input_dim = 2;
  optional bool bias_term = 3 [default = true];
  optional FillerParameter weight_filler = 4;
  optional FillerParameter bias_filler = 5;
}

message ExpParameter {
  optional float base = 1 [default = -1.0];
  optional float scale = 2 [default = 1.0];
  optional float shift = 3 [default = 0.0];
}

message FlattenParameter {
  optional int32 axis = 1 [default = 1];
  optional int32 end_axis = 2 [default = -1];
}

message HDF5DataParameter {
  optional string source = 1;
  optional uint32 batch_size = 2;
  optional bool shuffle = 3 [default = false];
}

message HDF5OutputParameter { optional string file_name = 1; }

message HingeLossParameter {
  enum Norm { L1 = 1; L2 = 2; }
  optional Norm norm = 1 [default = L1];
}

message ImageDataParameter {
  optional string source = 1;
  optional uint32 batch_size = 4 [default = 1];
  optional uint32 rand_skip = 7 [default = 0];
  optional bool shuffle = 8 [default = false];
  optional uint32 new_height = 9 [default = 0];
  optional uint32 new_width = 10 [default = 0];
  optional bool is_color = 11 [default = true];
  optional float scale = 2 [default = 1];
  optional string mean_file = 3;
  optional uint32 crop_size = 5 [default = 0];
  optional bool mirror = 6 [default = false];
  optional string root_folder = 12 [default = ""];
}

message InfogainLossParameter {
  optional string source = 1;
  optional int32 axis = 2 [default = 1];
}

message InnerProductParameter {
  optional uint32 num_output = 1;
  optional bool bias_term = 2 [default = true];
  optional FillerParameter weight_filler = 3;
  optional FillerParameter bias_filler = 4;
  optional int32 axis = 5 [default = 1];
  optional bool transpose = 6 [default = false];
}

message InputParameter { repeated BlobShape shape = 1; }

message LogParameter {
  optional float base = 1 [default = -1.0];
  optional float scale = 2 [default = 1.0];
  optional float shift = 3 [default = 0.0];
}

message LRNParameter {
  enum NormRegion { ACROSS_CHANNELS = 0; WITHIN_CHANNEL = 1; }
  enum Engine { DEFAULT = 0; CAFFE = 1; CUDNN = 2; }
  optional uint32 local_size = 1 [default = 5];
  optional float alpha = 2 [default = 1.0];
  optional float beta = 3 [default = 0.75];
  optional NormRegion norm_region = 4 [default = ACROSS_CHANNELS];
  optional float k = 5 [default = 1.0];
  optional Engine engine = 6 [default = DEFAULT];
}

message MemoryDataParameter {
  optional uint32 batch_size = 1;
  optional uint32 channels = 2;
  optional uint32 height = 3;
  optional uint32 width = 4;
}

message MVNParameter {
  optional bool normalize_variance = 1 [default = true];
  optional bool across_channels = 2 [default = false];
  optional float eps = 3 [default = 1e-9];
}

message ParameterParameter { optional BlobShape shape = 1; }

message PoolingParameter {
  enum PoolMethod { MAX = 0; AVE = 1; STOCHASTIC = 2; }
  enum Engine { DEFAULT = 0; CAFFE = 1; CUDNN = 2; }
  enum RoundMode { CEIL = 0; FLOOR = 1; }
  optional PoolMethod pool = 1 [default = MAX];
  optional uint32 pad = 4 [default = 0];
  optional uint32 pad_h = 9 [default = 0];
  optional uint32 pad_w = 10 [default = 0];
  optional uint32 kernel_size = 2;
  optional uint32 kernel_h = 5;
  optional uint32 kernel_w = 6;
  optional uint32 stride = 3 [default = 1];
  optional uint32 stride_h = 7;
  optional uint32 stride_w = 8;
  optional Engine engine = 11 [default = DEFAULT];
  optional bool global_pooling = 12 [default = false];
  optional RoundMode round_mode = 13 [default = CEIL];
  optional bool ceil_mode = 1013 [default = true];
}

message PowerParameter {
  optional float power = 1 [default = 1.0];
  optional float scale = 2 [default = 1.0];
  optional float shift = 3 [default = 0.0];
}

message PReLUParameter {
  optional FillerParameter filler = 1;
  optional bool channel_shared = 2 [default = false];
}

message PythonParameter {
  optional string module = 1;
  optional string layer = 2;
  optional string param_str = 3 [default = ""];
  optional bool share_in_parallel = 4 [default = false];
}

message RecurrentParameter {
  optional uint32 num_output = 1 [default = 0];
  optional FillerParameter weight_filler = 2;
  optional FillerParameter bias_filler = 3;
  optional bool debug_info = 4 [default = false];
  optional bool expose_hidden = 5 [default = false];
}

message ReductionParameter {
  enum ReductionOp { SUM = 1; ASUM = 2; SUMSQ = 3; MEAN = 4; }
  optional ReductionOp operation = 1 [default = SUM];
  optional int32 axis = 2 [default = 0];
  optional float coeff = 3 [default = 1.0];
}

message ReLUParameter {
  enum Engine { DEFAULT = 0; CAFFE = 1; CUDNN = 2; }
  optional float negative_slope = 1 [default = 0];
  optional Engine engine = 2 [default = DEFAULT];
}

message ReshapeParameter {
  optional BlobShape shape = 1;
  optional int32 axis = 2 [default = 0];
  optional int32 num_axes = 3 [default = -1];
}

message ScaleParameter {
  optional int32 axis = 1 [default = 1];
  optional int32 num_axes = 2 [default = 1];
  optional FillerParameter filler = 3;
  optional bool bias_term = 4 [default = false];
  optional FillerParameter bias_filler = 5;
}

message SigmoidParameter {
  enum Engine { DEFAULT = 0; CAFFE = 1; CUDNN = 2; }
  optional Engine engine = 1 [default = DEFAULT];
}

message SliceParameter {
  optional int32 axis = 3 [default = 1];
  repeated uint32 slice_point = 2;
  optional uint32 slice_dim = 1 [default = 1];
}

message SoftmaxParameter {
  enum Engine { DEFAULT = 0; CAFFE = 1; CUDNN = 2; }
  optional Engine engine = 1 [default = DEFAULT];
  optional int32 axis = 2 [default = 1];
}

message SwishParameter { optional float beta = 1 [default = 1]; }

message TanHParameter {
  enum Engine { DEFAULT = 0; CAFFE = 1; CUDNN = 2; }
  optional Engine engine = 1 [default = DEFAULT];
}

message TileParameter {
  optional int32 axis = 1 [default = 1];
  optional int32 tiles = 2;
}

message ThresholdParameter { optional float threshold = 1 [default = 0]; }

message WindowDataParameter {
  optional string source = 1;
  optional float scale = 2 [default = 1];
  optional string mean_file = 3;
  optional uint32 batch_size = 4;
  optional uint32 crop_size = 5 [default = 0];
  optional bool mirror = 6 [default = false];
  optional float fg_threshold = 7 [default = 0.5];
  optional float bg_threshold = 8 [default = 0.5];
  optional float fg_fraction = 9 [default = 0.25];
  optional uint32 context_pad = 10 [default = 0];
  optional string crop_mode = 11 [default = "warp"];
  optional bool cache_images = 12 [default = false];
  optional string root_folder = 13 [default = ""];
}

message SPPParameter {
  enum PoolMethod { MAX = 0; AVE = 1; STOCHASTIC = 2; }
  enum Engine { DEFAULT = 0; CAFFE = 1; CUDNN = 2; }
  optional uint32 pyramid_height = 1;
  optional PoolMethod pool = 2 [default = MAX];
  optional Engine engine = 6 [default = DEFAULT];
}
"""
