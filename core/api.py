"""The public collectives: arguments checked in the caller, work done by the engine."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ddl import algorithms, dtypes
from ddl.compression import as_compressor
from ddl.context import as_array, reduction_input
from ddl.fusion import Request
from ddl.handle import Handle
from ddl.ops import ReduceOp
from ddl.runtime import context, engine


def allreduce_async(
    x: Any, *, op: Any = ReduceOp.AVERAGE, name: str | None = None, algorithm: str | None = None,
    compression: Any = None, inplace: bool = False, _wake: bool = True,
) -> Handle:
    """Start an allreduce; ``wait()`` on the handle returns the result.

    Do not modify ``x`` until the handle is done. Requests from different ranks are
    matched by ``name`` (unnamed ones by submission order), so ranks may submit named
    tensors in different orders.

    Raises:
        TypeError: unsupported dtype, or Average on integers.
        ValueError: unknown algorithm or compression, or ``name`` already in flight.
    """
    eng = engine()
    ctx = eng.ctx
    fast = type(x) is np.ndarray and (not inplace or x.flags.writeable)
    checked = _CHECKED.get((x.dtype, op)) if fast else None
    if checked is None:
        arr, rop = reduction_input(x, op, "allreduce", writable=inplace)
        checked = (rop, str(arr.dtype))
        if isinstance(op, (ReduceOp, str)):  # remember passed checks: the per-tensor path stays short
            _CHECKED[(arr.dtype, op)] = checked
    else:
        arr = x
    rop, dtype_name = checked
    alg = algorithms.check_name(algorithm) if algorithm else ctx.config.algorithm  # the config's: checked at init
    comp = _NONE if compression is None else as_compressor(compression)
    name = name or eng.next_name()
    desc = ("allreduce", name, arr.shape, dtype_name, rop.name, alg, comp.name)
    req = Request("allreduce", name, desc, Handle(name), array=arr, op=rop, algorithm=alg,
                  compression=comp, inplace=inplace)
    # The synchronous calls wait at once and run the cycle themselves: waking the
    # engine thread for them would only contend with the caller.
    return eng.submit(req, wake=_wake)


_NONE = as_compressor(None)
# (dtype, op as passed) -> (ReduceOp, dtype name) for combinations that passed the checks.
_CHECKED: dict[tuple[np.dtype, Any], tuple[ReduceOp, str]] = {}


def synchronize(handle: Handle) -> Any:
    """Wait for ``handle`` and return its result."""
    return handle.wait()


def allreduce(x: Any, *, op: Any = ReduceOp.AVERAGE, name: str | None = None, algorithm: str | None = None,
              compression: Any = None) -> np.ndarray:
    """Reduce ``x`` over all ranks and return the result (same bits on every rank).

    Args:
        x: numpy array (any shape, contiguous or not) of a supported dtype.
        op: ``ddl.Average`` (default), ``Sum``, ``Min``, ``Max`` or ``Product``.
        name: names the tensor, for matching and mismatch reports.
        algorithm: ``auto``, ``mpi``, ``ring``, ``multiring`` or ``halving_doubling``.
        compression: ``ddl.Compression.none`` (default), ``.fp16`` or ``.bf16``.

    Raises:
        TypeError: unsupported dtype, or Average on integers.
        MismatchError: ranks passed different shapes, dtypes, ops for one name.

    Example:
        >>> ddl.allreduce(np.arange(4.0), op=ddl.Sum)  # doctest: +SKIP
    """
    return allreduce_async(x, op=op, name=name, algorithm=algorithm, compression=compression,  # type: ignore[no-any-return]
                           _wake=False).wait()


def allreduce_(x: np.ndarray, *, op: Any = ReduceOp.AVERAGE, name: str | None = None,
               algorithm: str | None = None, compression: Any = None) -> np.ndarray:
    """In-place :func:`allreduce`; returns ``x``."""
    return allreduce_async(x, op=op, name=name, algorithm=algorithm, compression=compression,  # type: ignore[no-any-return]
                           inplace=True, _wake=False).wait()


def grouped_allreduce(xs: Sequence[Any], *, op: Any = ReduceOp.AVERAGE, name: str | None = None,
                      algorithm: str | None = None, compression: Any = None) -> list[np.ndarray]:
    """Allreduce several arrays together (fused by the engine); results in input order."""
    base = name or engine().next_name()
    handles = [allreduce_async(x, op=op, name=f"{base}.{i}", algorithm=algorithm, compression=compression,
                               _wake=False) for i, x in enumerate(xs)]
    return [h.wait() for h in handles]


def _submit(kind: str, name: str | None, desc: tuple[Any, ...], run: Callable[[], Any]) -> Any:
    eng = engine()
    name = name or eng.next_name()
    return eng.submit(Request(kind, name, (kind, name, *desc), Handle(name), run=run), wake=False).wait()


def allgather(x: Any, *, name: str | None = None) -> np.ndarray:
    """Concatenate every rank's ``x`` along axis 0; first dims may differ by rank."""
    ctx = context()
    arr = as_array(x, "allgather")
    if arr.ndim == 0:
        raise ValueError("allgather needs an array with at least one dimension; wrap a scalar as [x]")
    dtypes.check_dtype(arr.dtype, what="allgather input")
    return _submit("allgather", name, (arr.shape[1:], str(arr.dtype)), lambda: ctx.allgather(arr))  # type: ignore[no-any-return]


