"""Horovod's other collectives on torch tensors: allgather, broadcast, alltoall, reducescatter
(grouped and asynchronous forms too), join and barrier, with Horovod's signatures.

Each synchronous call on a tensor that requires grad is differentiable, with Horovod
0.28.1's gradients (a convention: each is the true gradient times a constant): an
allgather's is this rank's rows of the output gradient *averaged* over the ranks; a
broadcast's the averaged gradient on the root and zeros elsewhere; an alltoall's the
alltoall of the gradient back; a reducescatter's the allgather of the gradient, times the
number of ranks for Sum, and times the prescale and postscale factors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

import ddl
import torch
from ddl.base.ops import ReduceOp, as_op
from ddl.runtime import api
from ddl.runtime.process_sets import ProcessSet, global_process_set

from .collectives import TorchHandle, _allreduce_now, _ps, synchronize
from .tensors import check_tensor, from_numpy, result_like, staged


def _ps_size(process_set: ProcessSet | None) -> int:
    return ddl.size() if process_set is None else int(process_set.size() or 0)


def _ps_rank(process_set: ProcessSet | None) -> int:
    return ddl.rank() if process_set is None else int(process_set.rank() or 0)


# -- allgather -----------------------------------------------------------------------------
def allgather_async(tensor: torch.Tensor, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> TorchHandle:
    """Start an allgather; :func:`synchronize` returns every rank's ``tensor`` concatenated on dim 0."""
    t = check_tensor(tensor, "allgather_async")
    h = api.allgather_async(staged(t)[0], name=name, process_set=_ps(process_set))
    return TorchHandle(h, lambda out: from_numpy(out, t))


def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Concatenate every rank's ``tensor`` along dim 0 (first dims may differ by rank). Differentiable."""
    t = check_tensor(tensor, "allgather")
    if t.requires_grad and torch.is_grad_enabled():
        out: torch.Tensor = _AllgatherFn.apply(t, name, _ps(process_set))  # type: ignore[no-untyped-call]
        return out
    return synchronize(allgather_async(t, name, process_set))  # type: ignore[no-any-return]


class _AllgatherFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None, process_set: Any) -> torch.Tensor:
        rows = api.allgather(np.array([tensor.shape[0] if tensor.dim() else 0], dtype=np.int64),
                             name=None if name is None else f"{name}.rows", process_set=process_set)
        ctx.start = int(rows[: _ps_rank(process_set)].sum())
        ctx.rows, ctx.name, ctx.process_set = int(tensor.shape[0]), name, process_set
        buf, _ = staged(tensor.detach())
        return from_numpy(api.allgather(buf, name=name, process_set=process_set), tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        # Horovod averages the incoming gradients (the true gradient of the concatenation
        # would be their sum): its users' learning rates are tuned to that.
        name = None if ctx.name is None else f"{ctx.name}.grad"
        mean = _allreduce_now(grad.contiguous(), ReduceOp.AVERAGE, name, None, None, process_set=ctx.process_set)
        return mean[ctx.start : ctx.start + ctx.rows], None, None


def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                            process_set: ProcessSet = global_process_set) -> TorchHandle:
    """Start an allgather of each tensor (one request); :func:`synchronize` returns the list."""
    ts = [check_tensor(t, "grouped_allgather") for t in tensors]
    h = api.grouped_allgather_async([staged(t)[0] for t in ts], name=name, process_set=_ps(process_set))
    return TorchHandle(h, lambda outs: [from_numpy(o, t) for o, t in zip(outs, ts, strict=True)])


