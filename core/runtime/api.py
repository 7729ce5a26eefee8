"""The public collectives: ``ddl.allreduce`` and friends on the process-wide runtime.

Each function delegates to :class:`~ddl.engine.collectives.Collectives` bound to the engine
that ``ddl.init()`` started; see that module for how refused arguments are agreed on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ddl.base.ops import ReduceOp
from ddl.engine.handle import GroupHandle, Handle
from ddl.runtime.lifecycle import collectives


def allreduce_async(
    x: Any, *, op: Any = ReduceOp.AVERAGE, name: str | None = None, algorithm: str | None = None,
    compression: Any = None, inplace: bool = False,
) -> Handle:
    """Start an allreduce; ``wait()`` on the handle returns the result.

    Do not modify ``x`` until the handle is done. Requests from different ranks are
    matched by ``name`` (unnamed ones by their order within the submitting thread), so
    ranks may submit named tensors in different orders.

    Raises:
        TypeError: unsupported dtype, or Average on integers (on the other ranks the
            same call raises :class:`ddl.RemoteError`).
        ValueError: unknown algorithm or compression, or ``name`` already in flight.
    """
    return collectives().allreduce_async(x, op=op, name=name, algorithm=algorithm, compression=compression,
                                         inplace=inplace)


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
        RemoteError: another rank refused its arguments for this call.

    Example:
        >>> ddl.allreduce(np.arange(4.0), op=ddl.Sum)  # doctest: +SKIP
    """
    return collectives().allreduce(x, op=op, name=name, algorithm=algorithm, compression=compression)


def allreduce_(x: np.ndarray, *, op: Any = ReduceOp.AVERAGE, name: str | None = None,
               algorithm: str | None = None, compression: Any = None) -> np.ndarray:
    """In-place :func:`allreduce`; returns ``x``."""
    return collectives().allreduce_(x, op=op, name=name, algorithm=algorithm, compression=compression)


def grouped_allreduce(xs: Sequence[Any], *, op: Any = ReduceOp.AVERAGE, name: str | None = None,
                      algorithm: str | None = None, compression: Any = None) -> list[np.ndarray]:
    """Allreduce several arrays together (one request, see :func:`grouped_allreduce_async`);
    results in input order."""
    return collectives().grouped_allreduce(xs, op=op, name=name, algorithm=algorithm, compression=compression)


def grouped_allreduce_async(xs: Sequence[Any], *, op: Any = ReduceOp.AVERAGE, name: str | None = None,
                            algorithm: str | None = None, compression: Any = None) -> GroupHandle:
    """Start an allreduce of several arrays as one request; ``wait()`` returns the list.

    The arrays are copied at the call into one flat buffer per dtype (so they may be
    changed at once), which the engine reduces as one bucket: many small tensors cost
    one submission, not one each. Ranks must group the same shapes in the same order.

    Raises:
        TypeError / ValueError: as :func:`allreduce_async`, or ``xs`` is not a list.

    Example:
        >>> h = ddl.grouped_allreduce_async([w_grad, b_grad])  # doctest: +SKIP
        >>> w_avg, b_avg = h.wait()                             # doctest: +SKIP
    """
    return collectives().grouped_allreduce_async(xs, op=op, name=name, algorithm=algorithm,
                                                 compression=compression)


def allgather(x: Any, *, name: str | None = None) -> np.ndarray:
    """Concatenate every rank's ``x`` along axis 0; first dims may differ by rank."""
    return collectives().allgather(x, name=name)


def broadcast(x: Any, root_rank: int = 0, *, name: str | None = None) -> np.ndarray:
    """Return ``root_rank``'s ``x`` on every rank (shape and dtype must match everywhere)."""
    return collectives().broadcast(x, root_rank, name=name)


def broadcast_(x: np.ndarray, root_rank: int = 0, *, name: str | None = None) -> np.ndarray:
    """Overwrite ``x`` with ``root_rank``'s ``x``; returns ``x``."""
    return collectives().broadcast_(x, root_rank, name=name)


def reducescatter(x: Any, *, op: Any = ReduceOp.SUM, name: str | None = None) -> np.ndarray:
    """Reduce ``x`` and return this rank's slice of axis 0 (the first ranks get extra rows)."""
    return collectives().reducescatter(x, op=op, name=name)


def broadcast_object(obj: Any, root_rank: int = 0, *, name: str | None = None) -> Any:
    """Return ``root_rank``'s picklable ``obj`` on every rank."""
    return collectives().broadcast_object(obj, root_rank, name=name)


def allgather_object(obj: Any, *, name: str | None = None) -> list[Any]:
    """Return every rank's picklable ``obj``, in rank order."""
    return collectives().allgather_object(obj, name=name)


def barrier() -> None:
    """Block until every rank has reached the barrier."""
    collectives().barrier()
