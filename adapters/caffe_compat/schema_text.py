"""The supported subset of Caffe's caffe.proto (package ``caffe``), field-compatible by number and default."""

# Message and field names, numbers and defaults are Caffe's, so files move both ways between
# Caffe and ddl-caffe; fields Caffe has and this subset lacks survive a binary round trip as
# unknown fields. The grammar is the plain proto2 subset that ``schema.py`` reads.
PROTO = r"""
enum Phase { TRAIN = 0; TEST = 1; }

message BlobShape { repeated int64 dim = 1 [packed = true]; }

message BlobProto {
  optional BlobShape shape = 7;
  repeated float data = 5 [packed = true];
  repeated float diff = 6 [packed = true];
  repeated double double_data = 8 [packed = true];
  repeated double double_diff = 9 [packed = true];
  optional int32 num = 1 [default = 0];
  optional int32 channels = 2 [default = 0];
  optional int32 height = 3 [default = 0];
  optional int32 width = 4 [default = 0];
}

message BlobProtoVector { repeated BlobProto blobs = 1; }

message Datum {
  optional int32 channels = 1;
  optional int32 height = 2;
  optional int32 width = 3;
  optional bytes data = 4;
  optional int32 label = 5;
  repeated float float_data = 6;
  optional bool encoded = 7 [default = false];
}

message FillerParameter {
  enum VarianceNorm { FAN_IN = 0; FAN_OUT = 1; AVERAGE = 2; }
  optional string type = 1 [default = "constant"];
  optional float value = 2 [default = 0];
  optional float min = 3 [default = 0];
  optional float max = 4 [default = 1];
  optional float mean = 5 [default = 0];
  optional float std = 6 [default = 1];
  optional int32 sparse = 7 [default = -1];
  optional VarianceNorm variance_norm = 8 [default = FAN_IN];
}

message NetParameter {
  optional string name = 1;
  repeated string input = 3;
  repeated BlobShape input_shape = 8;
  repeated int32 input_dim = 4;
  optional bool force_backward = 5 [default = false];
  optional NetState state = 6;
  optional bool debug_info = 7 [default = false];
  repeated LayerParameter layer = 100;
  repeated V1LayerParameter layers = 2;
}

message V1LayerParameter { optional string name = 4; }

message SolverParameter {
  enum SnapshotFormat { HDF5 = 0; BINARYPROTO = 1; }
  enum SolverMode { CPU = 0; GPU = 1; }
  enum SolverType { SGD = 0; NESTEROV = 1; ADAGRAD = 2; RMSPROP = 3; ADADELTA = 4; ADAM = 5; }
  optional string net = 24;
  optional NetParameter net_param = 25;
  optional string train_net = 1;
  repeated string test_net = 2;
  optional NetParameter train_net_param = 21;
  repeated NetParameter test_net_param = 22;
  optional NetState train_state = 26;
  repeated NetState test_state = 27;
  repeated int32 test_iter = 3;
  optional int32 test_interval = 4 [default = 0];
  optional bool test_compute_loss = 19 [default = false];
  optional bool test_initialization = 32 [default = true];
  optional float base_lr = 5;
  optional int32 display = 6;
  optional int32 average_loss = 33 [default = 1];
  optional int32 max_iter = 7;
  optional int32 iter_size = 36 [default = 1];
  optional string lr_policy = 8;
  optional float gamma = 9;
  optional float power = 10;
  optional float momentum = 11;
  optional float weight_decay = 12;
  optional string regularization_type = 29 [default = "L2"];
  optional int32 stepsize = 13;
  repeated int32 stepvalue = 34;
  optional float clip_gradients = 35 [default = -1];
  optional int32 snapshot = 14 [default = 0];
  optional string snapshot_prefix = 15;
  optional bool snapshot_diff = 16 [default = false];
  optional SnapshotFormat snapshot_format = 37 [default = BINARYPROTO];
  optional SolverMode solver_mode = 17 [default = GPU];
  optional int32 device_id = 18 [default = 0];
  optional int64 random_seed = 20 [default = -1];
  optional string type = 40 [default = "SGD"];
  optional float delta = 31 [default = 1e-8];
  optional float momentum2 = 39 [default = 0.999];
  optional float rms_decay = 38 [default = 0.99];
  optional bool debug_info = 23 [default = false];
  optional bool snapshot_after_train = 28 [default = true];
  optional SolverType solver_type = 30 [default = SGD];
  optional bool layer_wise_reduce = 41 [default = true];
  repeated string weights = 42;
}

message SolverState {
  optional int32 iter = 1;
  optional string learned_net = 2;
  repeated BlobProto history = 3;
  optional int32 current_step = 4 [default = 0];
}

message NetState {
  optional Phase phase = 1 [default = TEST];
  optional int32 level = 2 [default = 0];
  repeated string stage = 3;
}

message NetStateRule {
  optional Phase phase = 1;
  optional int32 min_level = 2;
  optional int32 max_level = 3;
  repeated string stage = 4;
  repeated string not_stage = 5;
}

message ParamSpec {
  enum DimCheckMode { STRICT = 0; PERMISSIVE = 1; }
  optional string name = 1;
  optional DimCheckMode share_mode = 2;
  optional float lr_mult = 3 [default = 1.0];
  optional float decay_mult = 4 [default = 1.0];
}

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
  optional BatchNormParameter batch_norm_param = 139;
  optional ConcatParameter concat_param = 104;
  optional ConvolutionParameter convolution_param = 106;
  optional DataParameter data_param = 107;
  optional DropoutParameter dropout_param = 108;
  optional DummyDataParameter dummy_data_param = 109;
  optional EltwiseParameter eltwise_param = 110;
  optional FlattenParameter flatten_param = 135;
  optional HDF5DataParameter hdf5_data_param = 112;
  optional InnerProductParameter inner_product_param = 117;
  optional InputParameter input_param = 143;
  optional LRNParameter lrn_param = 118;
  optional PoolingParameter pooling_param = 121;
  optional ReLUParameter relu_param = 123;
  optional ReshapeParameter reshape_param = 133;
  optional ScaleParameter scale_param = 142;
  optional SigmoidParameter sigmoid_param = 124;
  optional SoftmaxParameter softmax_param = 125;
  optional TanHParameter tanh_param = 127;
}

message TransformationParameter {
  optional float scale = 1 [default = 1];
  optional bool mirror = 2 [default = false];
  optional uint32 crop_size = 3 [default = 0];
  optional string mean_file = 4;
  repeated float mean_value = 5;
  optional bool force_color = 6 [default = false];
  optional bool force_gray = 7 [default = false];
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

message BatchNormParameter {
  optional bool use_global_stats = 1;
  optional float moving_average_fraction = 2 [default = 0.999];
  optional float eps = 3 [default = 1e-5];
}

message ConcatParameter {
  optional int32 axis = 2 [default = 1];
  optional uint32 concat_dim = 1 [default = 1];
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

message FlattenParameter {
  optional int32 axis = 1 [default = 1];
  optional int32 end_axis = 2 [default = -1];
}

message HDF5DataParameter {
  optional string source = 1;
  optional uint32 batch_size = 2;
  optional bool shuffle = 3 [default = false];
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

message SoftmaxParameter {
  enum Engine { DEFAULT = 0; CAFFE = 1; CUDNN = 2; }
  optional Engine engine = 1 [default = DEFAULT];
  optional int32 axis = 2 [default = 1];
}

message TanHParameter {
  enum Engine { DEFAULT = 0; CAFFE = 1; CUDNN = 2; }
  optional Engine engine = 1 [default = DEFAULT];
}
"""
