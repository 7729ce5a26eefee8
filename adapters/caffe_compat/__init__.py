"""ddl.caffe: a Caffe-compatible trainer (prototxt, LMDB, .caffemodel, .solverstate) on PyTorch kernels, distributed by ddl."""

from __future__ import annotations

from typing import Any

__all__ = ["load", "state_dict"]


def load(*args: Any, **kwargs: Any) -> Any:
    """A Caffe net and its weights as a ``torch.nn.Module`` (see ``ddl.caffe.module.load``)."""
    from .module import load as _load
    return _load(*args, **kwargs)


def state_dict(*args: Any, **kwargs: Any) -> Any:
    """A .caffemodel's weights as a PyTorch state_dict (see ``ddl.caffe.convert_weights.caffemodel_to_state_dict``)."""
    from .convert_weights import caffemodel_to_state_dict
    return caffemodel_to_state_dict(*args, **kwargs)
