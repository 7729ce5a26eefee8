"""ddl.caffe: a Caffe-compatible trainer (prototxt, LMDB, .caffemodel, .solverstate) on PyTorch kernels, distributed by ddl."""
