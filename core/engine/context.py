"""The data movement of each collective on numpy arrays, for one communicator and topology.

The engine calls these after the ranks have agreed on the call (names, shapes, dtypes,
ops matched in :mod:`ddl.engine.negotiation`), with inputs already checked by
:mod:`ddl.engine.collectives`; they only move contiguous bytes.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable

import numpy as np

from ddl.base import dtypes
from ddl.base.config import Config
from ddl.base.ops import ReduceOp
from ddl.base.topology import Topology
from ddl.reduction import adasum, algorithms, cost
from ddl.reduction.calibration import Calibration
from ddl.reduction.executor import run_schedule
from ddl.reduction.scattered import Source, fill
from ddl.reduction.schedule import Schedule
from ddl.reduction.segments import segment_schedule, sole_owner
from ddl.reduction.trials import Key, Trials
from ddl.wire.comm import Comm


@functools.lru_cache(maxsize=1024)
def _compiled(algorithm: str, topology: Topology, count: int) -> Schedule:
    return algorithms.SCHEDULED[algorithm].compile(topology, topology.rank, count)


@functools.lru_cache(maxsize=256)
def _reduce_scatter(topology: Topology, bounds: tuple[int, ...]) -> Schedule:
    return algorithms.REDUCE_SCATTER.compile_reduce_scatter(topology, topology.rank, bounds)


class Context:
    """Collectives for one rank: ``comm`` + ``topology`` + ``config``."""

    def __init__(
        self, comm: Comm, topology: Topology, config: Config, model: cost.CostModel | None = None,
    ) -> None:
        self.comm = comm
        self.topology = topology
        self.config = config
        self.model = model or dataclasses.replace(cost.default_model(topology), segment_bytes=config.segment_bytes,
                                                  shm_bytes=config.shm_bytes)
        #: How ``model`` was obtained (set by ``ddl.init``); None for a hand-built context.
        self.calibration: Calibration | None = None
        #: Each rank's host name, and its rank in the world (a process set's context), for
        #: messages; set by ``ddl.init`` and the process sets (empty: unknown).
        self.hostnames: tuple[str, ...] = ()
        self.world_ranks: tuple[int, ...] = ()
        #: auto's choices re-checked from timed runs (:mod:`ddl.reduction.trials`); None: off
        #: (set by ``ddl.init`` for the world's context).
        self.trials: Trials | None = None
        algorithms.check_for(config.algorithm, topology)

    def describe_rank(self, q: int) -> str:
        """``"rank 3 (host h2)"`` for this communicator's rank ``q`` (world numbering)."""
        world = self.world_ranks[q] if q < len(self.world_ranks) else q
        host = f" (host {self.hostnames[q]})" if q < len(self.hostnames) else ""
        return f"rank {world}{host}"

    # -- allreduce -------------------------------------------------------------
    def resolve_algorithm(self, algorithm: str | None, count: int, itemsize: int) -> str:
        """The concrete algorithm for a message (``auto`` priced by the cost model)."""
        name = algorithms.check_name(algorithm or self.config.algorithm)  # applicability: checked at submission
        if name == "auto":
            name = cost.choose(self.topology, count, itemsize, self.model)
        return name

    def algorithm_for_run(self, algorithm: str | None, count: int, itemsize: int) -> tuple[str, Key | None]:
        """:meth:`resolve_algorithm` for a bucket about to run, through auto's trials where
        they are on: the algorithm, and the trial key to report its time to (None: none)."""
        name = algorithms.check_name(algorithm or self.config.algorithm)
        if name != "auto":
            return name, None
        if self.trials is None or self.topology.size == 1 or count == 0:
            return cost.choose(self.topology, count, itemsize, self.model), None
        key = (cost.size_class(count * itemsize), itemsize)
        return self.trials.pick(key, lambda: cost.ranked_class(self.topology, key[0], itemsize, self.model)), key

    def allreduce_flat(
        self, buf: np.ndarray, op: ReduceOp, algorithm: str,
        on_phase: Callable[[tuple[str, float, float]], None] | None = None, divisor: int = 0,
        src: Source | None = None,
    ) -> None:
        """Allreduce the 1-D contiguous ``buf`` in place with a resolved algorithm
        (``divisor``: what Average divides by, 0 for the world size). ``src``: the input
        where it is not ``buf`` (whose contents then do not matter): a schedule that can read it
        in its first step does (:func:`~ddl.reduction.executor.run_schedule`: ``shm``), saving
        a memory pass of the whole buffer; the rest start from a copy in ``buf``. It may be
        a bucket's tensors as they lie (:class:`~ddl.reduction.scattered.Scattered`)."""
        if src is not None and (algorithm == "mpi" or self.topology.size == 1 or not buf.size):
            fill(buf, src)
            src = None
        if self.topology.size > 1 and buf.size:
            if algorithm == "mpi":
                start = time.perf_counter()
                self.comm.allreduce_native(buf, op)  # half types travel as themselves
                if on_phase is not None:
                    on_phase(("mpi allreduce", start, time.perf_counter()))
            else:
                seg = max(1, self.config.segment_bytes // buf.itemsize)
                schedule = _compiled(algorithm, self.topology, buf.size)
                run_schedule(self.comm, schedule, buf, op, segment_elems=seg, shm_bytes=self.config.shm_bytes,
                             on_phase=on_phase, src=src)
        if op is ReduceOp.AVERAGE and buf.size:
            dtypes.divide(buf, divisor or self.topology.size)

    # -- gather / scatter / broadcast --------------------------------------------
    def allgather(self, arr: np.ndarray) -> np.ndarray:
        """Concatenate every rank's ``arr`` along axis 0 (first dims may differ)."""
        arr = np.ascontiguousarray(arr)
        rows = [int(r) for r in self.comm.allgather_object(arr.shape[0])] if self.topology.size > 1 else [arr.shape[0]]
        row_bytes = arr.itemsize * int(np.prod(arr.shape[1:], dtype=np.int64))
        out = np.empty((sum(rows), *arr.shape[1:]), dtype=arr.dtype)
        if self.topology.size == 1:
            out[...] = arr
        else:
            self.comm.allgatherv_buffer(arr, out, [r * row_bytes for r in rows])
        return out

    def broadcast(self, arr: np.ndarray, *, root_rank: int = 0, inplace: bool = False) -> np.ndarray:
        """Every rank gets ``root_rank``'s ``arr`` (same shape and dtype everywhere)."""
        target = arr if inplace and arr.flags.c_contiguous else np.array(arr, copy=True, order="C")
        if self.topology.size > 1 and target.size:
            self.comm.bcast_buffer(target, root_rank)
        if inplace and target is not arr:
            arr[...] = target
            return arr
        return target

    def reducescatter(self, arr: np.ndarray, *, op: ReduceOp, postscale: float = 1.0,
                      out_dtype: np.dtype | None = None) -> np.ndarray:
        """Reduce ``arr`` over ranks and give rank r its rows of axis 0 (first ranks get
        extra rows), multiplied by ``postscale``, as ``out_dtype`` (default ``arr``'s).

        Half types accumulate in float32 as allreduce does, and the postscale is applied
        there too, before the one rounding to the output type (Horovod scales halves in
        float32; scaling after the cast would round twice)."""
        p, n = self.topology.size, arr.shape[0]
        rows = [n // p + (1 if r < n % p else 0) for r in range(p)]
        row = int(np.prod(arr.shape[1:], dtype=np.int64))
        bounds = tuple(int(b) * row for b in np.concatenate([[0], np.cumsum(rows)]))
        flat = np.array(arr, dtype=dtypes.accumulator(arr.dtype), copy=True, order="C").reshape(-1)
        if p > 1 and flat.size:
            seg = max(1, self.config.segment_bytes // flat.itemsize)
            schedule = _reduce_scatter(self.topology, bounds)
            run_schedule(self.comm, schedule, flat, op, segment_elems=seg)
        lo, hi = bounds[self.topology.rank], bounds[self.topology.rank + 1]
        mine: np.ndarray = flat[lo:hi].reshape((rows[self.topology.rank], *arr.shape[1:]))
        if op is ReduceOp.AVERAGE:
            dtypes.divide(mine, p)
        dtypes.scale(mine, postscale)
        return mine.astype(arr.dtype if out_dtype is None else out_dtype)  # a copy: the rest of the buffer can go

    def reduce_segments(self, buf: np.ndarray, bounds: tuple[int, ...], *, op: ReduceOp) -> None:
        """Reduce the 1-D contiguous ``buf`` over ranks so that this rank's segment
        ``buf[bounds[rank]:bounds[rank + 1]]`` holds the result (Average: divided by the
        world size); the rest of ``buf`` is left as scratch. Same bits on every rank for
        every segment (each is summed once, in one order)."""
        p, me = self.topology.size, self.topology.rank
        if p > 1 and buf.size:
            seg = max(1, self.config.segment_bytes // buf.itemsize)
            run_schedule(self.comm, segment_schedule(self.topology, me, bounds, reduce=True), buf, op,
                         segment_elems=seg, shm_bytes=self.config.shm_bytes)
        if op is ReduceOp.AVERAGE:
            dtypes.divide(buf[bounds[me] : bounds[me + 1]], p)

    def allgather_segments(self, buf: np.ndarray, bounds: tuple[int, ...]) -> None:
        """Fill every rank's segment of the 1-D contiguous ``buf`` with that rank's, in place
        (a broadcast when one rank's segment holds everything)."""
        if self.topology.size == 1 or not buf.size:
            return
        root = sole_owner(bounds)
        if root is not None:
            self.comm.bcast_buffer(buf, root)
            return
        seg = max(1, self.config.segment_bytes // buf.itemsize)
        run_schedule(self.comm, segment_schedule(self.topology, self.topology.rank, bounds, reduce=False), buf,
                     ReduceOp.SUM, segment_elems=seg, shm_bytes=self.config.shm_bytes)

    def alltoall(self, arr: np.ndarray, splits: list[int]) -> tuple[np.ndarray, list[int]]:
        """Send rows ``splits[r]`` of ``arr`` (consecutive, axis 0) to rank r; return the
        rows received, in rank order, and how many came from each rank."""
        arr = np.ascontiguousarray(arr)
        p = self.topology.size
        row = arr.itemsize * int(np.prod(arr.shape[1:], dtype=np.int64))
        if p == 1:
            return arr.copy(), list(splits)
        everyone_splits = self.comm.allgather_object([int(n) for n in splits])
        mine = [int(theirs[self.topology.rank]) for theirs in everyone_splits]
        out = np.empty((sum(mine), *arr.shape[1:]), dtype=arr.dtype)
        self.comm.alltoallv_buffer(arr, [n * row for n in splits], out, [n * row for n in mine])
        return out, mine

    def adasum(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """Horovod's Adasum of each array over the ranks (every rank gets the same bits):
        the arrays travel once, gathered, and each is combined by the same pairwise tree."""
        p = self.topology.size
        if p == 1:
            return [np.array(a, copy=True) for a in arrays]
        flat = np.concatenate([np.ascontiguousarray(a).reshape(-1) for a in arrays]) if arrays else np.zeros(0)
        everyone = np.empty((p, flat.size), flat.dtype)
        self.comm.allgather_buffer(flat.view(np.uint8), everyone.reshape(-1).view(np.uint8))
        out, offset = [], 0
        for a in arrays:
            parts = [everyone[q, offset : offset + a.size] for q in range(p)]
            out.append(adasum.combine(parts).reshape(a.shape))
            offset += a.size
        return out

    def broadcast_bytes(self, data: bytes | None, *, root_rank: int = 0) -> bytes:
        """Every rank gets ``root_rank``'s ``data`` (already pickled by the caller)."""
        return data if self.topology.size == 1 else self.comm.bcast_object(data, root_rank)  # type: ignore[return-value]

    def allgather_bytes(self, data: bytes) -> list[bytes]:
        """Every rank's ``data``, by rank."""
        return [data] if self.topology.size == 1 else self.comm.allgather_object(data)

    def barrier(self) -> None:
        """Return once every rank has called ``barrier``."""
        if self.topology.size > 1:
            self.comm.barrier()
