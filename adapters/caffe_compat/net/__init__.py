"""A Caffe net on torch: layers wired by blob name, weights copied in and out, per-layer timing."""
