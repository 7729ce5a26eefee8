"""Convolution (1-, 2- and 3-D), Deconvolution and Im2col with Caffe's shape rules."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ddl.caffe.layers.base import Layer

# channels_last speeds up torch's CPU convolution (forward and backward) only for few input channels over many
# pixels (CIFAR's first layer: 0.83x); for the rest of the zoo's layers it costs 1.1-1.8x (measured, one thread).
CHANNELS_LAST_MAX_C = 4


CHANNELS_LAST_MIN_PIXELS = 64 * 1024


def spatial(rep: Any, h: int, w: int, has_hw: bool, default: int, n: int, layer: Layer, what: str) -> tuple[int, ...]:
    """Caffe's rule: the repeated field (1 value, or one per spatial axis), or _h/_w (2-D only)."""
    vals = [int(v) for v in rep]
    if has_hw:
        if vals:
            raise layer.error(f"give either {what} or {what}_h/{what}_w, not both")
        if n != 2:
            raise layer.error(f"{what}_h/{what}_w are for 2-D convolution; this bottom has {n} spatial axes")
        return h, w
    if not vals:
        return (default,) * n
    if len(vals) == 1:
        return (vals[0],) * n
    if len(vals) == n:
        return tuple(vals)
    raise layer.error(f"{what} has {len(vals)} values for {n} spatial axes (give 1 or {n})")


class _ConvBase(Layer):
    """The geometry Convolution, Deconvolution and Im2col share."""

    params = ("convolution_param",)

    def geometry(self, shape: tuple[int, ...]) -> None:
        p = self.lp.convolution_param
        if p.axis != 1:
            raise self.error(f"axis {p.axis} is not supported (only the channel axis 1)")
        n = len(shape) - 2
        if n not in (1, 2, 3):
            raise self.error(f"needs a bottom (N, C, spatial...) with 1 to 3 spatial axes, got shape {list(shape)}")
        self.nd = n
        self.kernel = spatial(p.kernel_size, p.kernel_h, p.kernel_w, p.HasField("kernel_h") or p.HasField("kernel_w"), 0, n, self, "kernel_size")
        if min(self.kernel) <= 0:
            raise self.error("kernel_size (or kernel_h and kernel_w) must be given and positive")
        self.pad = spatial(p.pad, p.pad_h, p.pad_w, p.HasField("pad_h") or p.HasField("pad_w"), 0, n, self, "pad")
        self.stride = spatial(p.stride, p.stride_h, p.stride_w, p.HasField("stride_h") or p.HasField("stride_w"), 1, n, self, "stride")
        self.dilation = spatial(p.dilation, 1, 1, False, 1, n, self, "dilation")
        if min(self.stride) <= 0 or min(self.dilation) <= 0:
            raise self.error("stride and dilation must be positive")

    def groups(self, shape: tuple[int, ...]) -> int:
        """Convolution's and Deconvolution's shared checks of num_output and group; the input channels."""
        p = self.lp.convolution_param
        channels, self.group = shape[1], p.group
        if p.num_output <= 0:
            raise self.error("num_output must be given and positive")
        if self.group <= 0 or channels % self.group or p.num_output % self.group:
            raise self.error(f"group {self.group} must divide both the input channels ({channels}) and num_output ({p.num_output})")
        return channels


class Convolution(_ConvBase):
    type = "Convolution"

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p = self.lp.convolution_param
        self.geometry(shapes[0])
        channels = self.groups(shapes[0])
        for s, k, pd, d in zip(shapes[0][2:], self.kernel, self.pad, self.dilation, strict=True):
            if s + 2 * pd < d * (k - 1) + 1:
                raise self.error(f"kernel {list(self.kernel)} (dilation {list(self.dilation)}) exceeds the padded input {list(shapes[0][2:])}")
        self.blobs = [self.make_blob((p.num_output, channels // self.group, *self.kernel), p.weight_filler, what="weights")]
        if p.bias_term:
            self.blobs.append(self.make_blob((p.num_output,), p.bias_filler, what="bias"))
        self.conv = (F.conv1d, F.conv2d, F.conv3d)[self.nd - 1]

    def infer_top_shapes(self, shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]] | None:
        out = [(s + 2 * p - (d * (k - 1) + 1)) // st + 1 for s, p, d, k, st in
               zip(shapes[0][2:], self.pad, self.dilation, self.kernel, self.stride, strict=True)]
        return [(shapes[0][0], self.blobs[0].shape[0], *out)]

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        b = self.blobs[1] if len(self.blobs) > 1 else None
        x = bottoms[0]
        if (self.nd == 2 and x.shape[1] <= CHANNELS_LAST_MAX_C and x.shape[0] * x.shape[2] * x.shape[3] >= CHANNELS_LAST_MIN_PIXELS
                and x.device.type == "cpu"):
            x = x.contiguous(memory_format=torch.channels_last)     # values unchanged, only the memory order
        return [self.conv(x, self.blobs[0], b, self.stride, self.pad, self.dilation, self.group)]


class Deconvolution(_ConvBase):
    """The transposed convolution; weights (C_in, num_output / group, k...) as in Caffe (and torch)."""

    type = "Deconvolution"

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p = self.lp.convolution_param
        self.geometry(shapes[0])
        channels = self.groups(shapes[0])
        for s, k, pd, st, d in zip(shapes[0][2:], self.kernel, self.pad, self.stride, self.dilation, strict=True):
            if st * (s - 1) + d * (k - 1) + 1 - 2 * pd <= 0:
                raise self.error(f"pad {list(self.pad)} leaves no output for input {list(shapes[0][2:])}")
        self.blobs = [self.make_blob((channels, p.num_output // self.group, *self.kernel), p.weight_filler, what="weights")]
        if p.bias_term:
            self.blobs.append(self.make_blob((p.num_output,), p.bias_filler, what="bias"))
        self.deconv = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[self.nd - 1]

    def infer_top_shapes(self, shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]] | None:
        out = [st * (s - 1) + d * (k - 1) + 1 - 2 * p for s, p, d, k, st in
               zip(shapes[0][2:], self.pad, self.dilation, self.kernel, self.stride, strict=True)]
        return [(shapes[0][0], self.lp.convolution_param.num_output, *out)]

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        b = self.blobs[1] if len(self.blobs) > 1 else None
        return [self.deconv(bottoms[0], self.blobs[0], b, self.stride, self.pad, 0, self.group, self.dilation)]


class Im2col(_ConvBase):
    """The columns a convolution multiplies: (N, C*kh*kw, out_h, out_w), channel-major as in Caffe."""

    type = "Im2col"

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        self.geometry(shapes[0])
        if self.nd != 2:
            raise self.error("ddl-caffe's Im2col supports 2-D bottoms (N, C, H, W)")
        self.out_hw = tuple((s + 2 * p - (d * (k - 1) + 1)) // st + 1 for s, p, d, k, st in
                            zip(shapes[0][2:], self.pad, self.dilation, self.kernel, self.stride, strict=True))

    def infer_top_shapes(self, shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]] | None:
        s = shapes[0]
        return [(s[0], s[1] * self.kernel[0] * self.kernel[1], *self.out_hw)]

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        x = bottoms[0]
        cols = F.unfold(x, self.kernel, self.dilation, self.pad, self.stride)
        return [cols.reshape(x.shape[0], cols.shape[1], *self.out_hw)]
