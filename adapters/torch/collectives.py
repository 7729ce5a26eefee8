"""The core's allreduces on torch tensors, with Horovod's signatures (CPU zero-copy; CUDA staged).

Every function takes Horovod 0.28.1's arguments in Horovod's order (``average=`` is
accepted with Horovod's DeprecationWarning); ddl's own extra, ``algorithm=``, is
keyword-only at the end. Asynchronous calls return a :class:`TorchHandle` for
:func:`synchronize` and :func:`poll`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import ddl
import torch
from ddl.base.ops import ReduceOp, as_op, op_from_average
from ddl.runtime import api
from ddl.runtime.process_sets import ProcessSet, global_process_set

from .tensors import check_tensor, from_numpy, result_like, staged

_NONE = None  # Compression.none: the core's default


class TorchHandle:
    """The pending result of an asynchronous torch collective; ``wait()`` returns the tensor(s).

    Calling the handle waits too: Horovod's :func:`sparse_allreduce_async` returns a
    function that gives the result, and code written for it calls ``handle()``.
    """

    __slots__ = ("_finish", "_handle", "_result")

    def __init__(self, handle: ddl.Handle, finish: Callable[[Any], Any]) -> None:
        self._handle = handle
        self._finish = finish
        self._result: Any = None

    @property
    def name(self) -> str:
        return self._handle.name

    def done(self) -> bool:
        """True once the collective has finished."""
        return self._handle.done()

    def wait(self, timeout: float | None = None) -> Any:
        """Block until done and return the result (raises the collective's error)."""
        if self._result is None:
            self._result = self._finish(self._handle.wait(timeout))
        return self._result

    def __call__(self) -> Any:
        """The same as :meth:`wait` (Horovod's sparse handles are functions)."""
        return self.wait()

    def __repr__(self) -> str:
        return f"<ddl.torch.Handle {self.name!r} {'done' if self.done() else 'pending'}>"


def poll(handle: TorchHandle) -> bool:
    """True once ``handle``'s collective has finished: :func:`synchronize` then returns at once."""
    return handle.done()


def synchronize(handle: TorchHandle) -> Any:
    """Wait for ``handle`` and return its tensor (or tensors)."""
    return handle.wait()


def _ps(process_set: ProcessSet | None) -> ProcessSet | None:
    return None if process_set is None or process_set.process_set_id == 0 else process_set


def _op(op: Any, average: bool | None) -> ReduceOp:
    return as_op(op_from_average(op, average))


# -- allreduce ---------------------------------------------------------------------------
def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: Any = None,
                    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set, *, compression: Any = None,
                    algorithm: str | None = None) -> TorchHandle:
    """Start an allreduce of ``tensor``; :func:`synchronize` returns a new tensor.

    Example:
        >>> h = ddl.torch.allreduce_async(torch.ones(3), name="x")  # doctest: +SKIP
        >>> ddl.torch.synchronize(h)                                 # doctest: +SKIP
    """
    t = check_tensor(tensor, "allreduce_async")
    h = api.allreduce_async(staged(t)[0], op=_op(op, average), name=name, compression=compression,
                            algorithm=algorithm, prescale_factor=prescale_factor,
                            postscale_factor=postscale_factor, process_set=_ps(process_set))
    return TorchHandle(h, lambda out: result_like(out, t))