def grouped_allgather(tensors: Sequence[torch.Tensor], name: str | None = None,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """Allgather each tensor (one request); results in input order. Differentiable."""
    ts = [check_tensor(t, "grouped_allgather") for t in tensors]
    if any(t.requires_grad for t in ts) and torch.is_grad_enabled():
        return [allgather(t, None if name is None else f"{name}.{i}", process_set) for i, t in enumerate(ts)]
    return synchronize(grouped_allgather_async(ts, name, process_set))  # type: ignore[no-any-return]


# -- broadcast -----------------------------------------------------------------------------
def broadcast_async(tensor: torch.Tensor, root_rank: int = 0, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> TorchHandle:
    """Start a broadcast; :func:`synchronize` returns ``root_rank``'s tensor (a new one)."""
    t = check_tensor(tensor, "broadcast_async")
    h = api.broadcast_async(staged(t)[0], root_rank, name=name, process_set=_ps(process_set))
    return TorchHandle(h, lambda out: result_like(out, t))


def broadcast_async_(tensor: torch.Tensor, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> TorchHandle:
    """In-place :func:`broadcast_async`: :func:`synchronize` writes into ``tensor`` and returns it."""
    t = check_tensor(tensor, "broadcast_async_")
    buf, back = staged(t)
    h = api.broadcast_async(buf, root_rank, name=name, process_set=_ps(process_set), inplace=True)

    def finish(out: np.ndarray) -> torch.Tensor:
        back(out)
        return t

    return TorchHandle(h, finish)


def broadcast(tensor: torch.Tensor, root_rank: int = 0, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Return ``root_rank``'s ``tensor`` on every rank as a new tensor (``root_rank`` is a
    world rank, also with a process set). Differentiable."""
    t = check_tensor(tensor, "broadcast")
    if t.requires_grad and torch.is_grad_enabled():
        out: torch.Tensor = _BroadcastFn.apply(t, root_rank, name, process_set)  # type: ignore[no-untyped-call]
        return out
    return synchronize(broadcast_async(t, root_rank, name, process_set))  # type: ignore[no-any-return]


class _BroadcastFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int, name: str | None, process_set: Any) -> torch.Tensor:
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return synchronize(broadcast_async(tensor.detach(), root_rank, name, process_set))  # type: ignore[no-any-return]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        reduced = _allreduce_now(grad.contiguous(), ReduceOp.AVERAGE, None, None, None,
                                 process_set=_ps(ctx.process_set))
        if ddl.rank() != ctx.root_rank:
            reduced = reduced * 0
        return reduced, None, None, None


def broadcast_(tensor: torch.Tensor, root_rank: int = 0, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Overwrite ``tensor`` with ``root_rank``'s; returns ``tensor``."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))  # type: ignore[no-any-return]


# -- alltoall ------------------------------------------------------------------------------
def alltoall_async(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
                   process_set: ProcessSet = global_process_set) -> TorchHandle:
    """Start an alltoall; :func:`synchronize` returns (received rows, rows received per rank)."""
    t = check_tensor(tensor, "alltoall_async")
    parts = None if splits is None else [int(n) for n in torch.as_tensor(splits).reshape(-1).tolist()]
    h = api.alltoall_async(staged(t)[0], parts, name=name, process_set=_ps(process_set))

    def finish(out: Any) -> tuple[torch.Tensor, torch.Tensor]:
        rows, received = out
        return from_numpy(rows, t), torch.tensor(received, dtype=torch.int32)

    return TorchHandle(h, finish)


def alltoall(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
             process_set: ProcessSet = global_process_set) -> Any:
    """Send rows ``splits[r]`` of ``tensor`` (dim 0, consecutive; equal parts when None) to rank r.

    Returns:
        The rows received from every rank in rank order; with ``splits`` given, also a
        tensor of how many rows came from each rank (Horovod's return convention).
        Differentiable.
    """
    t = check_tensor(tensor, "alltoall")
    if t.requires_grad and torch.is_grad_enabled():
        out, received = _AlltoallFn.apply(t, splits, name, process_set)  # type: ignore[no-untyped-call]
    else:
        out, received = synchronize(alltoall_async(t, splits, name, process_set))
    return out if splits is None else (out, received)


class _AlltoallFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, splits: Any, name: str | None,
                process_set: Any) -> tuple[torch.Tensor, torch.Tensor]:
        out, received = synchronize(alltoall_async(tensor.detach(), splits, name, process_set))
        ctx.received, ctx.process_set = received, process_set
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _: Any) -> tuple[torch.Tensor | None, ...]:
        back, _ = synchronize(alltoall_async(grad.contiguous(), ctx.received, None, ctx.process_set))
        return back, None, None, None


# -- reducescatter -------------------------------------------------------------------------
def reducescatter_async(tensor: torch.Tensor, name: str | None = None, op: Any = ReduceOp.AVERAGE,
                        process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> TorchHandle:
    """Start a reduce-scatter; :func:`synchronize` returns this rank's rows of dim 0."""
    t = check_tensor(tensor, "reducescatter_async")
    h = api.reducescatter_async(staged(t)[0], op=op, name=name, prescale_factor=prescale_factor,
                                postscale_factor=postscale_factor, process_set=_ps(process_set))
    return TorchHandle(h, lambda out: from_numpy(out, t))


def reducescatter(tensor: torch.Tensor, name: str | None = None, compression: Any = None,
                  op: Any = ReduceOp.AVERAGE, process_set: ProcessSet = global_process_set,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduce ``tensor`` (Average by default, as Horovod) and return this rank's rows of dim 0
    (the first ranks get the extra rows). Differentiable for Sum and Average.

    ``compression`` is accepted for Horovod's signature; the reduce-scatter runs uncompressed.
    """
    t = check_tensor(tensor, "reducescatter")
    if t.requires_grad and torch.is_grad_enabled():
        out: torch.Tensor = _ReducescatterFn.apply(t, name, as_op(op), process_set,  # type: ignore[no-untyped-call]
                                                   prescale_factor, postscale_factor)
        return out
    return synchronize(reducescatter_async(t, name, op, process_set, prescale_factor,  # type: ignore[no-any-return]
                                           postscale_factor))


class _ReducescatterFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None, op: ReduceOp, process_set: Any,
                prescale: float, postscale: float) -> torch.Tensor:
        ctx.op, ctx.process_set, ctx.scale = op, process_set, prescale * postscale
        return synchronize(reducescatter_async(tensor.detach(), name, op, process_set,  # type: ignore[no-any-return]
                                               prescale, postscale))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        if ctx.op not in (ReduceOp.SUM, ReduceOp.AVERAGE):
            raise RuntimeError(f"ddl.torch.reducescatter with op={ctx.op.name} has no gradient; use Sum or Average")
        # Horovod's scaling: the true gradient of an Average would be the gathered gradient
        # divided by the ranks, of a Sum the gathered gradient itself; Horovod gives the
        # gathered gradient for Average and that times the ranks for Sum.
        if ctx.op is ReduceOp.SUM:
            grad = grad * _ps_size(_ps(ctx.process_set))
        full = synchronize(allgather_async(grad.contiguous(), None, ctx.process_set))
        return full * ctx.scale, None, None, None, None, None


def grouped_reducescatter_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                                op: Any = ReduceOp.AVERAGE, process_set: ProcessSet = global_process_set,
                                prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> TorchHandle:
    """Start a reduce-scatter of each tensor (one request); :func:`synchronize` returns the list."""
    ts = [check_tensor(t, "grouped_reducescatter") for t in tensors]
    h = api.grouped_reducescatter_async([staged(t)[0] for t in ts], op=op, name=name,
                                        prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                        process_set=_ps(process_set))
    return TorchHandle(h, lambda outs: [from_numpy(o, t) for o, t in zip(outs, ts, strict=True)])


def grouped_reducescatter(tensors: Sequence[torch.Tensor], name: str | None = None, compression: Any = None,
                          op: Any = ReduceOp.AVERAGE, process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> list[torch.Tensor]:
    """Reduce-scatter each tensor (one request); results in input order. Differentiable."""
    ts = [check_tensor(t, "grouped_reducescatter") for t in tensors]
    if any(t.requires_grad for t in ts) and torch.is_grad_enabled():
        return [reducescatter(t, None if name is None else f"{name}.{i}", None, op, process_set, prescale_factor,
                              postscale_factor) for i, t in enumerate(ts)]
    return synchronize(grouped_reducescatter_async(ts, name, op, process_set, prescale_factor,  # type: ignore[no-any-return]
                                                   postscale_factor))


# -- join and barrier ----------------------------------------------------------------------
def join(device: int = -1) -> int:
    """This rank has run out of data: until every rank joins, the others' allreduces go on
    with zeros from here (an Average divides by the ranks that contributed). Returns the
    rank that joined last. ``device`` is accepted for Horovod's signature (zeros are made
    on the CPU)."""
    return api.join()


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Block until every rank (of ``process_set``) has reached the barrier."""
    api.barrier(process_set=_ps(process_set))
