"""Normalization layers: BatchNorm (Caffe's three statistics blobs), LRN, MVN and SSD's Normalize."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ddl.caffe.formats import schema
from ddl.caffe.layers.base import Layer


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
        if x.numel() == x.shape[1]:
            # One value per channel (batch 1, 1x1 maps: MobileNet-SSD's last feature maps under ``time``):
            # Caffe computes the batch statistics of one value, so the top is 0 and so is every diff;
            # PyTorch's batch_norm refuses such a batch.
            y = x * 0.0
        else:
            # Batch statistics of a channels_last tensor (a first convolution's output) come out of PyTorch's CPU
            # kernel 10x less exact than of the same values in NCHW order (1.6e-6 against 1.7e-7 from float64),
            # and Caffe's are of NCHW data: a deep TRAIN-phase net drifted 10x further from float64 than Caffe.
            y = F.batch_norm(x.contiguous(), None, None, training=True, eps=self.eps)
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


ACROSS_CHANNELS, WITHIN_CHANNEL = 0, 1


class LRN(Layer):
    type = "LRN"
    same_shape = True
    params = ("lrn_param",)

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
            # x / (k + alpha/n * sum of x^2 over the n channels centred on c)^beta; the window
            # sum is n shifted adds (torch's local_response_norm goes through avg_pool3d).
            half = (self.size - 1) // 2
            c = x.shape[1]
            sq = F.pad(x * x, (0, 0, 0, 0, half, half))
            acc = sq.narrow(1, 0, c)
            for i in range(1, self.size):
                acc = acc + sq.narrow(1, i, c)
            scale = acc * (self.alpha / self.size) + self.k
            return [x * scale.pow(-self.beta)]
        # WITHIN_CHANNEL: x * (1 + alpha * AVE-pool(x^2, size, pad (size-1)/2))^-beta; k unused
        pad = (self.size - 1) // 2
        avg = F.avg_pool2d(x * x, self.size, 1, pad, ceil_mode=True, count_include_pad=True)
        return [x * (1 + self.alpha * avg).pow(-self.beta)]


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


class Normalize(Layer):
    """x / sqrt(sum x^2 + eps) over (C, H, W) (across_spatial) or over C at each position, times a learned scale."""

    type = "Normalize"
    same_shape = True
    params = ("norm_param",)

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p = self.lp.norm_param
        if len(shapes[0]) < 2:
            raise self.error(f"needs a bottom (N, C, ...), got {list(shapes[0])}")
        filler = p.scale_filler if p.HasField("scale_filler") else schema.FillerParameter(type="constant", value=1.0)
        self.blobs = [self.make_blob((1,) if p.channel_shared else (shapes[0][1],), filler, what="scale")]

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        p, x = self.lp.norm_param, bottoms[0]
        if p.across_spatial:
            norm = ((x * x).reshape(x.shape[0], -1).sum(1) + p.eps).sqrt().reshape((-1,) + (1,) * (x.dim() - 1))
        else:
            norm = ((x * x).sum(1, keepdim=True) + p.eps).sqrt()
        y = x / norm
        s = self.blobs[0]
        return [y * (s.reshape(()) if p.channel_shared else s.reshape((1, -1) + (1,) * (x.dim() - 2)))]
