"""The layer base class: parameters, blobs, loss weights and the forward contract."""

from __future__ import annotations

from typing import Any

import torch

from ddl.caffe.layers.fillers import fill

MANY = 1 << 16          # max_bottoms/max_tops of types that take any number


class LayerError(ValueError):
    """A layer's definition is invalid or unsupported; the message names the layer."""


class Layer:
    """One Caffe layer on torch tensors.

    Subclasses set ``type`` and implement ``setup`` (make the blobs from the bottom shapes)
    and ``forward`` (bottom tensors -> top tensors). Autograd gives the backward pass.
    """

    type = ""
    params: tuple[str, ...] = ()   # the LayerParameter fields ``*_param`` this type reads
    is_loss = False          # top 0 gets loss weight 1 unless the prototxt says otherwise
    is_data = False          # no bottoms; knows its top shapes without running
    same_shape = False       # every top has the first bottom's shape
    min_bottoms, max_bottoms = 1, 1
    min_tops, max_tops = 1, 1

    def __init__(self, lp: Any, phase: int, gen: torch.Generator) -> None:
        self.lp, self.phase, self.gen = lp, phase, gen
        self.name: str = lp.name
        self.bottom: list[str] = list(lp.bottom)
        self.top: list[str] = list(lp.top)
        self.blobs: list[torch.Tensor] = []
        self.update_stats = True     # False while the net probes shapes (BatchNorm must not learn then)
        nb, nt = len(self.bottom), len(self.top)
        if not self.min_bottoms <= nb <= self.max_bottoms:
            raise self.error(f"takes {self._range(self.min_bottoms, self.max_bottoms)} bottom blobs, got {nb}")
        if not self.min_tops <= nt <= self.max_tops:
            raise self.error(f"takes {self._range(self.min_tops, self.max_tops)} top blobs, got {nt}")

    @staticmethod
    def _range(lo: int, hi: int) -> str:
        return str(lo) if lo == hi else f"{lo} to {hi}"

    def error(self, msg: str) -> LayerError:
        return LayerError(f"layer '{self.name}' (type {self.type}): {msg}")

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        """Create ``self.blobs`` for bottoms of these shapes (default: no blobs)."""

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        raise NotImplementedError

    def top_shapes(self) -> list[tuple[int, ...]]:
        """Data layers only: the shapes of their tops."""
        raise NotImplementedError

    def infer_top_shapes(self, shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]] | None:
        """Top shapes for bottoms of ``shapes`` after ``setup``, without running forward (None: the net
        probes with zeros). Element-wise layers (``same_shape``) give the first bottom's shape."""
        return [shapes[0]] * len(self.top) if self.same_shape else None

    def loss_weight(self, i: int) -> float:
        if i < len(self.lp.loss_weight):
            return float(self.lp.loss_weight[i])
        return 1.0 if (self.is_loss and i == 0) else 0.0

    def param_mults(self, i: int) -> tuple[float, float]:
        """(lr_mult, decay_mult) of blob ``i`` from ``param { }``, Caffe's defaults 1 and 1."""
        if i < len(self.lp.param):
            p = self.lp.param[i]
            return float(p.lr_mult), float(p.decay_mult)
        return 1.0, 1.0

    def allow_force_backward(self, i: int) -> bool:
        """Whether ``force_backward`` may send a gradient to bottom ``i`` (not to labels)."""
        return not (self.is_loss and i == 1)

    def make_blob(self, shape: tuple[int, ...], filler: Any, *, what: str) -> torch.Tensor:
        """A learnable blob (an ``nn.Parameter``, so ``ddl.caffe.load`` can register it)."""
        t = fill(shape, filler, self.gen, where=f"layer '{self.name}' {what}")
        return torch.nn.Parameter(t, requires_grad=True)


def axis_index(axis: int, ndim: int, layer: Layer) -> int:
    """Caffe's CanonicalAxisIndex: negative counts from the end; out of range is an error."""
    if not -ndim <= axis < ndim:
        raise layer.error(f"axis {axis} is out of range for a {ndim}-D bottom")
    return axis % ndim
