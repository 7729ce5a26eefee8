"""Element-wise neuron layers: ReLU, PReLU, ELU, Sigmoid, TanH, AbsVal, BNLL, Exp, Log, Power, Swish, Threshold, Clip, ReLU6."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ddl.caffe.formats import schema
from ddl.caffe.layers.base import Layer


class ReLU(Layer):
    """max(x, 0) + negative_slope * min(x, 0); the gradient at 0 is the negative side's, as in Caffe."""

    type = "ReLU"
    same_shape = True
    params = ("relu_param",)

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        slope = self.lp.relu_param.negative_slope
        return [F.leaky_relu(bottoms[0], slope) if slope else F.relu(bottoms[0])]


class ReLU6(Layer):
    """min(max(x, 0), 6) (MobileNet v2 forks; no parameters)."""

    type = "ReLU6"
    same_shape = True

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        return [F.relu6(bottoms[0])]


class PReLU(Layer):
    """max(x, 0) + a_c * min(x, 0) with a learned slope per channel (axis 1) or one shared slope."""

    type = "PReLU"
    same_shape = True
    params = ("prelu_param",)

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p = self.lp.prelu_param
        if len(shapes[0]) < 1:
            raise self.error("needs a bottom with at least one axis")
        self.channels = shapes[0][1] if len(shapes[0]) >= 2 else 1
        filler = p.filler if p.HasField("filler") else schema.FillerParameter(type="constant", value=0.25)
        self.shared = p.channel_shared
        self.blobs = [self.make_blob((1,) if self.shared else (self.channels,), filler, what="slopes")]

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        x, a = bottoms[0], self.blobs[0]
        if self.shared or x.dim() < 2:
            return [torch.where(x > 0, x, x * a.reshape(()) if self.shared else x * a)]
        view = (1, -1) + (1,) * (x.dim() - 2)
        return [torch.where(x > 0, x, x * a.reshape(view))]


class ELU(Layer):
    type = "ELU"
    same_shape = True
    params = ("elu_param",)

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        return [F.elu(bottoms[0], alpha=self.lp.elu_param.alpha)]


class Sigmoid(Layer):
    type = "Sigmoid"
    same_shape = True
    params = ("sigmoid_param",)

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        return [torch.sigmoid(bottoms[0])]


class TanH(Layer):
    type = "TanH"
    same_shape = True
    params = ("tanh_param",)

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        return [torch.tanh(bottoms[0])]


class AbsVal(Layer):
    type = "AbsVal"
    same_shape = True

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        return [bottoms[0].abs()]


class BNLL(Layer):
    """log(1 + exp(x)), computed stably (Caffe: x + log(1 + exp(-x)) for x > 0)."""

    type = "BNLL"
    same_shape = True

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        return [F.softplus(bottoms[0], beta=1.0, threshold=50.0)]


class Exp(Layer):
    """base^(shift + scale * x); base -1 means e."""

    type = "Exp"
    same_shape = True
    params = ("exp_param",)

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p = self.lp.exp_param
        if p.base != -1 and p.base <= 0:
            raise self.error(f"base must be strictly positive (or -1 for e), got {p.base}")
        log_base = 1.0 if p.base == -1 else math.log(p.base)
        self.inner = log_base * p.scale
        self.outer = 1.0 if p.shift == 0 else (math.e if p.base == -1 else p.base) ** p.shift

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        y = torch.exp(bottoms[0] * self.inner) if self.inner != 1 else torch.exp(bottoms[0])
        return [y * self.outer if self.outer != 1 else y]


class Log(Layer):
    """log_base(shift + scale * x); base -1 means e."""

    type = "Log"
    same_shape = True
    params = ("log_param",)

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p = self.lp.log_param
        if p.base != -1 and p.base <= 0:
            raise self.error(f"base must be strictly positive (or -1 for e), got {p.base}")
        self.base_scale = 1.0 if p.base == -1 else 1.0 / math.log(p.base)
        self.scale, self.shift = p.scale, p.shift

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        x = bottoms[0]
        inner = x * self.scale + self.shift if (self.scale != 1 or self.shift) else x
        y = torch.log(inner)
        return [y * self.base_scale if self.base_scale != 1 else y]


class Power(Layer):
    """(shift + scale * x)^power."""

    type = "Power"
    same_shape = True
    params = ("power_param",)

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        p = self.lp.power_param
        x = bottoms[0]
        if p.scale == 0 or p.power == 0:
            # Caffe's constant case: the value is shift^power (1 when power is 0); no gradient.
            return [torch.full_like(x, 1.0 if p.power == 0 else p.shift ** p.power)]
        inner = x * p.scale + p.shift if (p.scale != 1 or p.shift) else x
        return [inner if p.power == 1 else inner.pow(p.power)]


class Swish(Layer):
    """x * sigmoid(beta * x)."""

    type = "Swish"
    same_shape = True
    params = ("swish_param",)

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        x, beta = bottoms[0], self.lp.swish_param.beta
        return [x * torch.sigmoid(x * beta if beta != 1 else x)]


class Threshold(Layer):
    """1 where x > threshold, else 0 (Caffe gives it no backward)."""

    type = "Threshold"
    same_shape = True
    params = ("threshold_param",)

    def allow_force_backward(self, i: int) -> bool:
        return False

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        x = bottoms[0].detach()
        return [(x > self.lp.threshold_param.threshold).to(x.dtype)]


class Clip(Layer):
    """min(max(x, min), max); the gradient passes where min <= x <= max."""

    type = "Clip"
    same_shape = True
    params = ("clip_param",)

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p = self.lp.clip_param
        if not (p.HasField("min") and p.HasField("max")):
            raise self.error("clip_param needs both min and max")
        if p.min > p.max:
            raise self.error(f"clip_param min {p.min} exceeds max {p.max}")

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        p = self.lp.clip_param
        return [bottoms[0].clamp(p.min, p.max)]
