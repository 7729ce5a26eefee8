"""Gradient buckets: the flat buffer each one fills (which parameters share one: :mod:`ddl.reduction.buckets`)."""

from __future__ import annotations

import torch
from ddl.reduction.buckets import (
    FLAGS_PER_TENSOR,
    GradientBucket,
    MiB,
    gradient_buckets,
    plan_buckets,
)

from .staging import Copy, Device

__all__ = ["Bucket", "GradientBucket", "MiB", "gradient_buckets", "plan_buckets"]


class Bucket:
    """One bucket: its parameters, their offsets in one flat buffer, and two flags each.

    The buffer holds every gradient followed by one flag per parameter (1 where this
    rank has a dense gradient, else 0), then one more per parameter (1 where this rank
    has a sparse gradient to allgather, else 0): ``FLAGS_PER_TENSOR`` (2) elements per
    parameter, which ``ddl plan`` prices with the gradients. Reduced with the gradients, a flag above
    zero says some rank had one, so a parameter unused everywhere keeps ``grad=None`` as it
    would in a single process, one unused only here still gets the others' gradient, and
    every rank knows which sparse gradients to gather, this one's included or not.
    """

    def __init__(self, index: int, name: str, params: list[torch.Tensor], device: Device | None = None) -> None:
        """``device``: how gradients on an accelerator reach this bucket's (pinned, host)
        buffer; None for CPU parameters, whose gradients are reduced in place."""
        self.index = index
        self.name = name
        self.params = params
        self.offsets: list[int] = []
        total = 0
        for p in params:
            self.offsets.append(total)
            total += p.numel()
        self.numel = total
        first = params[0]
        pin = first.device.type == "cuda"
        # Made once and reused every step: no pinned allocation on the step's path.
        self.buffer = torch.zeros(total + FLAGS_PER_TENSOR * len(params), dtype=first.dtype, pin_memory=pin)
        self.device = device
        self.ready = 0
        self.handle: object | None = None
        self.copy: Copy | None = None  # the device->host copy in flight, before the allreduce starts
        self.sparse: dict[int, torch.Tensor] = {}  # this rank's sparse gradients, by position, this step

    def grad_slice(self, j: int) -> torch.Tensor:
        """The part of the buffer holding parameter ``j``'s gradient, shaped like it."""
        p = self.params[j]
        return self.buffer[self.offsets[j] : self.offsets[j] + p.numel()].view(p.shape)

    @property
    def flags(self) -> torch.Tensor:
        """The dense-gradient flags."""
        return self.buffer[self.numel : self.numel + len(self.params)]

    @property
    def sparse_flags(self) -> torch.Tensor:
        """The sparse-gradient flags."""
        return self.buffer[self.numel + len(self.params) :]

    def reset(self) -> None:
        self.ready = 0
        self.handle = None
        self.copy = None
        self.sparse = {}
