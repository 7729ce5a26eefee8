"""The collectives bound to one engine: arguments checked in the caller, refusals agreed.

A call whose arguments this rank refuses (an unsupported dtype, a bad root) must not
leave the other ranks waiting for it: the refusal is submitted in the call's place,
under the call's name, and the negotiation ends that collective on every rank — this
rank raises its own error, the others a :class:`~ddl.base.errors.RemoteError` naming it.
``ddl``'s module-level functions use the process-wide instance; tests make one per
fake rank.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import numpy as np

from ddl.base import dtypes
from ddl.base.ops import ReduceOp, as_op
from ddl.base.topology import Topology
from ddl.engine.compression import Compression, as_compressor
from ddl.engine.engine import Engine
from ddl.engine.fusion import Request
from ddl.engine.handle import GroupHandle, Handle
from ddl.engine.negotiation import Descriptor, error_descriptor
from ddl.reduction import algorithms


class Collectives:
    """Every public collective, on one :class:`~ddl.engine.engine.Engine`."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.ctx = engine.ctx
        # (dtype, op as passed) -> (ReduceOp, dtype name) for combinations that passed the
        # checks: later calls of a training step skip them. Per instance, like the engine.
        self._checked: dict[tuple[np.dtype, Any], tuple[ReduceOp, str]] = {}
        self._runnable: set[str] = set()  # algorithm names that passed the checks on this topology

    @property
    def topology(self) -> Topology:
        return self.ctx.topology

    # -- allreduce -------------------------------------------------------------------
    def allreduce_async(
        self, x: Any, *, op: Any = ReduceOp.AVERAGE, name: str | None = None, algorithm: str | None = None,
        compression: Any = None, inplace: bool = False, wake: bool = True,
    ) -> Handle:
        """Start an allreduce; see :func:`ddl.allreduce_async`.

        ``wake=False``: the caller waits at once (and so runs the cycle itself).
        """
        req = self._allreduce_request(x, op, name, algorithm, compression, inplace)
        # The synchronous calls wait at once and run the cycle themselves: waking the
        # engine thread for them would only contend with the caller.
        return self.engine.submit(req, wake=wake)

    def allreduce(self, x: Any, *, op: Any = ReduceOp.AVERAGE, name: str | None = None,
                  algorithm: str | None = None, compression: Any = None) -> np.ndarray:
        """See :func:`ddl.allreduce`."""
        return self._allreduce_now(self._allreduce_request(x, op, name, algorithm, compression, False))

    def allreduce_(self, x: np.ndarray, *, op: Any = ReduceOp.AVERAGE, name: str | None = None,
                   algorithm: str | None = None, compression: Any = None) -> np.ndarray:
        """See :func:`ddl.allreduce_`."""
        return self._allreduce_now(self._allreduce_request(x, op, name, algorithm, compression, True))

    def _allreduce_now(self, req: Request) -> np.ndarray:
        """A synchronous allreduce: the engine's lean path when it is free, else the queue."""
        if not self.engine.run_alone(req):
            self.engine.submit(req, wake=False)
        return req.handle.wait()  # type: ignore[no-any-return]

    def _allreduce_request(self, x: Any, op: Any, name: str | None, algorithm: str | None, compression: Any,
                           inplace: bool) -> Request:
        """The checked request for one allreduce (a refusal is agreed on, then raised)."""
        eng = self.engine
        name = name or eng.names.next()
        try:
            fast = type(x) is np.ndarray and (not inplace or x.flags.writeable)
            checked = self._checked.get((x.dtype, op)) if fast else None
            if checked is None:
                arr, rop = reduction_input(x, op, "allreduce", writable=inplace)
                checked = (rop, str(arr.dtype))
                if isinstance(op, (ReduceOp, str)):  # remember passed checks: the per-tensor path stays short
                    self._checked[(arr.dtype, op)] = checked
            else:
                arr = x
            if algorithm is None:
                alg = self.ctx.config.algorithm
            elif algorithm in self._runnable:
                alg = algorithm
            else:
                alg = algorithms.check_for(algorithm, self.topology)
                self._runnable.add(alg)
            comp = Compression.none if compression is None else as_compressor(compression)
        except (TypeError, ValueError) as exc:
            self._refuse("allreduce", name, exc)
        rop, dtype_name = checked
        desc = Descriptor("allreduce", name, (arr.shape, dtype_name, rop.name), alg, comp.name)
        return Request("allreduce", name, desc, Handle(name), array=arr, op=rop, algorithm=alg,
                       compression=comp, inplace=inplace)

    def grouped_allreduce_async(self, xs: Sequence[Any], *, op: Any = ReduceOp.AVERAGE, name: str | None = None,
                                algorithm: str | None = None, compression: Any = None,
                                wake: bool = True) -> GroupHandle:
        """Start one allreduce of several arrays; see :func:`ddl.grouped_allreduce_async`.

        The arrays of each dtype are copied once into one flat private buffer, submitted
        as one request (its descriptor lists every shape, so ranks that group differently
        get a MismatchError), and reduced where they lie: a bucket the caller built costs
        one submission, not one per tensor.
        """
        eng = self.engine
        base = name or eng.names.next()
        try:
            if isinstance(xs, (np.ndarray, str, bytes)) or not isinstance(xs, Sequence):
                raise TypeError(f"grouped_allreduce takes a list of arrays, got {type(xs).__name__}")
            arrays, rop = [], as_op(op)
            for x in xs:
                # Arrays of a (dtype, op) that passed before skip the checks (hundreds per call).
                if type(x) is not np.ndarray or (x.dtype, rop) not in self._checked:
                    x = reduction_input(x, rop, "grouped_allreduce")[0]
                    self._checked[(x.dtype, rop)] = (rop, str(x.dtype))
                arrays.append(x)
            alg = algorithms.check_for(algorithm, self.topology) if algorithm else self.ctx.config.algorithm
            comp = Compression.none if compression is None else as_compressor(compression)
        except (TypeError, ValueError) as exc:
            self._refuse("grouped_allreduce", base, exc)
        # An empty group still takes part, so a rank that groups nothing where others
        # group something gets a MismatchError, not a stall.
        lanes: dict[np.dtype, list[int]] = {} if arrays else {np.dtype(np.float64): []}
        for i, a in enumerate(arrays):
            lanes.setdefault(a.dtype, []).append(i)
        parts = []
        for dtype, positions in lanes.items():
            sub = base if len(lanes) == 1 else f"{base}<{dtype}>"
            shapes = [arrays[i].shape for i in positions]
            if len(positions) == 1:
                flat = np.array(arrays[positions[0]], copy=True).reshape(-1)
            else:
                flat = np.concatenate([arrays[i].reshape(-1) for i in positions] or [np.empty(0, dtype)])
            desc = Descriptor("grouped_allreduce", sub, (tuple(shapes), str(dtype), rop.name), alg, comp.name)
            req = Request("allreduce", sub, desc, Handle(sub), array=flat, op=rop, algorithm=alg,
                          compression=comp, inplace=True)
            parts.append((positions, shapes, [arrays[i].size for i in positions], eng.submit(req, wake=wake)))
        return GroupHandle(base, parts, len(arrays))

    def grouped_allreduce(self, xs: Sequence[Any], *, op: Any = ReduceOp.AVERAGE, name: str | None = None,
                          algorithm: str | None = None, compression: Any = None) -> list[np.ndarray]:
        """See :func:`ddl.grouped_allreduce`."""
        return self.grouped_allreduce_async(xs, op=op, name=name, algorithm=algorithm,  # type: ignore[no-any-return]
                                            compression=compression, wake=False).wait()

    # -- everything else -------------------------------------------------------------
    def allgather(self, x: Any, *, name: str | None = None) -> np.ndarray:
        """See :func:`ddl.allgather`."""
        def prepare() -> tuple[tuple[Any, ...], Callable[[], Any]]:
            arr = as_array(x, "allgather")
            if arr.ndim == 0:
                raise ValueError("allgather needs an array with at least one dimension; wrap a scalar as [x]")
            dtypes.check_dtype(arr.dtype, what="allgather input")
            return (arr.shape[1:], str(arr.dtype)), lambda: self.ctx.allgather(arr)

        return self._call("allgather", name, prepare)  # type: ignore[no-any-return]

    def broadcast(self, x: Any, root_rank: int = 0, *, name: str | None = None) -> np.ndarray:
        """See :func:`ddl.broadcast`."""
        return self._broadcast(x, root_rank, name, inplace=False)

    def broadcast_(self, x: np.ndarray, root_rank: int = 0, *, name: str | None = None) -> np.ndarray:
        """See :func:`ddl.broadcast_`."""
        return self._broadcast(x, root_rank, name, inplace=True)

    def _broadcast(self, x: Any, root_rank: int, name: str | None, *, inplace: bool) -> np.ndarray:
        def prepare() -> tuple[tuple[Any, ...], Callable[[], Any]]:
            arr = as_array(x, "broadcast", writable=inplace)
            self._check_root(root_rank)
            dtypes.check_dtype(arr.dtype, what="broadcast input")
            return ((arr.shape, str(arr.dtype), root_rank),
                    lambda: self.ctx.broadcast(arr, root_rank=root_rank, inplace=inplace))

        return self._call("broadcast", name, prepare)  # type: ignore[no-any-return]

    def reducescatter(self, x: Any, *, op: Any = ReduceOp.SUM, name: str | None = None) -> np.ndarray:
        """See :func:`ddl.reducescatter`."""
        def prepare() -> tuple[tuple[Any, ...], Callable[[], Any]]:
            arr, rop = reduction_input(x, op, "reducescatter", needs_axis=True)
            return (arr.shape, str(arr.dtype), rop.name), lambda: self.ctx.reducescatter(arr, op=rop)

        return self._call("reducescatter", name, prepare)  # type: ignore[no-any-return]

    def broadcast_object(self, obj: Any, root_rank: int = 0, *, name: str | None = None) -> Any:
        """See :func:`ddl.broadcast_object`."""
        def prepare() -> tuple[tuple[Any, ...], Callable[[], Any]]:
            self._check_root(root_rank)
            data = _pickle(obj, "broadcast_object") if self.topology.rank == root_rank else None
            return (root_rank,), lambda: self.ctx.broadcast_bytes(data, root_rank=root_rank)

        return pickle.loads(self._call("broadcast_object", name, prepare))

    def allgather_object(self, obj: Any, *, name: str | None = None) -> list[Any]:
        """See :func:`ddl.allgather_object`."""
        def prepare() -> tuple[tuple[Any, ...], Callable[[], Any]]:
            data = _pickle(obj, "allgather_object")
            return (), lambda: self.ctx.allgather_bytes(data)

        return [pickle.loads(b) for b in self._call("allgather_object", name, prepare)]

    def barrier(self) -> None:
        """See :func:`ddl.barrier`."""
        self._call("barrier", None, lambda: ((), self.ctx.barrier))

    # -- plumbing --------------------------------------------------------------------
    def _call(self, kind: str, name: str | None,
              prepare: Callable[[], tuple[tuple[Any, ...], Callable[[], Any]]]) -> Any:
        """Check the arguments (``prepare``), run the collective through the engine, wait."""
        name = name or self.engine.names.next()
        try:
            fields, run = prepare()
        except (TypeError, ValueError) as exc:
            self._refuse(kind, name, exc)
        req = Request(kind, name, Descriptor(kind, name, fields), Handle(name), run=run)
        return self.engine.submit(req, wake=False).wait()

    def _refuse(self, kind: str, name: str, exc: BaseException) -> NoReturn:
        """Submit the refusal of ``kind`` ``name`` in its place and raise ``exc`` once the
        other ranks have reached the same call (they get a RemoteError)."""
        req = Request("error", name, error_descriptor(name, kind, exc), Handle(name), error=exc)
        self.engine.submit(req, wake=False).wait()
        raise exc  # not reached: the refusal's handle raises ``exc`` itself

    def _check_root(self, root_rank: int) -> None:
        size = self.topology.size
        if not isinstance(root_rank, (int, np.integer)) or not 0 <= root_rank < size:
            raise ValueError(f"root_rank={root_rank!r} is not a rank of this job; use 0..{size - 1}")


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


def _pickle(obj: Any, what: str) -> bytes:
    try:
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise TypeError(f"{what} could not pickle {type(obj).__name__}: {exc}") from None
