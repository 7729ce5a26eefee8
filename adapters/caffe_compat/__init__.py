"""ddl.caffe: a Caffe-compatible trainer (prototxt, LMDB, .caffemodel, .solverstate) on PyTorch kernels, distributed by ddl."""

from __future__ import annotations

from typing import Any

__all__ = ["load", "state_dict"]


def load(*args: Any, **kwargs: Any) -> Any:
    """A Caffe net and its weights as a ``torch.nn.Module`` (see ``ddl.caffe.export.torch_module.load``)."""
    from ddl.caffe.export.torch_module import load as _load
    return _load(*args, **kwargs)


def state_dict(*args: Any, **kwargs: Any) -> Any:
    """A .caffemodel's weights as a PyTorch state_dict (see ``ddl.caffe.export.state_dict.caffemodel_to_state_dict``)."""
    from ddl.caffe.export.state_dict import caffemodel_to_state_dict
    return caffemodel_to_state_dict(*args, **kwargs)
