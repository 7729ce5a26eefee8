"""Synchronous collectives on numpy arrays, bound to one communicator and topology.

The public functions in :mod:`ddl` delegate to one process-wide :class:`Context`; tests
make one per fake rank. Every call first checks that all ranks agree on it
(:mod:`ddl.negotiation`), then moves contiguous bytes.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ddl import algorithms, cost, dtypes
from ddl.calibration import Calibration
from ddl.comm import NATIVE_REDUCE_DTYPES, Comm
from ddl.config import Config
from ddl.executor import run_schedule
from ddl.negotiation import agree
from ddl.ops import ReduceOp, as_op
from ddl.schedule import Schedule, ring_reduce_scatter
from ddl.topology import Topology


@functools.lru_cache(maxsize=1024)
def _compiled(algorithm: str, topology: Topology, count: int) -> Schedule:
    return algorithms.SCHEDULED[algorithm].compile(topology, topology.rank, count)


class Context:
    """Collectives for one rank: ``comm`` + ``topology`` + ``config``."""

    def __init__(
        self, comm: Comm, topology: Topology, config: Config, model: cost.CostModel | None = None,
        *, agree_each_call: bool = True,
    ) -> None:
        self.comm = comm
        self.topology = topology
        self.config = config
        self.model = model or dataclasses.replace(cost.default_model(topology), segment_bytes=config.segment_bytes)
        #: How ``model`` was obtained (set by ``ddl.init``); None for a hand-built context.
        self.calibration: Calibration | None = None
        # Off when the engine runs the calls: it has matched them across ranks already.
        self.agree_each_call = agree_each_call
        algorithms.check_name(config.algorithm)

    def _agree(self, descriptor: tuple[Any, ...]) -> None:
        if self.agree_each_call:
            agree(self.comm, descriptor)

    # -- allreduce -------------------------------------------------------------
    def resolve_algorithm(self, algorithm: str | None, count: int, itemsize: int) -> str:
        """The concrete algorithm for a message (``auto`` priced by the cost model)."""
        name = algorithms.check_name(algorithm or self.config.algorithm)
        if name == "auto":
            name = cost.choose(self.topology, count, itemsize, self.model)
        return name

    def allreduce_flat(
        self, buf: np.ndarray, op: ReduceOp, algorithm: str,
        on_phase: Callable[[tuple[str, float, float]], None] | None = None,
    ) -> None:
        """Allreduce the 1-D contiguous ``buf`` in place with a resolved algorithm."""
        if self.topology.size > 1 and buf.size:
            if algorithm == "mpi":
                start = time.perf_counter()
                self._native(buf, op)
                if on_phase is not None:
                    on_phase(("mpi allreduce", start, time.perf_counter()))
            else:
                seg = max(1, self.config.segment_bytes // buf.itemsize)
                schedule = _compiled(algorithm, self.topology, buf.size)
                run_schedule(self.comm, schedule, buf, op, segment_elems=seg, on_phase=on_phase)
        if op is ReduceOp.AVERAGE and buf.size:
            np.divide(buf, self.topology.size, out=buf)

    def _native(self, buf: np.ndarray, op: ReduceOp) -> None:
        if buf.dtype in NATIVE_REDUCE_DTYPES:
            self.comm.allreduce_native(buf, op)
            return
        # float16/bfloat16: MPI has no portable type; reduce in float32, round once.
        wide = buf.astype(np.float32)
        self.comm.allreduce_native(wide, op)
        buf[...] = wide.astype(buf.dtype)

    def allreduce(
        self, x: Any, *, op: Any = ReduceOp.AVERAGE, name: str | None = None,
        algorithm: str | None = None, inplace: bool = False,
    ) -> np.ndarray:
        """Reduce ``x`` over all ranks; every rank gets the same bits."""
        arr, op = reduction_input(x, op, "allreduce", writable=inplace)
        alg = self.resolve_algorithm(algorithm, arr.size, arr.itemsize)
        self._agree(("allreduce", name, arr.shape, str(arr.dtype), op.name, alg))
        if inplace and arr.flags.c_contiguous:
            self.allreduce_flat(arr.reshape(-1), op, alg)
            return arr
        flat = np.array(arr, copy=True, order="C").reshape(-1)
        self.allreduce_flat(flat, op, alg)
        if inplace:
            arr[...] = flat.reshape(arr.shape)
            return arr
        return flat.reshape(arr.shape)

    def grouped_allreduce(
        self, xs: Sequence[Any], *, op: Any = ReduceOp.AVERAGE, name: str | None = None,
        algorithm: str | None = None,
    ) -> list[np.ndarray]:
        """Allreduce several arrays as one fused buffer per dtype; results in input order."""
        arrs = [as_array(x, "grouped_allreduce") for x in xs]
        op = as_op(op)
        for a in arrs:
            dtypes.check_dtype(a.dtype, what="grouped_allreduce input")
            dtypes.check_op_for_dtype(op, a.dtype)
        by_dtype: dict[np.dtype, list[int]] = {}
        for i, a in enumerate(arrs):
            by_dtype.setdefault(a.dtype, []).append(i)
        plan = []
        for dt, idx in by_dtype.items():
            count = sum(arrs[i].size for i in idx)
            plan.append((dt, idx, self.resolve_algorithm(algorithm, count, dt.itemsize)))
        self._agree(("grouped_allreduce", name, tuple((a.shape, str(a.dtype)) for a in arrs), op.name,
                          tuple(p[2] for p in plan)))
        out: list[np.ndarray] = [np.empty(0)] * len(arrs)
        for dt, idx, alg in plan:
            fused = np.concatenate([arrs[i].reshape(-1) for i in idx]) if idx else np.empty(0, dt)
            self.allreduce_flat(fused, op, alg)
            offset = 0
            for i in idx:
                n = arrs[i].size
                out[i] = fused[offset : offset + n].reshape(arrs[i].shape)
                offset += n
        return out

    # -- gather / scatter / broadcast --------------------------------------------
    def allgather(self, x: Any, *, name: str | None = None) -> np.ndarray:
        """Concatenate every rank's ``x`` along axis 0 (first dims may differ)."""
        arr = as_array(x, "allgather")
        if arr.ndim == 0:
            raise ValueError("allgather needs an array with at least one dimension; wrap a scalar as [x]")
        arr = np.ascontiguousarray(arr)
        dtypes.check_dtype(arr.dtype, what="allgather input")
        self._agree(("allgather", name, arr.shape[1:], str(arr.dtype)))
        rows = [int(r) for r in self.comm.allgather_object(arr.shape[0])] if self.topology.size > 1 else [arr.shape[0]]
        row_bytes = arr.itemsize * int(np.prod(arr.shape[1:], dtype=np.int64))
        out = np.empty((sum(rows), *arr.shape[1:]), dtype=arr.dtype)
        if self.topology.size == 1:
            out[...] = arr
        else:
            self.comm.allgatherv_buffer(arr, out, [r * row_bytes for r in rows])
        return out

    def broadcast(self, x: Any, *, root_rank: int = 0, name: str | None = None, inplace: bool = False) -> np.ndarray:
        """Every rank gets ``root_rank``'s ``x`` (same shape and dtype required everywhere)."""
        arr = as_array(x, "broadcast", writable=inplace)
        self._check_root(root_rank)
        dtypes.check_dtype(arr.dtype, what="broadcast input")
        self._agree(("broadcast", name, arr.shape, str(arr.dtype), root_rank))
        target = arr if inplace and arr.flags.c_contiguous else np.array(arr, copy=True, order="C")
        if self.topology.size > 1 and target.size:
            self.comm.bcast_buffer(target, root_rank)
        if inplace and target is not arr:
            arr[...] = target
            return arr
        return target

    def reducescatter(self, x: Any, *, op: Any = ReduceOp.SUM, name: str | None = None) -> np.ndarray:
        """Reduce ``x`` over ranks and give rank r its slice of axis 0 (first ranks get extra rows)."""
        arr, op = reduction_input(x, op, "reducescatter", needs_axis=True)
        self._agree(("reducescatter", name, arr.shape, str(arr.dtype), op.name))
        p, n = self.topology.size, arr.shape[0]
        rows = [n // p + (1 if r < n % p else 0) for r in range(p)]
        row = int(np.prod(arr.shape[1:], dtype=np.int64))
        starts = np.concatenate([[0], np.cumsum(rows)]).astype(int) * row
        flat = np.array(arr, copy=True, order="C").reshape(-1)
        topo = self.topology
        if p > 1 and flat.size:
            members = [topo.order[i] for i in range(p)]
            chunks = [(int(starts[r]), int(starts[r + 1])) for r in members]
            steps = ring_reduce_scatter(members, topo.rank, chunks, dim=0, phase="reduce-scatter")
            seg = max(1, self.config.segment_bytes // flat.itemsize)
            run_schedule(self.comm, Schedule("ring", topo.rank, flat.size, tuple(steps)), flat, op, segment_elems=seg)
        lo, hi = int(starts[topo.rank]), int(starts[topo.rank + 1])
        mine: np.ndarray = flat[lo:hi].reshape((rows[topo.rank], *arr.shape[1:])).copy()
        if op is ReduceOp.AVERAGE:
            np.divide(mine, p, out=mine)
        return mine

    def broadcast_object(self, obj: Any, *, root_rank: int = 0) -> Any:
        """Every rank gets ``root_rank``'s picklable ``obj``."""
        self._check_root(root_rank)
        self._agree(("broadcast_object", root_rank))
        return obj if self.topology.size == 1 else self.comm.bcast_object(obj, root_rank)

    def allgather_object(self, obj: Any) -> list[Any]:
        """A list of every rank's picklable ``obj``, by rank."""
        self._agree(("allgather_object",))
        return [obj] if self.topology.size == 1 else self.comm.allgather_object(obj)

    def barrier(self) -> None:
        """Return once every rank has called ``barrier``."""
        self._agree(("barrier",))
        if self.topology.size > 1:
            self.comm.barrier()

    def _check_root(self, root_rank: int) -> None:
        if not isinstance(root_rank, (int, np.integer)) or not 0 <= root_rank < self.topology.size:
            raise ValueError(f"root_rank={root_rank!r} is not a rank of this job; use 0..{self.topology.size - 1}")


def reduction_input(
    x: Any, op: Any, what: str, *, writable: bool = False, needs_axis: bool = False
) -> tuple[np.ndarray, ReduceOp]:
    """``x`` as an array and ``op`` as a ReduceOp, after the checks every reduction makes.

    Raises:
        TypeError: not array-like, unsupported dtype, or Average on integers.
        ValueError: unknown op, read-only array for an in-place call, or a scalar
            where an axis to split is needed.
    """
    arr = as_array(x, what, writable=writable)
    if needs_axis and arr.ndim == 0:
        raise ValueError(f"{what} needs an array with at least one dimension to split along axis 0")
    reduce_op = as_op(op)
    dtypes.check_dtype(arr.dtype, what=f"{what} input")
    dtypes.check_op_for_dtype(reduce_op, arr.dtype)
    return arr, reduce_op


def as_array(x: Any, what: str, *, writable: bool = False) -> np.ndarray:
    if writable:
        if not isinstance(x, np.ndarray):
            raise TypeError(f"{what}_ needs a numpy array to write into, got {type(x).__name__}")
        if not x.flags.writeable:
            raise ValueError(f"{what}_ got a read-only array; pass a writable one or use {what}()")
        return x
    try:
        return np.asarray(x)
    except Exception as exc:
        raise TypeError(f"{what} takes a numpy array or array-like, got {type(x).__name__}: {exc}") from None

