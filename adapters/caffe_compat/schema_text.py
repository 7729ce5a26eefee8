"""caffe.proto's core messages (blobs, nets, solvers, states), field-compatible with Caffe by number and default."""

# Message and field names, numbers and defaults are Caffe's, so files move both ways between
# Caffe and ddl-caffe. The layer parameters are in schema_layers_text, the V0/V1 formats in
# schema_legacy_text and the fork messages (SSD, upsampling, ...) in schema_forks_text; the
# grammar is the plain proto2 subset that ``schema.py`` reads.
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
  // SSD's fork numbers these 41, 42 and 44 (BVLC took 41 and 42); solvers are text, so the
  // names are what matters.
  optional string eval_type = 1041 [default = "classification"];
  optional string ap_version = 1042 [default = "Integral"];
  optional bool show_per_class_result = 1044 [default = false];
  // The "plateau" lr policy of some forks (refused, but its solvers parse).
  repeated int32 plateau_winsize = 1043;
}

message SolverState {
  optional int32 iter = 1;
  optional string learned_net = 2;
  repeated BlobProto history = 3;
  optional int32 current_step = 4 [default = 0];
  optional float minimum_loss = 5 [default = 1e38];
  optional int32 iter_last_event = 6 [default = 0];
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
"""
