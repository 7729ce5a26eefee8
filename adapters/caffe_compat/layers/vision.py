"""Convolution, Pooling and LRN with Caffe's shape rules and formulas."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from .base import Layer

MAX, AVE, STOCHASTIC = 0, 1, 2
CEIL, FLOOR = 0, 1
ACROSS_CHANNELS, WITHIN_CHANNEL = 0, 1
CHANNELS_LAST_MIN_HW = 256       # below 16x16 the layout change costs more than it saves


def _pair(rep: Any, h: int, w: int, has_hw: bool, default: int, layer: Layer, what: str) -> tuple[int, int]:
    """Caffe's rule: either the repeated field (1 value, or one per spatial axis) or _h/_w."""
    vals = list(rep)
    if has_hw:
        if vals:
            raise layer.error(f"give either {what} or {what}_h/{what}_w, not both")
        return h, w
    if not vals:
        return default, default
    if len(vals) == 1:
        return vals[0], vals[0]
    if len(vals) == 2:
        return vals[0], vals[1]
    raise layer.error(f"{what} has {len(vals)} values; ddl-caffe supports 2-D spatial convolution only")


class Convolution(Layer):
    type = "Convolution"

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p = self.lp.convolution_param
        if p.axis != 1:
            raise self.error(f"axis {p.axis} is not supported (only the channel axis 1)")
        if len(shapes[0]) != 4:
            raise self.error(f"needs a 4-D bottom (N, C, H, W), got shape {list(shapes[0])}")
        self.kernel = _pair(p.kernel_size, p.kernel_h, p.kernel_w, p.HasField("kernel_h") or p.HasField("kernel_w"), 0, self, "kernel_size")
        if min(self.kernel) <= 0:
            raise self.error("kernel_size (or kernel_h and kernel_w) must be given and positive")
        self.pad = _pair(p.pad, p.pad_h, p.pad_w, p.HasField("pad_h") or p.HasField("pad_w"), 0, self, "pad")
        self.stride = _pair(p.stride, p.stride_h, p.stride_w, p.HasField("stride_h") or p.HasField("stride_w"), 1, self, "stride")
        self.dilation = _pair(p.dilation, 1, 1, False, 1, self, "dilation")
        channels, self.group = shapes[0][1], p.group
        if p.num_output <= 0:
            raise self.error("num_output must be given and positive")
        if channels % self.group or p.num_output % self.group:
            raise self.error(f"group {self.group} must divide both the input channels ({channels}) and num_output ({p.num_output})")
        self.blobs = [self.make_blob((p.num_output, channels // self.group, *self.kernel), p.weight_filler, what="weights")]
        if p.bias_term:
            self.blobs.append(self.make_blob((p.num_output,), p.bias_filler, what="bias"))

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        b = self.blobs[1] if len(self.blobs) > 1 else None
        # channels_last makes torch's CPU convolution and max pooling several times faster;
        # values and shapes are unchanged (only the memory order differs).
        x = bottoms[0]
        if x.shape[2] * x.shape[3] >= CHANNELS_LAST_MIN_HW:
            x = x.contiguous(memory_format=torch.channels_last)
        return [F.conv2d(x, self.blobs[0], b, self.stride, self.pad, self.dilation, self.group)]


def pooled_size(size: int, k: int, pad: int, stride: int, ceil: bool) -> int:
    """Caffe's pooled output size: ceil (or floor) division, then the last window must start inside."""
    n = (math.ceil if ceil else math.floor)((size + 2 * pad - k) / stride) + 1
    if pad and (n - 1) * stride >= size + pad:
        n -= 1
    return int(n)


class Pooling(Layer):
    type = "Pooling"

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p = self.lp.pooling_param
        if len(shapes[0]) != 4:
            raise self.error(f"needs a 4-D bottom (N, C, H, W), got shape {list(shapes[0])}")
        if p.pool == STOCHASTIC:
            raise self.error("pool: STOCHASTIC is not supported (use MAX or AVE)")
        if len(self.top) > 1:
            raise self.error("the second top (max-pool mask) is not supported")
        h, w = shapes[0][2], shapes[0][3]
        if p.global_pooling:
            if p.HasField("kernel_size") or p.HasField("kernel_h"):
                raise self.error("with global_pooling the kernel size cannot be given")
            self.kernel, self.pad, self.stride = (h, w), (0, 0), (1, 1)
        else:
            hw = p.HasField("kernel_h") or p.HasField("kernel_w")
            if hw == p.HasField("kernel_size"):
                raise self.error("give either kernel_size or kernel_h and kernel_w")
            self.kernel = (p.kernel_h, p.kernel_w) if hw else (p.kernel_size, p.kernel_size)
            phw = p.HasField("pad_h") or p.HasField("pad_w")
            self.pad = (p.pad_h, p.pad_w) if phw else (p.pad, p.pad)
            shw = p.HasField("stride_h") or p.HasField("stride_w")
            self.stride = (p.stride_h, p.stride_w) if shw else (p.stride, p.stride)
        self.ceil = p.round_mode == CEIL
        for k, pad in zip(self.kernel, self.pad, strict=True):
            if pad >= k:
                raise self.error(f"pad {pad} must be smaller than the kernel {k}")
            if pad > k // 2:
                raise self.error(f"pad {pad} above half the kernel {k} is not supported")
        self.out_hw = tuple(pooled_size(s, k, pd, st, self.ceil) for s, k, pd, st in
                            zip((h, w), self.kernel, self.pad, self.stride, strict=True))
        self.max = p.pool == MAX

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        x = bottoms[0]
        # torch's ceil_mode applies Caffe's last-window rule, and with count_include_pad its
        # AVE divisor is Caffe's window clipped at size + pad; the out_hw check guards both.
        if self.max:
            y = F.max_pool2d(x, self.kernel, self.stride, self.pad, ceil_mode=self.ceil)
        else:
            y = F.avg_pool2d(x, self.kernel, self.stride, self.pad, ceil_mode=self.ceil, count_include_pad=True)
        if tuple(y.shape[2:]) != self.out_hw:
            raise self.error(f"pooled shape {list(y.shape[2:])} differs from Caffe's {list(self.out_hw)}")
        return [y]


class LRN(Layer):
    type = "LRN"

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p = self.lp.lrn_param
        if p.local_size % 2 == 0:
            raise self.error(f"local_size {p.local_size} must be odd")
        if len(shapes[0]) != 4:
            raise self.error(f"needs a 4-D bottom, got shape {list(shapes[0])}")
        self.size, self.alpha, self.beta, self.k = p.local_size, p.alpha, p.beta, p.k
        self.across = p.norm_region == ACROSS_CHANNELS

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        x = bottoms[0]
        if self.across:
            # x / (k + alpha/n * sum of squares over n neighbouring channels)^beta
            return [F.local_response_norm(x, self.size, self.alpha, self.beta, self.k)]
        # WITHIN_CHANNEL: x * (1 + alpha * AVE-pool(x^2, size, pad (size-1)/2))^-beta; k unused
        pad = (self.size - 1) // 2
        avg = F.avg_pool2d(x * x, self.size, 1, pad, ceil_mode=True, count_include_pad=True)
        return [x * (1 + self.alpha * avg).pow(-self.beta)]