def broadcast(x: Any, root_rank: int = 0, *, name: str | None = None) -> np.ndarray:
    """Return ``root_rank``'s ``x`` on every rank (shape and dtype must match everywhere)."""
    ctx = context()
    arr = as_array(x, "broadcast")
    _check(ctx, arr, root_rank, "broadcast")
    return _submit("broadcast", name, (arr.shape, str(arr.dtype), root_rank),  # type: ignore[no-any-return]
                   lambda: ctx.broadcast(arr, root_rank=root_rank))


def broadcast_(x: np.ndarray, root_rank: int = 0, *, name: str | None = None) -> np.ndarray:
    """Overwrite ``x`` with ``root_rank``'s ``x``; returns ``x``."""
    ctx = context()
    arr = as_array(x, "broadcast", writable=True)
    _check(ctx, arr, root_rank, "broadcast")
    return _submit("broadcast", name, (arr.shape, str(arr.dtype), root_rank),  # type: ignore[no-any-return]
                   lambda: ctx.broadcast(arr, root_rank=root_rank, inplace=True))


def reducescatter(x: Any, *, op: Any = ReduceOp.SUM, name: str | None = None) -> np.ndarray:
    """Reduce ``x`` and return this rank's slice of axis 0 (the first ranks get extra rows)."""
    ctx = context()
    arr, op = reduction_input(x, op, "reducescatter", needs_axis=True)
    return _submit("reducescatter", name, (arr.shape, str(arr.dtype), op.name),  # type: ignore[no-any-return]
                   lambda: ctx.reducescatter(arr, op=op))


def broadcast_object(obj: Any, root_rank: int = 0, *, name: str | None = None) -> Any:
    """Return ``root_rank``'s picklable ``obj`` on every rank."""
    ctx = context()
    ctx._check_root(root_rank)
    return _submit("broadcast_object", name, (root_rank,), lambda: ctx.broadcast_object(obj, root_rank=root_rank))


def allgather_object(obj: Any, *, name: str | None = None) -> list[Any]:
    """Return every rank's picklable ``obj``, in rank order."""
    ctx = context()
    return _submit("allgather_object", name, (), lambda: ctx.allgather_object(obj))  # type: ignore[no-any-return]


def barrier() -> None:
    """Block until every rank has reached the barrier."""
    ctx = context()
    _submit("barrier", None, (), ctx.barrier)


def _check(ctx: Any, arr: np.ndarray, root_rank: int, what: str) -> None:
    ctx._check_root(root_rank)
    dtypes.check_dtype(arr.dtype, what=f"{what} input")