def allreduce_async_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: Any = None,
                     prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: ProcessSet = global_process_set, *, compression: Any = None,
                     algorithm: str | None = None) -> TorchHandle:
    """In-place :func:`allreduce_async`: :func:`synchronize` writes the result into ``tensor`` and returns it."""
    t = check_tensor(tensor, "allreduce_async_")
    buf, back = staged(t)
    h = api.allreduce_async(buf, op=_op(op, average), name=name, compression=compression, algorithm=algorithm,
                            inplace=True, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                            process_set=_ps(process_set))

    def finish(out: np.ndarray) -> torch.Tensor:
        back(out)
        return t

    return TorchHandle(h, finish)


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, compression: Any = _NONE,
              op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set, *, algorithm: str | None = None) -> torch.Tensor:
    """Reduce ``tensor`` over all ranks and return the result as a new tensor (same bits everywhere).

    Differentiable for Sum and Average (the gradient is reduced the same way).

    Args:
        tensor: a dense tensor on CPU or CUDA.
        average: deprecated (Horovod's): True for Average, False for Sum; use ``op``.
        name: matches the call across ranks and names it in errors.
        compression: ``ddl.Compression.none`` (default), ``.fp16`` or ``.bf16``.
        op: ``Average`` (default), ``Sum``, ``Min``, ``Max``, ``Product`` or ``Adasum``.
        prescale_factor, postscale_factor: multiply the input before and the result after the sum.
        process_set: reduce over this :class:`ProcessSet` only.

    Example:
        >>> ddl.torch.allreduce(torch.ones(3), op=ddl.Sum)  # doctest: +SKIP
    """
    rop = _op(op, average)
    args = (rop, name, compression, algorithm, prescale_factor, postscale_factor, _ps(process_set))
    if check_tensor(tensor, "allreduce").requires_grad and torch.is_grad_enabled():
        out: torch.Tensor = _AllreduceFn.apply(tensor, *args)  # type: ignore[no-untyped-call]
        return out
    return _allreduce_now(tensor, *args)


def _allreduce_now(tensor: torch.Tensor, op: ReduceOp, name: str | None, compression: Any, algorithm: str | None,
                   prescale: float = 1.0, postscale: float = 1.0,
                   process_set: ProcessSet | None = None) -> torch.Tensor:
    """A synchronous allreduce into a new tensor: the core's synchronous call (its lean path)."""
    t = check_tensor(tensor, "allreduce")
    out = api.allreduce(staged(t)[0], op=op, name=name, compression=compression, algorithm=algorithm,
                        prescale_factor=prescale, postscale_factor=postscale, process_set=process_set)
    return result_like(out, t)


class _AllreduceFn(torch.autograd.Function):
    """Differentiable allreduce: the gradient of a Sum/Average is the Sum/Average of the gradients."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, op: ReduceOp, name: str | None, compression: Any,
                algorithm: str | None, prescale: float, postscale: float, process_set: Any) -> torch.Tensor:
        ctx.args = (op, name, compression, prescale, postscale, process_set)
        return _allreduce_now(tensor, op, name, compression, algorithm, prescale, postscale, process_set)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        op, name, compression, prescale, postscale, process_set = ctx.args
        g = _reduce_grad(grad, op, name, compression, prescale, postscale, process_set)
        return g, None, None, None, None, None, None, None


def _reduce_grad(grad: torch.Tensor, op: ReduceOp, name: str | None, compression: Any, prescale: float,
                 postscale: float, process_set: Any) -> torch.Tensor:
    if op not in (ReduceOp.SUM, ReduceOp.AVERAGE):
        raise RuntimeError(f"ddl.torch.allreduce with op={op.name} has no gradient; use Sum or Average, "
                           "or call it on a detached tensor")
    return _allreduce_now(grad.contiguous(), op, None if name is None else f"{name}.grad", compression, None,
                          prescale, postscale, process_set)


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: Any = None,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set, *, compression: Any = None,
               algorithm: str | None = None) -> torch.Tensor:
    """In-place :func:`allreduce`; returns ``tensor``."""
    t = check_tensor(tensor, "allreduce_")
    buf, back = staged(t)
    back(api.allreduce_(buf, op=_op(op, average), name=name, compression=compression, algorithm=algorithm,
                        prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                        process_set=_ps(process_set)))
    return t


# -- grouped allreduce -------------------------------------------------------------------
def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                            op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet = global_process_set, *,
                            compression: Any = None) -> TorchHandle:
    """Start one allreduce of several tensors; :func:`synchronize` returns the list."""
    ts = [check_tensor(t, "grouped_allreduce") for t in tensors]
    h = api.grouped_allreduce_async([staged(t)[0] for t in ts], op=_op(op, average), name=name,
                                    compression=compression, prescale_factor=prescale_factor,
                                    postscale_factor=postscale_factor, process_set=_ps(process_set))
    return TorchHandle(h, lambda outs: [result_like(o, t) for o, t in zip(outs, ts, strict=True)])


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                             op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: ProcessSet = global_process_set, *,
                             compression: Any = None) -> TorchHandle:
    """In-place :func:`grouped_allreduce_async`: results are written into the tensors."""
    ts = list(tensors)
    h = grouped_allreduce_async(ts, average, name, op, prescale_factor, postscale_factor, process_set,
                                compression=compression)

    def finish(outs: Any) -> list[torch.Tensor]:
        with torch.no_grad():
            for t, o in zip(ts, h._finish(outs), strict=True):
                t.copy_(o)
        return ts

    return TorchHandle(h._handle, finish)


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                      compression: Any = _NONE, op: Any = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """Allreduce several tensors together (fused by the engine); results in input order.
    Differentiable for Sum and Average."""
    rop = _op(op, average)
    ts = [check_tensor(t, "grouped_allreduce") for t in tensors]
    if any(t.requires_grad for t in ts) and torch.is_grad_enabled():
        return list(_GroupedAllreduceFn.apply(rop, name, compression, prescale_factor,  # type: ignore[no-untyped-call]
                                              postscale_factor, _ps(process_set), *ts))
    return synchronize(grouped_allreduce_async(ts, None, name, rop, prescale_factor, postscale_factor,  # type: ignore[no-any-return]
                                               process_set, compression=compression))


class _GroupedAllreduceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, op: ReduceOp, name: str | None, compression: Any, prescale: float, postscale: float,
                process_set: Any, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.args = (op, name, compression, prescale, postscale, process_set)
        ps = global_process_set if process_set is None else process_set
        return tuple(synchronize(grouped_allreduce_async(list(tensors), None, name, op, prescale, postscale, ps,
                                                         compression=compression)))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        op, name, compression, prescale, postscale, process_set = ctx.args
        if op not in (ReduceOp.SUM, ReduceOp.AVERAGE):
            raise RuntimeError(f"ddl.torch.grouped_allreduce with op={op.name} has no gradient; use Sum or Average")
        ps = global_process_set if process_set is None else process_set
        reduced = synchronize(grouped_allreduce_async([g.contiguous() for g in grads], None,
                                                      None if name is None else f"{name}.grad", op, prescale,
                                                      postscale, ps, compression=compression))
        return (None, None, None, None, None, None, *reduced)


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                       op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set, *,
                       compression: Any = None) -> list[torch.Tensor]:
    """In-place :func:`grouped_allreduce`; returns the tensors."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,  # type: ignore[no-any-return]
                                                postscale_factor, process_set, compression=compression))


