"""The public collectives: ``ddl.allreduce`` and friends on the process-wide runtime.

Each function delegates to :class:`~ddl.engine.collectives.Collectives` bound to the engine
that ``ddl.init()`` started; see that module for how refused arguments are agreed on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ddl.base.ops import ReduceOp
from ddl.engine.collectives import Collectives
from ddl.engine.handle import Handle
from ddl.runtime import lifecycle
from ddl.runtime.process_sets import ProcessSet, collectives_for, set_rank_of


def collectives(process_set: ProcessSet | None = None) -> Collectives:
    """The collectives of ``process_set`` (the world's by default)."""
    return lifecycle.collectives() if process_set is None else collectives_for(process_set)


def allreduce_async(
    x: Any, *, op: Any = ReduceOp.AVERAGE, name: str | None = None, algorithm: str | None = None,
    compression: Any = None, inplace: bool = False, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
    process_set: ProcessSet | None = None,
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
    c = collectives(process_set)
    if name and algorithm is None and compression is None and prescale_factor == 1.0 and postscale_factor == 1.0:
        again = c.resubmit(x, op, name, inplace)  # the per-tensor, per-step case: no keyword relay
        if again is not None:
            return again
    return c.allreduce_async(x, op=op, name=name, algorithm=algorithm,
                             compression=compression, inplace=inplace, prescale=prescale_factor,
                             postscale=postscale_factor)


def synchronize(handle: Handle) -> Any:
    """Wait for ``handle`` and return its result."""
    return handle.wait()


def poll(handle: Handle) -> bool:
    """True once ``handle``'s collective has finished (``synchronize`` then returns at once)."""
    return handle.done()


def allreduce(x: Any, *, op: Any = ReduceOp.AVERAGE, name: str | None = None, algorithm: str | None = None,
              compression: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet | None = None) -> np.ndarray:
    """Reduce ``x`` over all ranks and return the result (same bits on every rank).

    Args:
        x: numpy array (any shape, contiguous or not) of a supported dtype.
        op: ``ddl.Average`` (default), ``Sum``, ``Min``, ``Max``, ``Product`` or ``Adasum``.
        name: names the tensor, for matching and mismatch reports.
        algorithm: ``auto``, ``mpi``, ``ring``, ``multiring`` or ``halving_doubling``.
        compression: ``ddl.Compression.none`` (default), ``.fp16`` or ``.bf16``.
        prescale_factor, postscale_factor: multiply each rank's input before the sum, and
            the result after it (Horovod's; integers truncate toward zero).
        process_set: reduce over this :class:`ddl.ProcessSet` only.

    Raises:
        TypeError: unsupported dtype, or Average on integers.
        MismatchError: ranks passed different shapes, dtypes, ops for one name.
        RemoteError: another rank refused its arguments for this call.

    Example:
        >>> ddl.allreduce(np.arange(4.0), op=ddl.Sum)  # doctest: +SKIP
    """
    if process_set is None and algorithm is None and compression is None and prescale_factor == 1.0 \
            and postscale_factor == 1.0:
        return lifecycle.collectives().plain_allreduce(x, op, name, False)
    return collectives(process_set).allreduce(x, op=op, name=name, algorithm=algorithm, compression=compression,
                                              prescale=prescale_factor, postscale=postscale_factor)


def allreduce_(x: np.ndarray, *, op: Any = ReduceOp.AVERAGE, name: str | None = None,
               algorithm: str | None = None, compression: Any = None, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0, process_set: ProcessSet | None = None) -> np.ndarray:
    """In-place :func:`allreduce`; returns ``x``."""
    if process_set is None and algorithm is None and compression is None and prescale_factor == 1.0 \
            and postscale_factor == 1.0:
        return lifecycle.collectives().plain_allreduce(x, op, name, True)
    return collectives(process_set).allreduce_(x, op=op, name=name, algorithm=algorithm, compression=compression,
                                               prescale=prescale_factor, postscale=postscale_factor)


def grouped_allreduce(xs: Sequence[Any], *, op: Any = ReduceOp.AVERAGE, name: str | None = None,
                      algorithm: str | None = None, compression: Any = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, process_set: ProcessSet | None = None) -> list[np.ndarray]:
    """Allreduce several arrays together (one request, see :func:`grouped_allreduce_async`);
    results in input order."""
    return collectives(process_set).grouped_allreduce(xs, op=op, name=name, algorithm=algorithm,
                                                      compression=compression, prescale=prescale_factor,
                                                      postscale=postscale_factor)


def grouped_allreduce_async(xs: Sequence[Any], *, op: Any = ReduceOp.AVERAGE, name: str | None = None,
                            algorithm: str | None = None, compression: Any = None, prescale_factor: float = 1.0,
                            postscale_factor: float = 1.0, process_set: ProcessSet | None = None) -> Handle:
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
    return collectives(process_set).grouped_allreduce_async(xs, op=op, name=name, algorithm=algorithm,
                                                            compression=compression, prescale=prescale_factor,
                                                            postscale=postscale_factor)


def allgather(x: Any, *, name: str | None = None, process_set: ProcessSet | None = None) -> np.ndarray:
    """Concatenate every rank's ``x`` along axis 0; first dims may differ by rank."""
    return collectives(process_set).allgather(x, name=name)


def allgather_async(x: Any, *, name: str | None = None, process_set: ProcessSet | None = None) -> Handle:
    """Start an :func:`allgather`; ``wait()`` returns the concatenation."""
    return collectives(process_set).allgather_async(x, name=name)


def grouped_allgather_async(xs: Sequence[Any], *, name: str | None = None,
                            process_set: ProcessSet | None = None) -> Handle:
    """Start an allgather of each array, as one request; ``wait()`` returns the list."""
    return collectives(process_set).grouped_allgather_async(xs, name=name)


def grouped_allgather(xs: Sequence[Any], *, name: str | None = None,
                      process_set: ProcessSet | None = None) -> list[np.ndarray]:
    """Allgather each array (one request); results in input order."""
    return grouped_allgather_async(xs, name=name, process_set=process_set).wait()  # type: ignore[no-any-return]


def broadcast(x: Any, root_rank: int = 0, *, name: str | None = None,
              process_set: ProcessSet | None = None) -> np.ndarray:
    """Return ``root_rank``'s ``x`` on every rank (shape and dtype must match everywhere).

    ``root_rank`` is a rank of the world, also with a ``process_set`` (as in Horovod)."""
    return broadcast_async(x, root_rank, name=name, process_set=process_set).wait()  # type: ignore[no-any-return]


def broadcast_(x: np.ndarray, root_rank: int = 0, *, name: str | None = None,
               process_set: ProcessSet | None = None) -> np.ndarray:
    """Overwrite ``x`` with ``root_rank``'s ``x``; returns ``x``."""
    return broadcast_async(x, root_rank, name=name, process_set=process_set,  # type: ignore[no-any-return]
                           inplace=True).wait()


def broadcast_async(x: Any, root_rank: int = 0, *, name: str | None = None, process_set: ProcessSet | None = None,
                    inplace: bool = False) -> Handle:
    """Start a :func:`broadcast` (``inplace``: into ``x``); ``wait()`` returns the result."""
    c = collectives(process_set)
    return c.broadcast_async(x, _root(process_set, root_rank), name=name, inplace=inplace)


def reducescatter(x: Any, *, op: Any = ReduceOp.SUM, name: str | None = None, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0, process_set: ProcessSet | None = None) -> np.ndarray:
    """Reduce ``x`` and return this rank's slice of axis 0 (the first ranks get extra rows).

    ``postscale_factor`` multiplies the result before it is rounded to ``x``'s dtype (half
    types in float32, as Horovod does).

    Raises:
        NotImplementedError: ``op`` is ``ddl.Adasum`` (Horovod refuses it too).
    """
    return collectives(process_set).reducescatter(x, op=op, name=name, prescale=prescale_factor,
                                                  postscale=postscale_factor)


def reducescatter_async(x: Any, *, op: Any = ReduceOp.SUM, name: str | None = None, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0, process_set: ProcessSet | None = None) -> Handle:
    """Start a :func:`reducescatter`; ``wait()`` returns this rank's rows."""
    return collectives(process_set).reducescatter_async(x, op=op, name=name, prescale=prescale_factor,
                                                        postscale=postscale_factor)


def grouped_reducescatter_async(xs: Sequence[Any], *, op: Any = ReduceOp.SUM, name: str | None = None,
                                prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                                process_set: ProcessSet | None = None) -> Handle:
    """Start a reduce-scatter of each array, as one request; ``wait()`` returns the list."""
    return collectives(process_set).grouped_reducescatter_async(xs, op=op, name=name, prescale=prescale_factor,
                                                                postscale=postscale_factor)


def grouped_reducescatter(xs: Sequence[Any], *, op: Any = ReduceOp.SUM, name: str | None = None,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                          process_set: ProcessSet | None = None) -> list[np.ndarray]:
    """Reduce-scatter each array (one request); results in input order."""
    return grouped_reducescatter_async(xs, op=op, name=name, prescale_factor=prescale_factor,  # type: ignore[no-any-return]
                                       postscale_factor=postscale_factor, process_set=process_set).wait()


def reduce_segments_async(buf: np.ndarray, bounds: Sequence[int], *, op: Any = ReduceOp.AVERAGE,
                          name: str | None = None) -> Handle:
    """Start a reduce-scatter of ``buf`` over uneven owner segments, in place.

    Rank r's segment is ``buf[bounds[r]:bounds[r + 1]]``; when the handle is done this
    rank's segment holds the sum (``ddl.Average``: the mean) over all ranks, and the rest
    of ``buf`` is scratch. A sharded optimizer's gradient exchange
    (:mod:`ddl.reduction.segments`).

    Raises:
        ValueError: ``buf`` is not a writable 1-D contiguous array, ``bounds`` do not cut
            it into one segment per rank, or ``op`` is neither Sum nor Average (the other
            ranks get a RemoteError).
        MismatchError: ranks passed other sizes, dtypes or bounds under one name.

    Example:
        >>> h = ddl.runtime.api.reduce_segments_async(buf, (0, 10, 16), name="b0")  # doctest: +SKIP
        >>> h.wait(); mine = buf[(0, 10, 16)[ddl.rank()]:(0, 10, 16)[ddl.rank() + 1]]  # doctest: +SKIP
    """
    return lifecycle.collectives().reduce_segments_async(buf, bounds, op=op, name=name)


def allgather_segments_async(buf: np.ndarray, bounds: Sequence[int], *, name: str | None = None) -> Handle:
    """Start an allgather of uneven owner segments of ``buf``, in place: when the handle is
    done every rank's ``buf`` holds every rank's segment (the inverse of
    :func:`reduce_segments_async`; a sharded optimizer's parameter exchange).

    Raises:
        ValueError: as :func:`reduce_segments_async`.

    Example:
        >>> ddl.runtime.api.allgather_segments_async(buf, (0, 10, 16), name="p0").wait()  # doctest: +SKIP
    """
    return lifecycle.collectives().allgather_segments_async(buf, bounds, name=name)


def alltoall_async(x: Any, splits: Sequence[int] | None = None, *, name: str | None = None,
                   process_set: ProcessSet | None = None) -> Handle:
    """Start an :func:`alltoall`; ``wait()`` returns (rows received, counts per rank)."""
    return collectives(process_set).alltoall_async(x, splits, name=name)


def alltoall(x: Any, splits: Sequence[int] | None = None, *, name: str | None = None,
             process_set: ProcessSet | None = None) -> tuple[np.ndarray, list[int]]:
    """Send rows ``splits[r]`` of ``x`` (consecutive, axis 0; equal parts when None) to rank r.

    Returns:
        The rows received from every rank, in rank order, and how many came from each.
    """
    return alltoall_async(x, splits, name=name, process_set=process_set).wait()  # type: ignore[no-any-return]


def join() -> int:
    """Declare that this rank has run out of data; return once every rank has joined.

    Until then the others' allreduces go on, this rank contributing zeros (an Average
    divides by the ranks that contributed). Returns the last rank to join.
    """
    return lifecycle.collectives().join()


def broadcast_object(obj: Any, root_rank: int = 0, *, name: str | None = None,
                     process_set: ProcessSet | None = None) -> Any:
    """Return ``root_rank``'s picklable ``obj`` on every rank."""
    return collectives(process_set).broadcast_object(obj, _root(process_set, root_rank), name=name)


def allgather_object(obj: Any, *, name: str | None = None, process_set: ProcessSet | None = None) -> list[Any]:
    """Return every rank's picklable ``obj``, in rank order."""
    return collectives(process_set).allgather_object(obj, name=name)


def barrier(process_set: ProcessSet | None = None) -> None:
    """Block until every rank (of ``process_set``) has reached the barrier."""
    collectives(process_set).barrier()


def _root(process_set: ProcessSet | None, root_rank: int) -> int:
    if process_set is None or process_set.process_set_id == 0 or not isinstance(root_rank, int):
        return root_rank
    return set_rank_of(process_set, root_rank)
