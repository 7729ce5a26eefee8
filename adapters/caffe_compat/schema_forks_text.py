"""Messages of the Caffe forks that zoo nets carry: SSD (weiliu89), upsampling (SegNet, YOLOv3) and Interp (DeepLab, PSPNet)."""

# SSD's messages are given in full so that its prototxts parse; ddl-caffe runs Permute,
# PriorBox, Normalize and DetectionOutput (inference) and refuses the rest by name.
PROTO = r"""
message ResizeParameter {
  enum Resize_mode { WARP = 1; FIT_SMALL_SIZE = 2; FIT_LARGE_SIZE_AND_PAD = 3; }
  enum Pad_mode { CONSTANT = 1; MIRRORED = 2; REPEAT_NEAREST = 3; }
  enum Interp_mode { LINEAR = 1; AREA = 2; NEAREST = 3; CUBIC = 4; LANCZOS4 = 5; }
  optional float prob = 1 [default = 1];
  optional Resize_mode resize_mode = 2 [default = WARP];
  optional uint32 height = 3 [default = 0];
  optional uint32 width = 4 [default = 0];
  optional uint32 height_scale = 8 [default = 0];
  optional uint32 width_scale = 9 [default = 0];
  optional Pad_mode pad_mode = 5 [default = CONSTANT];
  repeated float pad_value = 6;
  repeated Interp_mode interp_mode = 7;
}

message SaltPepperParameter {
  optional float fraction = 1 [default = 0];
  repeated float value = 2;
}

message NoiseParameter {
  optional float prob = 1 [default = 0];
  optional bool hist_eq = 2 [default = false];
  optional bool inverse = 3 [default = false];
  optional bool decolorize = 4 [default = false];
  optional bool gauss_blur = 5 [default = false];
  optional float jpeg = 6 [default = -1];
  optional bool posterize = 7 [default = false];
  optional bool erode = 8 [default = false];
  optional bool saltpepper = 9 [default = false];
  optional SaltPepperParameter saltpepper_param = 10;
  optional bool clahe = 11 [default = false];
  optional bool convert_to_hsv = 12 [default = false];
  optional bool convert_to_lab = 13 [default = false];
}

message DistortionParameter {
  optional float brightness_prob = 1 [default = 0.0];
  optional float brightness_delta = 2 [default = 0.0];
  optional float contrast_prob = 3 [default = 0.0];
  optional float contrast_lower = 4 [default = 0.0];
  optional float contrast_upper = 5 [default = 0.0];
  optional float hue_prob = 6 [default = 0.0];
  optional float hue_delta = 7 [default = 0.0];
  optional float saturation_prob = 8 [default = 0.0];
  optional float saturation_lower = 9 [default = 0.0];
  optional float saturation_upper = 10 [default = 0.0];
  optional float random_order_prob = 11 [default = 0.0];
}

message ExpansionParameter {
  optional float prob = 1 [default = 1];
  optional float max_expand_ratio = 2 [default = 1.0];
}

message EmitConstraint {
  enum EmitType { CENTER = 0; MIN_OVERLAP = 1; }
  optional EmitType emit_type = 1 [default = CENTER];
  optional float emit_overlap = 2;
}

message Sampler {
  optional float min_scale = 1 [default = 1.0];
  optional float max_scale = 2 [default = 1.0];
  optional float min_aspect_ratio = 3 [default = 1.0];
  optional float max_aspect_ratio = 4 [default = 1.0];
}

message SampleConstraint {
  optional float min_jaccard_overlap = 1;
  optional float max_jaccard_overlap = 2;
  optional float min_sample_coverage = 3;
  optional float max_sample_coverage = 4;
  optional float min_object_coverage = 5;
  optional float max_object_coverage = 6;
}

message BatchSampler {
  optional bool use_original_image = 1 [default = true];
  optional Sampler sampler = 2;
  optional SampleConstraint sample_constraint = 3;
  optional uint32 max_sample = 4;
  optional uint32 max_trials = 5 [default = 100];
}

message AnnotatedDataParameter {
  enum AnnoType { BBOX = 0; }
  repeated BatchSampler batch_sampler = 1;
  optional string label_map_file = 2;
  optional AnnoType anno_type = 3;
}

message NonMaximumSuppressionParameter {
  optional float nms_threshold = 1 [default = 0.3];
  optional int32 top_k = 2;
  optional float eta = 3 [default = 1.0];
}

message SaveOutputParameter {
  optional string output_directory = 1;
  optional string output_name_prefix = 2;
  optional string output_format = 3;
  optional string label_map_file = 4;
  optional string name_size_file = 5;
  optional uint32 num_test_image = 6;
  optional ResizeParameter resize_param = 7;
}

message PriorBoxParameter {
  enum CodeType { CORNER = 1; CENTER_SIZE = 2; CORNER_SIZE = 3; }
  repeated float min_size = 1;
  repeated float max_size = 2;
  repeated float aspect_ratio = 3;
  optional bool flip = 4 [default = true];
  optional bool clip = 5 [default = false];
  repeated float variance = 6;
  optional uint32 img_size = 7;
  optional uint32 img_h = 8;
  optional uint32 img_w = 9;
  optional float step = 10;
  optional float step_h = 11;
  optional float step_w = 12;
  optional float offset = 13 [default = 0.5];
}

message DetectionOutputParameter {
  optional uint32 num_classes = 1;
  optional bool share_location = 2 [default = true];
  optional int32 background_label_id = 3 [default = 0];
  optional NonMaximumSuppressionParameter nms_param = 4;
  optional SaveOutputParameter save_output_param = 5;
  optional PriorBoxParameter.CodeType code_type = 6 [default = CORNER];
  optional bool variance_encoded_in_target = 8 [default = false];
  optional int32 keep_top_k = 7 [default = -1];
  optional float confidence_threshold = 9;
  optional bool visualize = 10 [default = false];
  optional float visualize_threshold = 11;
  optional string save_file = 12;
}

message DetectionEvaluateParameter {
  optional uint32 num_classes = 1;
  optional uint32 background_label_id = 2 [default = 0];
  optional float overlap_threshold = 3 [default = 0.5];
  optional bool evaluate_difficult_gt = 4 [default = true];
  optional string name_size_file = 5;
  optional ResizeParameter resize_param = 6;
}

message MultiBoxLossParameter {
  enum LocLossType { L2 = 0; SMOOTH_L1 = 1; }
  enum ConfLossType { SOFTMAX = 0; LOGISTIC = 1; }
  enum MatchType { BIPARTITE = 0; PER_PREDICTION = 1; }
  enum MiningType { NONE = 0; MAX_NEGATIVE = 1; HARD_EXAMPLE = 2; }
  optional LocLossType loc_loss_type = 1 [default = SMOOTH_L1];
  optional ConfLossType conf_loss_type = 2 [default = SOFTMAX];
  optional float loc_weight = 3 [default = 1.0];
  optional uint32 num_classes = 4;
  optional bool share_location = 5 [default = true];
  optional MatchType match_type = 6 [default = PER_PREDICTION];
  optional float overlap_threshold = 7 [default = 0.5];
  optional bool use_prior_for_matching = 8 [default = true];
  optional uint32 background_label_id = 9 [default = 0];
  optional bool use_difficult_gt = 10 [default = true];
  optional bool do_neg_mining = 11;
  optional float neg_pos_ratio = 12 [default = 3.0];
  optional float neg_overlap = 13 [default = 0.5];
  optional PriorBoxParameter.CodeType code_type = 14 [default = CORNER];
  optional bool encode_variance_in_target = 16 [default = false];
  optional bool map_object_to_agnostic = 17 [default = false];
  optional bool ignore_cross_boundary_bbox = 18 [default = false];
  optional bool bp_inside = 19 [default = false];
  optional MiningType mining_type = 20 [default = MAX_NEGATIVE];
  optional NonMaximumSuppressionParameter nms_param = 21;
  optional int32 sample_size = 22 [default = 64];
  optional bool use_prior_for_nms = 23 [default = false];
}

message NormalizeParameter {
  optional bool across_spatial = 1 [default = true];
  optional FillerParameter scale_filler = 2;
  optional bool channel_shared = 3 [default = true];
  optional float eps = 4 [default = 1e-10];
}

message PermuteParameter { repeated uint32 order = 1; }

message VideoDataParameter {
  enum VideoType { WEBCAM = 0; VIDEO = 1; }
  optional VideoType video_type = 1 [default = WEBCAM];
  optional int32 device_id = 2 [default = 0];
  optional string video_file = 3;
  optional uint32 skip_frames = 4 [default = 0];
}

message UpsampleParameter {
  optional uint32 scale = 1 [default = 2];
  optional uint32 scale_h = 2;
  optional uint32 scale_w = 3;
  optional bool pad_out_h = 4 [default = false];
  optional bool pad_out_w = 5 [default = false];
  optional uint32 upsample_h = 6;
  optional uint32 upsample_w = 7;
}

message InterpParameter {
  optional int32 height = 1 [default = 0];
  optional int32 width = 2 [default = 0];
  optional int32 zoom_factor = 3 [default = 1];
  optional int32 shrink_factor = 4 [default = 1];
  optional int32 pad_beg = 5 [default = 0];
  optional int32 pad_end = 6 [default = 0];
}
"""