def sparse_allreduce_async(tensor: torch.Tensor, name: str | None, op: Any,
                           process_set: ProcessSet = global_process_set) -> TorchHandle:
    """Start an allreduce of a sparse COO tensor: indices and values are allgathered (an
    Average divides the values). Returns a handle that, called as Horovod's function is
    (``handle()``) or passed to :func:`synchronize`, gives the coalesced sparse sum.

    Example:
        >>> h = ddl.torch.sparse_allreduce_async(emb.weight.grad, name="emb", op=ddl.Average)  # doctest: +SKIP
        >>> grad = h()                                                                          # doctest: +SKIP
    """
    if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.sparse_coo:
        got = type(tensor).__name__ if not isinstance(tensor, torch.Tensor) else f"layout {tensor.layout}"
        raise TypeError(f"ddl.torch.sparse_allreduce_async takes a sparse COO tensor, got {got}; "
                        "use allreduce_async for dense tensors")
    rop = as_op(op)
    if rop not in (ReduceOp.SUM, ReduceOp.AVERAGE):
        raise ValueError(f"ddl.torch.sparse_allreduce_async reduces with Sum or Average, got {rop.name}")
    t = tensor.detach().coalesce()
    ps = _ps(process_set)
    indices = t.indices().t().contiguous()
    values = t.values().contiguous()
    h = api.grouped_allgather_async([staged(indices)[0], staged(values)[0]], name=name, process_set=ps)
    size = (process_set.size() if ps is not None else None) or ddl.size()

    def finish(outs: Any) -> torch.Tensor:
        idx, vals = from_numpy(outs[0], indices).t(), from_numpy(outs[1], values)
        if rop is ReduceOp.AVERAGE:
            vals = vals / size
        # Every part is a coalesced tensor of the same shape from some rank: nothing to check.
        return torch.sparse_coo_tensor(idx, vals, t.shape, check_invariants=False).coalesce()

    return TorchHandle(h, finish)
