"""InnerProduct, Embed, Dropout, BatchNorm, Scale, Bias, Eltwise and Softmax."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .. import schema
from .base import Layer, axis_index

PROD, SUM, MAX = 0, 1, 2


class InnerProduct(Layer):
    type = "InnerProduct"
    params = ("inner_product_param",)

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p = self.lp.inner_product_param
        if p.num_output <= 0:
            raise self.error("num_output must be given and positive")
        self.axis = axis_index(p.axis, len(shapes[0]), self)
        k = math.prod(shapes[0][self.axis:])
        self.transpose = p.transpose
        shape = (k, p.num_output) if p.transpose else (p.num_output, k)
        self.blobs = [self.make_blob(shape, p.weight_filler, what="weights")]
        if p.bias_term:
            self.blobs.append(self.make_blob((p.num_output,), p.bias_filler, what="bias"))

    def infer_top_shapes(self, shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]] | None:
        return [(*shapes[0][: self.axis], self.lp.inner_product_param.num_output)]

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        x = bottoms[0]
        lead = x.shape[: self.axis]
        x2 = x.reshape(math.prod(lead), -1)
        w = self.blobs[0].t() if self.transpose else self.blobs[0]
        y = F.linear(x2, w, self.blobs[1] if len(self.blobs) > 1 else None)
        return [y.reshape(*lead, y.shape[1])]


class Dropout(Layer):
    type = "Dropout"
    same_shape = True
    params = ("dropout_param",)

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        x, ratio = bottoms[0], self.lp.dropout_param.dropout_ratio
        if self.phase == schema.TEST or ratio == 0:
            return [x]
        # Caffe scales the kept units by 1/(1-ratio) at train time (inverted dropout).
        keep = (torch.rand(x.shape, generator=self.gen) >= ratio).to(x.dtype)
        return [x * keep * (1.0 / (1.0 - ratio))]


class BatchNorm(Layer):
    """Caffe's BatchNorm: blobs are mean*f, variance*f and the factor f (all lr_mult 0)."""

    type = "BatchNorm"
    same_shape = True
    params = ("batch_norm_param",)

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p = self.lp.batch_norm_param
        for i, spec in enumerate(self.lp.param):
            if spec.lr_mult != 0:
                raise self.error(f"param {i} has lr_mult {spec.lr_mult}; BatchNorm statistics are not learnable (lr_mult must be 0)")
        c = shapes[0][1] if len(shapes[0]) > 1 else 1
        self.global_stats = p.use_global_stats if p.HasField("use_global_stats") else self.phase == schema.TEST
        self.maf, self.eps = p.moving_average_fraction, p.eps
        self.blobs = [torch.zeros(c), torch.zeros(c), torch.zeros(1)]

    def param_mults(self, i: int) -> tuple[float, float]:
        return 0.0, (super().param_mults(i)[1])

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        x = bottoms[0]
        if self.global_stats:
            f = float(self.blobs[2][0])
            scale = 0.0 if f == 0 else 1.0 / f
            return [F.batch_norm(x, self.blobs[0] * scale, self.blobs[1] * scale, training=False, eps=self.eps)]
        y = F.batch_norm(x, None, None, training=True, eps=self.eps)
        if self.update_stats:
            with torch.no_grad():
                dims = [d for d in range(x.dim()) if d != 1]
                mean = x.mean(dim=dims)
                var = ((x - mean.view(1, -1, *([1] * (x.dim() - 2)))) ** 2).mean(dim=dims)
                m = x.numel() / x.shape[1]
                self.blobs[2].mul_(self.maf).add_(1)
                self.blobs[0].mul_(self.maf).add_(mean)
                self.blobs[1].mul_(self.maf).add_(var, alpha=m / (m - 1) if m > 1 else 1.0)
        return [y]


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


class Embed(Layer):
    """Rows of a learned (input_dim, num_output) table picked by integer indices; top = bottom shape + (num_output,)."""

    type = "Embed"
    params = ("embed_param",)

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p = self.lp.embed_param
        if p.num_output <= 0 or p.input_dim <= 0:
            raise self.error("embed_param needs positive num_output and input_dim")
        self.input_dim = p.input_dim
        self.blobs = [self.make_blob((p.input_dim, p.num_output), p.weight_filler, what="weights")]
        if p.bias_term:
            self.blobs.append(self.make_blob((p.num_output,), p.bias_filler, what="bias"))

    def allow_force_backward(self, i: int) -> bool:
        return False

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        x = bottoms[0].detach()
        idx = x.long()
        if bool((idx.to(x.dtype) != x).any()) or bool(((idx < 0) | (idx >= self.input_dim)).any()):
            raise self.error(f"indices must be integers in [0, {self.input_dim}); got values in "
                             f"[{float(x.min()):g}, {float(x.max()):g}]")
        y = F.embedding(idx, self.blobs[0])
        return [y + self.blobs[1] if len(self.blobs) > 1 else y]


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


class Softmax(Layer):
    type = "Softmax"
    same_shape = True
    params = ("softmax_param",)

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        self.axis = axis_index(self.lp.softmax_param.axis, len(shapes[0]), self)

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        return [torch.softmax(bottoms[0], self.axis)]
