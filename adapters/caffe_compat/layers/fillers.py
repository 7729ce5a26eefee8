"""Caffe's weight fillers (constant, uniform, gaussian, positive_unitball, xavier, msra, bilinear) on torch tensors."""

from __future__ import annotations

import math
from typing import Any

import torch

FAN_IN, FAN_OUT, AVERAGE = 0, 1, 2
SUPPORTED = ("constant", "uniform", "gaussian", "positive_unitball", "xavier", "msra", "bilinear")


def _fan(shape: tuple[int, ...], norm: int) -> float:
    count = math.prod(shape)
    fan_in = count / shape[0] if shape else 1
    fan_out = count / shape[1] if len(shape) > 1 else count
    if norm == FAN_OUT:
        return fan_out
    if norm == AVERAGE:
        return (fan_in + fan_out) / 2.0
    return fan_in


def fill(shape: tuple[int, ...], p: Any, gen: torch.Generator, *, where: str = "") -> torch.Tensor:
    """A float32 tensor of ``shape`` filled as the FillerParameter ``p`` says.

    Raises:
        ValueError: an unsupported filler type (named with ``where``).
    """
    out = torch.empty(shape, dtype=torch.float32)
    kind = p.type
    if kind == "constant":
        out.fill_(p.value)
    elif kind == "uniform":
        out.uniform_(p.min, p.max, generator=gen)
    elif kind == "gaussian":
        out.normal_(p.mean, p.std, generator=gen)
        if p.sparse >= 0:
            # Caffe keeps each weight with probability sparse / num_outputs (shape[0]).
            keep = p.sparse / shape[0]
            out *= (torch.rand(shape, generator=gen) < keep).to(out.dtype)
    elif kind == "positive_unitball":
        # Uniform in [0, 1], then each of the shape[0] rows scaled to sum to one.
        out.uniform_(0.0, 1.0, generator=gen)
        rows = out.reshape(shape[0] if shape else 1, -1)
        rows.div_(rows.sum(1, keepdim=True))
    elif kind == "xavier":
        scale = math.sqrt(3.0 / _fan(shape, p.variance_norm))
        out.uniform_(-scale, scale, generator=gen)
    elif kind == "msra":
        out.normal_(0.0, math.sqrt(2.0 / _fan(shape, p.variance_norm)), generator=gen)
    elif kind == "bilinear":
        if len(shape) != 4 or shape[2] != shape[3]:
            raise ValueError(f"{where}: the bilinear filler needs a 4-D square kernel, got {list(shape)}")
        k = shape[3]
        f = math.ceil(k / 2.0)
        c = (2 * f - 1 - f % 2) / (2.0 * f)
        ys = 1 - (torch.arange(k, dtype=torch.float64) / f - c).abs()
        out.copy_((ys[:, None] * ys[None, :]).to(torch.float32).expand(shape))
    else:
        raise ValueError(f"{where}: filler type '{kind}' is not supported; use one of {', '.join(SUPPORTED)}")
    return out
