"""Caffe layer implementations on PyTorch kernels."""
