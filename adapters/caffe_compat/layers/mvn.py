"""MVN: mean (and variance) normalization per item and channel, or per item across channels."""

from __future__ import annotations

from typing import Any

import torch

from .base import Layer


class _NormalizeRows(torch.autograd.Function):
    """y = (x - mean) / (std + eps) per row, with Caffe's backward (finite on constant rows)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, eps: float) -> torch.Tensor:
        centred = x - x.mean(1, keepdim=True)
        sigma = (centred * centred).mean(1, keepdim=True).sqrt() + eps
        y = centred / sigma
        ctx.save_for_backward(y, sigma)
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor, None]:
        y, sigma = ctx.saved_tensors
        # Caffe: (dy - mean(dy) - y * mean(y * dy)) / (std + eps).
        dx = dy - dy.mean(1, keepdim=True) - y * (y * dy).mean(1, keepdim=True)
        return dx / sigma, None


class MVN(Layer):
    """(x - mean) / (sqrt(variance) + eps) over (H, W) per channel, or over (C, H, W) with across_channels."""

    type = "MVN"
    same_shape = True
    params = ("mvn_param",)

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        if len(shapes[0]) < 2:
            raise self.error(f"needs a bottom with at least 2 axes, got {list(shapes[0])}")

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        p, x = self.lp.mvn_param, bottoms[0]
        flat = x.reshape(x.shape[0], -1) if p.across_channels else x.reshape(x.shape[0] * x.shape[1], -1)
        if p.normalize_variance:
            out = _NormalizeRows.apply(flat, float(p.eps))  # type: ignore[no-untyped-call]
        else:
            out = flat - flat.mean(1, keepdim=True)
        return [out.reshape(x.shape)]
