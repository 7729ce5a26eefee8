"""ddl.caffe adapter: filled in by a later issue."""
