"""InnerProduct, activations, Dropout, BatchNorm, Scale, Eltwise, Concat, Flatten, Reshape, Softmax."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .. import schema
from .base import Layer, axis_index

PROD, SUM, MAX = 0, 1, 2


class InnerProduct(Layer):
    type = "InnerProduct"

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

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        x = bottoms[0]
        lead = x.shape[: self.axis]
        x2 = x.reshape(math.prod(lead), -1)
        w = self.blobs[0].t() if self.transpose else self.blobs[0]
        y = F.linear(x2, w, self.blobs[1] if len(self.blobs) > 1 else None)
        return [y.reshape(*lead, y.shape[1])]


class ReLU(Layer):
    type = "ReLU"

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        slope = self.lp.relu_param.negative_slope
        return [F.leaky_relu(bottoms[0], slope) if slope else F.relu(bottoms[0])]


class Sigmoid(Layer):
    type = "Sigmoid"

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        return [torch.sigmoid(bottoms[0])]


class TanH(Layer):
    type = "TanH"

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        return [torch.tanh(bottoms[0])]


class Dropout(Layer):
    type = "Dropout"

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


class Scale(Layer):
    type = "Scale"
    max_bottoms = 2

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p = self.lp.scale_param
        x = shapes[0]
        self.axis = axis_index(p.axis, len(x), self) if len(x) else 0
        if len(shapes) == 2:
            self.pshape = shapes[1]
        else:
            end = len(x) if p.num_axes == -1 else self.axis + p.num_axes
            if end > len(x):
                raise self.error(f"axis {p.axis} + num_axes {p.num_axes} exceeds the bottom's {len(x)} axes")
            self.pshape = tuple(x[self.axis:end])
            filler = p.filler if p.HasField("filler") else schema.FillerParameter(type="constant", value=1.0)
            self.blobs = [self.make_blob(self.pshape, filler, what="scale")]
        if tuple(x[self.axis:self.axis + len(self.pshape)]) != tuple(self.pshape):
            raise self.error(f"scale shape {list(self.pshape)} does not match bottom {list(x)} at axis {self.axis}")
        self.view = (1,) * self.axis + tuple(self.pshape) + (1,) * (len(x) - self.axis - len(self.pshape))
        if p.bias_term:
            self.blobs.append(self.make_blob(tuple(self.pshape), p.bias_filler, what="bias"))
        self.bias_index = len(self.blobs) - 1 if p.bias_term else -1

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        gamma = bottoms[1] if len(bottoms) == 2 else self.blobs[0]
        y = bottoms[0] * gamma.reshape(self.view)
        if self.bias_index >= 0:
            y = y + self.blobs[self.bias_index].reshape(self.view)
        return [y]


class Eltwise(Layer):
    type = "Eltwise"
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
        y = bottoms[0]
        for b in bottoms[1:]:
            y = y * b if self.op == PROD else torch.maximum(y, b)
        return [y]


class Concat(Layer):
    type = "Concat"
    max_bottoms = 1 << 16

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p = self.lp.concat_param
        self.axis = axis_index(p.axis if p.HasField("axis") or not p.HasField("concat_dim") else p.concat_dim, len(shapes[0]), self)
        for s in shapes:
            if len(s) != len(shapes[0]) or any(a != b for i, (a, b) in enumerate(zip(s, shapes[0], strict=True)) if i != self.axis):
                raise self.error(f"bottoms must match except on axis {self.axis}, got {[list(x) for x in shapes]}")

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        return [torch.cat(bottoms, self.axis)]


class Flatten(Layer):
    type = "Flatten"

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p, n = self.lp.flatten_param, len(shapes[0])
        a, e = axis_index(p.axis, n, self), axis_index(p.end_axis, n, self)
        s = shapes[0]
        self.shape = tuple(s[:a]) + (math.prod(s[a:e + 1]),) + tuple(s[e + 1:])

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        return [bottoms[0].reshape(self.shape)]


class Reshape(Layer):
    type = "Reshape"

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p, s = self.lp.reshape_param, shapes[0]
        start = p.axis if p.axis >= 0 else len(s) + 1 + p.axis
        end = len(s) if p.num_axes == -1 else start + p.num_axes
        if not 0 <= start <= end <= len(s):
            raise self.error(f"axis {p.axis} / num_axes {p.num_axes} out of range for bottom {list(s)}")
        dims = [int(d) for d in p.shape.dim]
        if dims.count(-1) > 1:
            raise self.error("at most one shape dim may be -1")
        new = [s[start + i] if d == 0 else d for i, d in enumerate(dims)]
        out = list(s[:start]) + new + list(s[end:])
        if -1 in out:
            known = math.prod(d for d in out if d != -1)
            out[out.index(-1)] = math.prod(s) // known if known else 0
        if math.prod(out) != math.prod(s):
            raise self.error(f"cannot reshape {list(s)} ({math.prod(s)} values) to {out}")
        self.shape = tuple(out)

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        return [bottoms[0].reshape(self.shape)]


class Softmax(Layer):
    type = "Softmax"

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        self.axis = axis_index(self.lp.softmax_param.axis, len(shapes[0]), self)

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        return [torch.softmax(bottoms[0], self.axis)]
