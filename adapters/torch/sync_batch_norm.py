"""SyncBatchNorm: batch normalization over the global batch, forward and backward, on CPU or CUDA.

A drop-in for ``torch.nn.SyncBatchNorm`` (whose kernels refuse CPU tensors): in training
each rank's per-channel count, sum and sum of squares are allreduced (in float64, one
grouped call), so every rank normalizes with the statistics of the whole batch; in
backward the sums of the output gradient and of its product with the normalized input
are allreduced the same way. N ranks on B/N samples each therefore compute what one
process computes on B samples. Weight and bias gradients stay local, as in PyTorch's
(the optimizer averages them across ranks).
"""

from __future__ import annotations

from typing import Any

import torch
from ddl.base.ops import ReduceOp
from ddl.runtime import api
from ddl.runtime.process_sets import ProcessSet, global_process_set

from .collectives import _ps


def _channel_sums(*tensors: torch.Tensor, process_set: ProcessSet | None) -> list[torch.Tensor]:
    """Per-channel tensors allreduced (Sum) over the ranks, in float64, in one grouped call."""
    arrays = [t.detach().to("cpu", torch.float64).contiguous().numpy() for t in tensors]
    outs = api.grouped_allreduce(arrays, op=ReduceOp.SUM, process_set=process_set)
    return [torch.from_numpy(o).to(t.device) for o, t in zip(outs, tensors, strict=True)]


class _SyncBatchNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float,
                process_set: ProcessSet | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        dims = [0, *range(2, x.dim())]
        count = torch.tensor([x.numel() / max(x.shape[1], 1)], dtype=torch.float64, device=x.device)
        x64 = x.detach().double()
        total, s, sq = _channel_sums(count, x64.sum(dims), (x64 * x64).sum(dims), process_set=process_set)
        n = total[0]
        mean = s / n
        var = (sq / n - mean * mean).clamp_min(0)
        invstd = torch.rsqrt(var + eps)
        shape = [1, -1] + [1] * (x.dim() - 2)
        xhat = (x64 - mean.view(shape)) * invstd.view(shape)
        y = xhat
        if weight is not None:
            y = y * weight.double().view(shape)
        if bias is not None:
            y = y + bias.double().view(shape)
        ctx.save_for_backward(xhat, invstd, weight if weight is not None else torch.empty(0), n.reshape(1))
        ctx.has_weight, ctx.has_bias, ctx.process_set = weight is not None, bias is not None, process_set
        ctx.mark_non_differentiable(mean, var, n)
        return y.to(x.dtype), mean.to(x.dtype), var.to(x.dtype), n

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor, *_: Any) -> tuple[Any, ...]:
        xhat, invstd, weight, n = ctx.saved_tensors
        dims = [0, *range(2, xhat.dim())]
        shape = [1, -1] + [1] * (xhat.dim() - 2)
        dy64 = dy.double()
        local_dy, local_dy_xhat = dy64.sum(dims), (dy64 * xhat).sum(dims)
        sum_dy, sum_dy_xhat = _channel_sums(local_dy, local_dy_xhat, process_set=ctx.process_set)
        scale = invstd if not ctx.has_weight else invstd * weight.double()
        dx = scale.view(shape) * (dy64 - (sum_dy / n).view(shape) - xhat * (sum_dy_xhat / n).view(shape))
        grad_w = local_dy_xhat.to(dy.dtype) if ctx.has_weight else None
        grad_b = local_dy.to(dy.dtype) if ctx.has_bias else None
        return dx.to(dy.dtype), grad_w, grad_b, None, None


class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """Batch normalization with statistics over every rank's batch (Horovod's and PyTorch's
    ``SyncBatchNorm``), for inputs of any dimension >= 2, on CPU or CUDA.

    Args:
        num_features, eps, momentum, affine, track_running_stats: as ``torch.nn.BatchNorm2d``.
        process_set: normalize over this process set's ranks only.

    Example:
        >>> model = ddl.torch.SyncBatchNorm.convert_sync_batchnorm(model)  # doctest: +SKIP
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, *, process_set: ProcessSet = global_process_set) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"SyncBatchNorm expects an input of at least 2 dimensions (N, C, ...), got {input.dim()}D")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        if not (self.training or not self.track_running_stats):
            return torch.nn.functional.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias,
                                                  False, 0.0, self.eps)
        y, mean, var, n = _SyncBatchNormFn.apply(input, self.weight, self.bias,  # type: ignore[no-untyped-call]
                                                 self.eps, _ps(self.process_set))
        if self.training and self.track_running_stats:
            assert self.num_batches_tracked is not None and self.running_mean is not None
            assert self.running_var is not None
            self.num_batches_tracked.add_(1)
            momentum = (1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum)
            unbiased = var * (n / (n - 1)).to(var.dtype) if float(n) > 1 else var
            with torch.no_grad():
                self.running_mean.mul_(1 - momentum).add_(mean.detach(), alpha=momentum)
                self.running_var.mul_(1 - momentum).add_(unbiased.detach(), alpha=momentum)
        return y  # type: ignore[no-any-return]

    @classmethod
    def convert_sync_batchnorm(cls, module: torch.nn.Module, process_group: Any = None, *,
                               process_set: ProcessSet = global_process_set) -> torch.nn.Module:
        """``module`` with every ``BatchNorm*d`` replaced by a :class:`SyncBatchNorm` holding its
        weights, buffers and mode (``process_group`` is accepted for PyTorch's signature)."""
        out = module
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and not isinstance(module, cls):
            out = cls(module.num_features, module.eps, module.momentum, module.affine,  # type: ignore[arg-type]
                      module.track_running_stats, process_set=process_set)
            if module.affine:
                with torch.no_grad():
                    out.weight = module.weight
                    out.bias = module.bias
            out.running_mean = module.running_mean
            out.running_var = module.running_var
            out.num_batches_tracked = module.num_batches_tracked
            out.train(module.training)
        for name, child in module.named_children():
            out.add_module(name, cls.convert_sync_batchnorm(child, process_group, process_set=process_set))
        return out
