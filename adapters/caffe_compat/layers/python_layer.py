"""Python layers: ``python_param { module layer param_str }`` loaded from PYTHONPATH and run through pycaffe's protocol."""

from __future__ import annotations

import importlib
import sys
from typing import Any

import numpy as np
import torch

from ddl.caffe.formats import schema
from ddl.caffe.layers import pycaffe
from ddl.caffe.layers.base import MANY, Layer


def _user_class(layer: Layer, module: str, name: str) -> Any:
    # Python layers do ``import caffe``; ddl-caffe serves its pycaffe subset under that name.
    sys.modules.setdefault("caffe", pycaffe)                  # type: ignore[arg-type]
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        raise layer.error(f"python_param.module '{module}' cannot be imported ({e}); put its folder on PYTHONPATH") from None
    except Exception as e:                                      # noqa: BLE001 - the user's module failed to import
        raise layer.error(f"python_param.module '{module}' failed to import: {type(e).__name__}: {e}") from None
    cls = getattr(mod, name, None)
    if cls is None:
        raise layer.error(f"module '{module}' ({getattr(mod, '__file__', '?')}) has no class '{name}'")
    return cls


class _Run(torch.autograd.Function):
    """Forward and backward of a pycaffe layer object on torch tensors."""

    @staticmethod
    def forward(ctx: Any, owner: PythonLayer, *bottoms: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.owner = owner
        return tuple(owner.run_forward(list(bottoms)))

    @staticmethod
    def backward(ctx: Any, *diffs: torch.Tensor) -> tuple[Any, ...]:
        owner: PythonLayer = ctx.owner
        grads = owner.run_backward(list(diffs), list(ctx.needs_input_grad[1:]))
        return (None, *grads)


class PythonLayer(Layer):
    """A user layer object (a ``caffe.Layer`` subclass) with its bottoms and tops as pycaffe blobs."""

    type = "Python"
    params = ("python_param",)
    min_bottoms, max_bottoms = 0, MANY
    min_tops, max_tops = 0, MANY

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p = self.lp.python_param
        if not p.module or not p.layer:
            raise self.error("python_param needs module and layer")
        cls = _user_class(self, p.module, p.layer)
        try:
            obj = cls(self.lp)
        except TypeError:
            obj = cls()
        if not hasattr(obj, "blobs"):
            obj.blobs = pycaffe.BlobVec()
        obj.param_str = p.param_str
        obj.phase = pycaffe.TRAIN if self.phase == schema.TRAIN else pycaffe.TEST
        self.obj = obj
        self.bottom_blobs = [pycaffe.Blob(s) for s in shapes]
        self.top_blobs = [pycaffe.Blob() for _ in self.top]
        self._call("setup", self.bottom_blobs, self.top_blobs)
        self._call("reshape", self.bottom_blobs, self.top_blobs)
        self.shapes = [b.shape for b in self.top_blobs]

    def _call(self, what: str, *args: Any) -> None:
        try:
            getattr(self.obj, what)(*args)
        except Exception as e:                                  # noqa: BLE001 - the user's code failed
            raise self.error(f"{type(self.obj).__name__}.{what} raised {type(e).__name__}: {e}") from e

    def infer_top_shapes(self, shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]] | None:
        return list(self.shapes)

    def run_forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        for blob, t in zip(self.bottom_blobs, bottoms, strict=True):
            blob.reshape(*t.shape)
            blob.data[...] = t.detach().cpu().numpy()
        self._call("reshape", self.bottom_blobs, self.top_blobs)
        self._call("forward", self.bottom_blobs, self.top_blobs)
        dev = bottoms[0].device if bottoms else torch.device("cpu")
        return [torch.from_numpy(np.array(b.data, np.float32)).to(dev) for b in self.top_blobs]

    def run_backward(self, diffs: list[torch.Tensor], need: list[bool]) -> list[torch.Tensor | None]:
        for blob, d in zip(self.top_blobs, diffs, strict=True):
            blob.diff[...] = 0 if d is None else d.detach().cpu().numpy().reshape(blob.shape)
        for blob in self.bottom_blobs:
            blob.diff[...] = 0
        self._call("backward", self.top_blobs, list(need), self.bottom_blobs)
        return [torch.from_numpy(np.array(b.diff, np.float32)) if n else None
                for b, n in zip(self.bottom_blobs, need, strict=True)]

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        if not self.top:
            self.run_forward(bottoms)
            return []
        if any(b.requires_grad for b in bottoms):
            return list(_Run.apply(self, *bottoms))  # type: ignore[no-untyped-call]
        return self.run_forward(bottoms)
