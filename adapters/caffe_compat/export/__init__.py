"""A Caffe net leaving Caffe: ONNX models, a ``torch.nn.Module`` (``ddl.caffe.load``) and PyTorch state_dicts."""
