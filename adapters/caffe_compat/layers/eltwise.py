"""Eltwise, Scale and Bias: element-wise arithmetic between blobs, or with an operand broadcast from an axis."""

from __future__ import annotations

import torch

from ddl.caffe.formats import schema
from ddl.caffe.layers.base import Layer, axis_index

PROD, SUM, MAX = 0, 1, 2


def _operand_shape(layer: Layer, shapes: list[tuple[int, ...]], axis: int, num_axes: int) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """(axis, operand shape, broadcast view) for Scale and Bias: the second bottom's shape, or
    ``num_axes`` axes of the first from ``axis`` (-1: all of them); an empty second bottom is a scalar."""
    x = shapes[0]
    if len(shapes) == 2 and len(shapes[1]) == 0:
        return 0, (), (1,) * len(x)
    a = axis_index(axis, len(x), layer) if len(x) else 0
    if len(shapes) == 2:
        pshape = tuple(shapes[1])
    else:
        if num_axes < -1:
            raise layer.error(f"num_axes must be -1 or non-negative, got {num_axes}")
        end = len(x) if num_axes == -1 else a + num_axes
        if end > len(x):
            raise layer.error(f"axis {axis} + num_axes {num_axes} exceeds the bottom's {len(x)} axes")
        pshape = tuple(x[a:end])
    if tuple(x[a:a + len(pshape)]) != pshape:
        raise layer.error(f"operand shape {list(pshape)} does not match bottom {list(x)} at axis {a}")
    return a, pshape, (1,) * a + pshape + (1,) * (len(x) - a - len(pshape))


class Scale(Layer):
    """x * gamma (a learned blob, or the second bottom) broadcast from ``axis``; optional learned bias."""

    type = "Scale"
    same_shape = True
    params = ("scale_param",)
    max_bottoms = 2

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p = self.lp.scale_param
        self.axis, self.pshape, self.view = _operand_shape(self, shapes, p.axis, p.num_axes)
        if len(shapes) == 1:
            filler = p.filler if p.HasField("filler") else schema.FillerParameter(type="constant", value=1.0)
            self.blobs = [self.make_blob(self.pshape, filler, what="scale")]
        if p.bias_term:
            self.blobs.append(self.make_blob(self.pshape, p.bias_filler, what="bias"))
        self.bias_index = len(self.blobs) - 1 if p.bias_term else -1

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        gamma = bottoms[1] if len(bottoms) == 2 else self.blobs[0]
        y = bottoms[0] * gamma.reshape(self.view)
        if self.bias_index >= 0:
            y = y + self.blobs[self.bias_index].reshape(self.view)
        return [y]


class Bias(Layer):
    """x + b (a learned blob, filler default 0, or the second bottom) broadcast from ``axis``."""

    type = "Bias"
    same_shape = True
    params = ("bias_param",)
    max_bottoms = 2

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p = self.lp.bias_param
        self.axis, self.pshape, self.view = _operand_shape(self, shapes, p.axis, p.num_axes)
        if len(shapes) == 1:
            self.blobs = [self.make_blob(self.pshape, p.filler, what="bias")]

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        b = bottoms[1] if len(bottoms) == 2 else self.blobs[0]
        return [bottoms[0] + b.reshape(self.view)]


class Eltwise(Layer):
    type = "Eltwise"
    same_shape = True
    params = ("eltwise_param",)
    min_bottoms, max_bottoms = 2, 1 << 16

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p = self.lp.eltwise_param
        if any(s != shapes[0] for s in shapes):
            raise self.error(f"bottoms must have equal shapes, got {[list(s) for s in shapes]}")
        if len(p.coeff) and (p.operation != SUM or len(p.coeff) != len(shapes)):
            raise self.error(f"coeff needs operation SUM and one value per bottom ({len(shapes)}), got {len(p.coeff)}")
        self.op, self.coeff = p.operation, list(p.coeff)

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        if self.op == SUM:
            if self.coeff:
                y = bottoms[0] * self.coeff[0]
                for c, b in zip(self.coeff[1:], bottoms[1:], strict=True):
                    y = y + b * c
                return [y]
            y = bottoms[0]
            for b in bottoms[1:]:
                y = y + b
            return [y]
        if self.op == PROD:
            y = bottoms[0]
            for b in bottoms[1:]:
                y = y * b
            return [y]
        # MAX: the gradient goes to the first bottom holding the maximum (Caffe keeps the
        # earlier bottom on ties; torch.maximum would split it).
        stacked = torch.stack(bottoms)
        idx = stacked.detach().argmax(0, keepdim=True)
        return [stacked.gather(0, idx)[0]]
