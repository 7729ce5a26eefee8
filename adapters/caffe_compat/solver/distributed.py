"""How ddl-caffe's Solver talks to the other ranks: gradients averaged, parameters broadcast."""

from __future__ import annotations

from collections.abc import Callable

import torch

import ddl
import ddl.torch as dt

Hook = Callable[[list[torch.Tensor]], None]


def average_gradients(ts: list[torch.Tensor]) -> None:
    """Average ``ts`` over the ranks in one fused reduction (Caffe's multi-GPU rule)."""
    for t, o in zip(ts, dt.grouped_allreduce(ts, op=ddl.Average, name="ddl_caffe.grads"), strict=True):
        t.copy_(o)


def broadcast_parameters(ts: list[torch.Tensor]) -> None:
    """Give every rank rank 0's parameters."""
    for i, t in enumerate(ts):
        dt.broadcast_(t, root_rank=0, name=f"ddl_caffe.param.{i}")


def solver_hooks() -> tuple[Hook | None, Hook | None]:
    """(reduce, broadcast) for a Solver: None for both in a world of one."""
    return (average_gradients, broadcast_parameters) if ddl.size() > 1 else (None, None)
