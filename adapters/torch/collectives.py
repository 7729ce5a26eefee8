"""The core's collectives on torch tensors (CPU zero-copy; CUDA staged through host memory)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import ddl
import torch
from ddl.base.ops import ReduceOp, as_op

from .tensors import check_tensor, from_numpy, staged


class TorchHandle:
    """The pending result of an asynchronous torch collective; ``wait()`` returns the tensor."""

    __slots__ = ("_finish", "_handle", "_result")

    def __init__(self, handle: ddl.Handle, finish: Callable[[np.ndarray], torch.Tensor]) -> None:
        self._handle = handle
        self._finish = finish
        self._result: torch.Tensor | None = None

    @property
    def name(self) -> str:
        return self._handle.name

    def done(self) -> bool:
        """True once the collective has finished."""
        return self._handle.done()

    def wait(self, timeout: float | None = None) -> torch.Tensor:
        """Block until done and return the result tensor (raises the collective's error)."""
        if self._result is None:
            self._result = self._finish(self._handle.wait(timeout))
        return self._result

    def __repr__(self) -> str:
        return f"<ddl.torch.Handle {self.name!r} {'done' if self.done() else 'pending'}>"


def allreduce_async(
    tensor: torch.Tensor, *, op: Any = ReduceOp.AVERAGE, name: str | None = None,
    compression: Any = None, algorithm: str | None = None,
) -> TorchHandle:
    """Start an allreduce of ``tensor``; the handle's ``wait()`` returns a new tensor.

    Example:
        >>> h = ddl.torch.allreduce_async(torch.ones(3), name="x")  # doctest: +SKIP
        >>> ddl.torch.synchronize(h)                                 # doctest: +SKIP
    """
    t = check_tensor(tensor, "allreduce_async")
    src = staged(t)[0]
    h = ddl.allreduce_async(src, op=op, name=name, compression=compression, algorithm=algorithm)
    return TorchHandle(h, lambda out: from_numpy(out, t).reshape(t.shape))


def allreduce_async_(
    tensor: torch.Tensor, *, op: Any = ReduceOp.AVERAGE, name: str | None = None,
    compression: Any = None, algorithm: str | None = None,
) -> TorchHandle:
    """In-place :func:`allreduce_async`: ``wait()`` writes the result into ``tensor`` and returns it."""
    t = check_tensor(tensor, "allreduce_async_")
    buf, back = staged(t)
    h = ddl.allreduce_async(buf, op=op, name=name, compression=compression, algorithm=algorithm, inplace=True)

    def finish(out: np.ndarray) -> torch.Tensor:
        back(out)
        return t

    return TorchHandle(h, finish)


def synchronize(handle: TorchHandle) -> torch.Tensor:
    """Wait for ``handle`` and return its tensor."""
    return handle.wait()


def allreduce(tensor: torch.Tensor, *, op: Any = ReduceOp.AVERAGE, name: str | None = None,
              compression: Any = None, algorithm: str | None = None) -> torch.Tensor:
    """Reduce ``tensor`` over all ranks and return the result as a new tensor (same bits everywhere).

    Args:
        tensor: a dense tensor on CPU or CUDA.
        op: ``ddl.Average`` (default), ``Sum``, ``Min``, ``Max`` or ``Product``.
        name: matches the call across ranks and names it in errors.
        compression: ``ddl.Compression.none`` (default), ``.fp16`` or ``.bf16``.

    Example:
        >>> ddl.torch.allreduce(torch.ones(3), op=ddl.Sum)  # doctest: +SKIP
    """
    if check_tensor(tensor, "allreduce").requires_grad and torch.is_grad_enabled():
        out: torch.Tensor = _AllreduceFn.apply(tensor, op, name, compression, algorithm)  # type: ignore[no-untyped-call]
        return out
    return _allreduce_now(tensor, op, name, compression, algorithm)


def _allreduce_now(tensor: torch.Tensor, op: Any, name: str | None, compression: Any,
                   algorithm: str | None) -> torch.Tensor:
    """A synchronous allreduce into a new tensor: the core's synchronous call (its lean path)."""
    t = check_tensor(tensor, "allreduce")
    out = ddl.allreduce(staged(t)[0], op=op, name=name, compression=compression, algorithm=algorithm)
    return from_numpy(out, t).reshape(t.shape)


class _AllreduceFn(torch.autograd.Function):
    """Differentiable allreduce: the gradient of a Sum/Average is the Sum/Average of the gradients."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, op: Any, name: str | None, compression: Any,
                algorithm: str | None) -> torch.Tensor:
        ctx.op, ctx.name, ctx.compression = op, name, compression
        return _allreduce_now(tensor, op, name, compression, algorithm)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        op = as_op(ctx.op)
        if op not in (ReduceOp.SUM, ReduceOp.AVERAGE):
            raise RuntimeError(f"ddl.torch.allreduce with op={op.name} has no gradient; use Sum or Average, "
                               "or call it on a detached tensor")
        name = None if ctx.name is None else f"{ctx.name}.grad"
        g = _allreduce_now(grad.contiguous(), op, name, ctx.compression, None)
        return g, None, None, None, None


def allreduce_(tensor: torch.Tensor, *, op: Any = ReduceOp.AVERAGE, name: str | None = None,
               compression: Any = None, algorithm: str | None = None) -> torch.Tensor:
    """In-place :func:`allreduce`; returns ``tensor``."""
    t = check_tensor(tensor, "allreduce_")
    buf, back = staged(t)
    back(ddl.allreduce_(buf, op=op, name=name, compression=compression, algorithm=algorithm))
    return t


def grouped_allreduce(tensors: Sequence[torch.Tensor], *, op: Any = ReduceOp.AVERAGE, name: str | None = None,
                      compression: Any = None) -> list[torch.Tensor]:
    """Allreduce several tensors together (fused by the engine); results in input order."""
    ts = [check_tensor(t, "grouped_allreduce") for t in tensors]
    outs = ddl.grouped_allreduce([staged(t)[0] for t in ts], op=op, name=name, compression=compression)
    return [from_numpy(o, t).reshape(t.shape) for o, t in zip(outs, ts, strict=True)]


def allgather(tensor: torch.Tensor, *, name: str | None = None) -> torch.Tensor:
    """Concatenate every rank's ``tensor`` along dim 0 (first dims may differ by rank)."""
    t = check_tensor(tensor, "allgather")
    if t.requires_grad and torch.is_grad_enabled():
        out: torch.Tensor = _AllgatherFn.apply(t, name)  # type: ignore[no-untyped-call]
        return out
    buf, _ = staged(t)
    return from_numpy(ddl.allgather(buf, name=name), t)


class _AllgatherFn(torch.autograd.Function):
    """Differentiable allgather: each rank's gradient is its rows of the summed output gradient."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None) -> torch.Tensor:
        rows = ddl.allgather(np.array([tensor.shape[0] if tensor.dim() else 0], dtype=np.int64),
                             name=None if name is None else f"{name}.rows")
        ctx.start = int(rows[: ddl.rank()].sum())
        ctx.rows, ctx.name = int(tensor.shape[0]), name
        buf, _ = staged(tensor.detach())
        return from_numpy(ddl.allgather(buf, name=name), tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        name = None if ctx.name is None else f"{ctx.name}.grad"
        total = _allreduce_now(grad.contiguous(), ReduceOp.SUM, name, None, None)
        return total[ctx.start : ctx.start + ctx.rows], None


def broadcast(tensor: torch.Tensor, root_rank: int = 0, *, name: str | None = None) -> torch.Tensor:
    """Return ``root_rank``'s ``tensor`` on every rank as a new tensor."""
    t = check_tensor(tensor, "broadcast")
    buf, _ = staged(t)
    return from_numpy(ddl.broadcast(buf, root_rank, name=name), t).reshape(t.shape)


def broadcast_(tensor: torch.Tensor, root_rank: int = 0, *, name: str | None = None) -> torch.Tensor:
    """Overwrite ``tensor`` with ``root_rank``'s; returns ``tensor``."""
    t = check_tensor(tensor, "broadcast_")
    buf, back = staged(t)
    back(ddl.broadcast_(buf, root_rank, name=name))
    return t


def reducescatter(tensor: torch.Tensor, *, op: Any = ReduceOp.SUM, name: str | None = None) -> torch.Tensor:
    """Reduce ``tensor`` and return this rank's rows of dim 0 (the first ranks get extra rows)."""
    t = check_tensor(tensor, "reducescatter")
    buf, _ = staged(t)
    return from_numpy(ddl.reducescatter(buf, op=op, name=name), t)
