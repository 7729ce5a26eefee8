"""Pooling (MAX with its mask top, AVE, STOCHASTIC; Caffe's rounding and last-window rule) and SPP."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ddl.caffe.formats import schema
from ddl.caffe.layers.base import Layer

MAX, AVE, STOCHASTIC = 0, 1, 2
CEIL, FLOOR = 0, 1
FLT_MIN = 1.1754943508222875e-38


def pooled_size(size: int, k: int, pad: int, stride: int, ceil: bool) -> int:
    """Caffe's pooled output size: ceil (or floor) division, then with padding the last window must start inside."""
    n = (math.ceil if ceil else math.floor)((size + 2 * pad - k) / stride) + 1
    if pad and (n - 1) * stride >= size + pad:
        n -= 1
    return int(n)


@dataclass(frozen=True)
class Window:
    """One 2-D pooling geometry: kernel, stride and pad per axis, Caffe's output size, rounding."""

    kernel: tuple[int, int]
    stride: tuple[int, int]
    pad: tuple[int, int]
    out: tuple[int, int]
    ceil: bool


class _MaxPool2d(torch.autograd.Function):
    """MAX pooling on the CPU, forward channels-last and backward NCHW from the same first-maximum indices (Caffe's
    tie rule): PyTorch's NCHW forward kernel is 4-8x slower than its channels-last one, and its NCHW backward
    3-10x faster (measured, one thread: GoogLeNet's pool1 8.4 ms forward NCHW against 1.9 channels-last)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, kernel: tuple[int, int], stride: tuple[int, int], pad: tuple[int, int],
                ceil: bool) -> tuple[torch.Tensor, torch.Tensor]:
        x = x.contiguous()
        y, idx = F.max_pool2d(x.contiguous(memory_format=torch.channels_last), kernel, stride, pad, ceil_mode=ceil,
                              return_indices=True)
        y, idx = y.contiguous(), idx.contiguous()
        ctx.save_for_backward(x, idx)
        ctx.geometry = (kernel, stride, pad, ceil)
        ctx.mark_non_differentiable(idx)
        return y, idx

    @staticmethod
    def backward(ctx: Any, gy: torch.Tensor, _: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, idx = ctx.saved_tensors
        kernel, stride, pad, ceil = ctx.geometry
        gx = torch.ops.aten.max_pool2d_with_indices_backward(gy.contiguous(), x, kernel, stride, pad, (1, 1), ceil, idx)
        return gx, None, None, None, None


def _max_pool(x: torch.Tensor, w: Window) -> tuple[torch.Tensor, torch.Tensor]:
    if x.device.type == "cpu" and x.dim() == 4:
        y, idx = _MaxPool2d.apply(x, w.kernel, w.stride, w.pad, w.ceil)  # type: ignore[no-untyped-call]
        return y, idx
    y, idx = F.max_pool2d(x, w.kernel, w.stride, w.pad, ceil_mode=w.ceil, return_indices=True)
    return y, idx


def pool2d(x: torch.Tensor, w: Window, method: int, *, gen: torch.Generator | None = None, train: bool = False,
           with_mask: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Pool (N, C, H, W) as Caffe does; returns (top, max-pool mask as float indices h*W+w or None).

    torch's pooling implements Caffe's windows (AVE divides by the window clipped at size + pad)
    whenever its padding limit (pad <= kernel/2) holds and its output size agrees; otherwise the
    input is padded explicitly (-inf for MAX, 0 for AVE) and the extra last window cropped.
    """
    (kh, kw), (sh, sw), (ph, pw), (oh, ow) = w.kernel, w.stride, w.pad, w.out
    if method == STOCHASTIC:
        return _stochastic(x, w, gen, train), None
    fast = 2 * ph <= kh and 2 * pw <= kw
    mask = None
    if fast:
        if method == MAX:
            y, idx = _max_pool(x, w)
            mask = idx if with_mask else None
        else:
            y = F.avg_pool2d(x, w.kernel, w.stride, w.pad, ceil_mode=w.ceil, count_include_pad=True)
        if tuple(y.shape[2:]) == (oh, ow):
            return y, (mask.to(x.dtype) if mask is not None else None)
    # Explicit padding; enough on the far side for Caffe's last window.
    h, wd = x.shape[2], x.shape[3]
    far_h = max(ph, (oh - 1) * sh + kh - h - ph)
    far_w = max(pw, (ow - 1) * sw + kw - wd - pw)
    xp = F.pad(x, (pw, far_w, ph, far_h), value=-math.inf if method == MAX else 0.0)
    if method == MAX:
        y, idx = _max_pool(xp, Window(w.kernel, w.stride, (0, 0), w.out, False))
        y = y[:, :, :oh, :ow]
        if with_mask:
            idx = idx[:, :, :oh, :ow]
            wp = xp.shape[3]
            mask = ((idx // wp - ph) * wd + (idx % wp - pw)).to(x.dtype)
        return y, mask
    # AVE: Caffe's divisor is the window clipped at size + pad, not at the far padding added here.
    y = F.avg_pool2d(xp, w.kernel, w.stride, 0, count_include_pad=True)[:, :, :oh, :ow]
    starts_h = torch.arange(oh) * sh - ph
    starts_w = torch.arange(ow) * sw - pw
    size_h = torch.clamp(torch.minimum(starts_h + kh, torch.tensor(h + ph)) - starts_h, min=0)
    size_w = torch.clamp(torch.minimum(starts_w + kw, torch.tensor(wd + pw)) - starts_w, min=0)
    fix = (kh * kw) / (size_h[:, None] * size_w[None, :]).to(x.dtype)
    return y * fix.to(x.device), None


def _stochastic(x: torch.Tensor, w: Window, gen: torch.Generator | None, train: bool) -> torch.Tensor:
    # Caffe's (GPU-only) stochastic pooling: windows clipped at the image, no padding. TRAIN
    # samples one activation with probability x / sum(x); TEST takes sum(x^2) / sum(x).
    (kh, kw), (sh, sw), (oh, ow) = w.kernel, w.stride, w.out
    n, c, h, wd = x.shape
    xp = F.pad(x, (0, max(0, (ow - 1) * sw + kw - wd), 0, max(0, (oh - 1) * sh + kh - h)))
    cols = F.unfold(xp, w.kernel, 1, 0, w.stride).reshape(n, c, kh * kw, -1)[..., : oh * ow]
    if not train:
        return ((cols * cols).sum(2) / (cols.sum(2) + FLT_MIN)).reshape(n, c, oh, ow)
    with torch.no_grad():
        csum = cols.cumsum(2)
        u = torch.rand(csum[:, :, -1:].shape, generator=gen, dtype=x.dtype).to(x.device)
        pick = (csum < u * csum[:, :, -1:]).sum(2, keepdim=True).clamp(max=kh * kw - 1)
    return cols.gather(2, pick).reshape(n, c, oh, ow)


class Pooling(Layer):
    type = "Pooling"
    params = ("pooling_param",)
    max_tops = 2

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p = self.lp.pooling_param
        if len(shapes[0]) != 4:
            raise self.error(f"needs a 4-D bottom (N, C, H, W), got shape {list(shapes[0])}")
        self.method = p.pool
        if len(self.top) > 1 and self.method != MAX:
            raise self.error("the second top (the max-pool mask) exists for pool: MAX only")
        h, w = shapes[0][2], shapes[0][3]
        if p.global_pooling:
            if p.HasField("kernel_size") or p.HasField("kernel_h"):
                raise self.error("with global_pooling the kernel size cannot be given")
            kernel, pad, stride = (h, w), (0, 0), (1, 1)
            if p.pad or p.pad_h or p.pad_w or p.stride != 1 or p.HasField("stride_h"):
                raise self.error("with global_pooling, pad and stride must be left out")
        else:
            hw = p.HasField("kernel_h") or p.HasField("kernel_w")
            if hw == p.HasField("kernel_size"):
                raise self.error("give either kernel_size or kernel_h and kernel_w")
            kernel = (p.kernel_h, p.kernel_w) if hw else (p.kernel_size, p.kernel_size)
            phw = p.HasField("pad_h") or p.HasField("pad_w")
            pad = (p.pad_h, p.pad_w) if phw else (p.pad, p.pad)
            shw = p.HasField("stride_h") or p.HasField("stride_w")
            stride = (p.stride_h, p.stride_w) if shw else (p.stride, p.stride)
        if min(kernel) <= 0 or min(stride) <= 0:
            raise self.error(f"kernel {list(kernel)} and stride {list(stride)} must be positive")
        for k, pd in zip(kernel, pad, strict=True):
            if pd >= k:
                raise self.error(f"pad {pd} must be smaller than the kernel {k}")
        if self.method == STOCHASTIC and max(pad):
            raise self.error("pool: STOCHASTIC takes no padding (Caffe ignores it there)")
        if p.HasField("ceil_mode") and p.HasField("round_mode"):
            raise self.error("give round_mode (BVLC) or ceil_mode (a fork's), not both")
        ceil = p.ceil_mode if p.HasField("ceil_mode") else p.round_mode == CEIL
        out = tuple(pooled_size(s, k, pd, st, ceil) for s, k, pd, st in zip((h, w), kernel, pad, stride, strict=True))
        if min(out) <= 0:
            raise self.error(f"the {h}x{w} bottom is smaller than the kernel {list(kernel)}")
        self.window = Window(kernel, stride, pad, (out[0], out[1]), ceil)

    def infer_top_shapes(self, shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]] | None:
        return [(*shapes[0][:2], *self.window.out)] * len(self.top)

    # Convenience views for the exporter.
    @property
    def kernel(self) -> tuple[int, int]:
        return self.window.kernel

    @property
    def stride(self) -> tuple[int, int]:
        return self.window.stride

    @property
    def pad(self) -> tuple[int, int]:
        return self.window.pad

    @property
    def ceil(self) -> bool:
        return self.window.ceil

    @property
    def max(self) -> bool:
        return bool(self.method == MAX)

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        y, mask = pool2d(bottoms[0], self.window, self.method, gen=self.gen,
                         train=self.phase == schema.TRAIN, with_mask=len(self.top) > 1)
        return [y] if mask is None else [y, mask]


class SPP(Layer):
    """Spatial pyramid pooling: levels 0..h-1 pool into 2^l x 2^l bins each; the flattened results concatenated."""

    type = "SPP"
    params = ("spp_param",)

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p = self.lp.spp_param
        if len(shapes[0]) != 4:
            raise self.error(f"needs a 4-D bottom (N, C, H, W), got shape {list(shapes[0])}")
        if p.pyramid_height < 1:
            raise self.error("spp_param.pyramid_height must be given and positive")
        self.method = p.pool
        if self.method == STOCHASTIC:
            raise self.error("pool: STOCHASTIC is not available for SPP in ddl-caffe (use MAX or AVE)")
        h, w = shapes[0][2], shapes[0][3]
        self.windows = []
        for level in range(p.pyramid_height):
            bins = 2 ** level
            kh, kw = math.ceil(h / bins), math.ceil(w / bins)
            ph, pw = (kh * bins - h + 1) // 2, (kw * bins - w + 1) // 2
            if ph >= kh or pw >= kw:
                raise self.error(f"level {level}: {bins} bins over {h}x{w} need padding {ph}x{pw} >= the kernel "
                                 f"{kh}x{kw} (Caffe refuses this too); lower pyramid_height")
            out = (pooled_size(h, kh, ph, kh, True), pooled_size(w, kw, pw, kw, True))
            self.windows.append(Window((kh, kw), (kh, kw), (ph, pw), out, True))

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        x = bottoms[0]
        parts = [pool2d(x, w, self.method)[0].flatten(1) for w in self.windows]
        return [torch.cat(parts, 1) if len(parts) > 1 else parts[0]]
