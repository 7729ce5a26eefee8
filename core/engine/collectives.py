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
from typing import Any, Literal, NoReturn

import numpy as np

from ddl.base import dtypes
from ddl.base.ops import ReduceOp, as_op
from ddl.base.topology import Topology
from ddl.engine import join, prepared_calls
from ddl.engine.compression import Compression, as_compressor
from ddl.engine.engine import Engine
from ddl.engine.fusion import Request
from ddl.engine.handle import GroupHandle, Handle
from ddl.engine.negotiation import Descriptor, error_descriptor
from ddl.reduction import algorithms
from ddl.reduction.segments import check_bounds


def is_adasum(op: Any) -> bool:
    """Whether ``op`` asks for Adasum (the member, or its name in any case)."""
    return op is ReduceOp.ADASUM or (isinstance(op, str) and op.lower() == "adasum")


class Collectives:
    """Every public collective, on one :class:`~ddl.engine.engine.Engine`."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.ctx = engine.ctx
        # (dtype, op as passed) -> (ReduceOp, dtype name) for combinations that passed the
        # checks: later calls of a training step skip them. Per instance, like the engine.
        self._checked: dict[tuple[np.dtype, Any], tuple[ReduceOp, str]] = {}
        self._runnable: set[str] = set()  # algorithm names that passed the checks on this topology
        # (dtype, shape, op as passed, in place) -> a plain synchronous call's prepared state
        # (a small one's lane, a larger one's checks), or False (neither: the checked path).
        self._lanes: dict[tuple[Any, ...], prepared_calls.Lane | prepared_calls.Prepared | Literal[False]] = {}
        # name -> (dtype, shape, op as passed, in place, descriptor, digest, ReduceOp) of the
        # last named async allreduce of that name that passed the checks: one string lookup
        # and four comparisons per tensor per step (a tuple key of all five cost more).
        self._signatures: dict[str, tuple[np.dtype, tuple[int, ...], Any, bool, Descriptor, int, ReduceOp]] = {}

    @property
    def topology(self) -> Topology:
        return self.ctx.topology

    # -- allreduce -------------------------------------------------------------------
    def allreduce_async(
        self, x: Any, *, op: Any = ReduceOp.AVERAGE, name: str | None = None, algorithm: str | None = None,
        compression: Any = None, inplace: bool = False, wake: bool = True, prescale: float = 1.0,
        postscale: float = 1.0,
    ) -> Handle:
        """Start an allreduce; see :func:`ddl.allreduce_async`.

        ``wake=False``: the caller waits at once (and so runs the cycle itself).
        """
        if algorithm is not None or compression is not None:
            algorithm, compression = self._unless_default(algorithm, compression)
        if name and algorithm is None and compression is None and prescale == 1.0 and postscale == 1.0:
            again = self.resubmit(x, op, name, inplace, wake)
            if again is not None:
                return again
        if is_adasum(op):
            return self._adasum([x], name, "allreduce", single=True, inplace=inplace, wait=False)
        req = self._allreduce_request(x, op, name, algorithm, compression, inplace, prescale, postscale)
        if name and req.kind == "allreduce" and type(x) is np.ndarray and req.array is x \
                and algorithm is None and compression is None and prescale == 1.0 and postscale == 1.0:
            if len(self._signatures) > 65536:
                self._signatures.clear()
            req.digest = self.engine.digest_of(req.descriptor)
            self._signatures[name] = (x.dtype, x.shape, op, inplace, req.descriptor, req.digest, req.op)
        # The synchronous calls wait at once and run the cycle themselves: waking the
        # engine thread for them would only contend with the caller.
        return self.engine.submit(req, wake=wake)

    def _unless_default(self, algorithm: str | None, compression: Any) -> tuple[str | None, Any]:
        """``algorithm`` and ``compression`` as None where they name what None means (the job's
        algorithm, ``Compression.none``): the same request, and then the per-tensor paths
        (prepared lanes, resubmission) take the call. Horovod code passes
        ``compression=Compression.none`` as a habit, and that cost a small call 3x its time."""
        if algorithm is not None and algorithm == self.ctx.config.algorithm:
            algorithm = None
        if compression is not None:  # ddl's, an adapter's (Horovod's classes) or the name, as as_compressor reads it
            wire = getattr(compression, "wire_compression", compression)
            if compression is Compression.none or isinstance(wire, str) and wire == "none":
                compression = None
        return algorithm, compression

    def resubmit(self, x: Any, op: Any, name: str, inplace: bool, wake: bool = True) -> Handle | None:
        """A named allreduce with no algorithm, compression or scaling submitted again (every
        training step): the descriptor and digest of its first submission, so only the
        request is new. None: not seen before with this array's signature (submit it
        through :meth:`allreduce_async`, whose checks then remember it)."""
        seen = self._signatures.get(name)
        if seen is None or type(x) is not np.ndarray:
            return None
        dtype, shape, passed, was_inplace, desc, digest, rop = seen
        if passed is not op or was_inplace != inplace or x.shape != shape:
            return None
        if (dtype is not x.dtype and dtype != x.dtype) or (inplace and not x.flags.writeable):
            return None
        # Positional, digest included: this line runs once per tensor per step.
        return self.engine.submit(Request("allreduce", name, desc, Handle(name), None, x, rop, desc.algorithm,
                                          Compression.none, inplace, 0.0, digest), wake=wake)

    def allreduce(self, x: Any, *, op: Any = ReduceOp.AVERAGE, name: str | None = None,
                  algorithm: str | None = None, compression: Any = None, prescale: float = 1.0,
                  postscale: float = 1.0) -> np.ndarray:
        """See :func:`ddl.allreduce`."""
        if algorithm is not None or compression is not None:
            algorithm, compression = self._unless_default(algorithm, compression)
        if algorithm is None and compression is None and prescale == 1.0 and postscale == 1.0:
            return self.plain_allreduce(x, op, name, False)
        if is_adasum(op):
            return self._adasum([x], name, "allreduce", single=True).wait()  # type: ignore[no-any-return]
        return self._allreduce_now(self._allreduce_request(x, op, name, algorithm, compression, False,
                                                           prescale, postscale))

    def allreduce_(self, x: np.ndarray, *, op: Any = ReduceOp.AVERAGE, name: str | None = None,
                   algorithm: str | None = None, compression: Any = None, prescale: float = 1.0,
                   postscale: float = 1.0) -> np.ndarray:
        """See :func:`ddl.allreduce_`."""
        if algorithm is not None or compression is not None:
            algorithm, compression = self._unless_default(algorithm, compression)
        if algorithm is None and compression is None and prescale == 1.0 and postscale == 1.0:
            return self.plain_allreduce(x, op, name, True)
        if is_adasum(op):
            return self._adasum([x], name, "allreduce", single=True, inplace=True).wait()  # type: ignore[no-any-return]
        return self._allreduce_now(self._allreduce_request(x, op, name, algorithm, compression, True,
                                                           prescale, postscale))

    def plain_allreduce(self, x: Any, op: Any, name: str | None, inplace: bool) -> np.ndarray:
        """A synchronous allreduce with no algorithm, compression or scaling asked for (the
        public functions call it directly: a small call's keywords cost a tenth of it).
        A signature seen before runs prepared (:mod:`ddl.engine.prepared_calls`): a small one
        through its lane, a larger one from the checks it passed the first time; the rest,
        and a small call while the engine is busy here, the usual way."""
        if type(x) is np.ndarray and (not inplace or x.flags.writeable):
            # Keyed by the op object's identity (hashing an enum member runs Python code);
            # the entry keeps the object, so an id reused by another op cannot match it.
            key = (x.dtype, x.shape, id(op), inplace)
            lane = self._lanes.get(key)
            if type(lane) is not prepared_calls.Lane or lane.passed is not op:  # (a small call's lane: straight on)
                if lane is None or lane is not False and lane.passed is not op:
                    lane = self._lanes[key] = self._new_lane(x, op, inplace)
                if isinstance(lane, prepared_calls.Prepared):
                    if lane.in_place and x.flags.c_contiguous:
                        done = self.engine.run_in_place(lane, x, name)
                        if done is not None:
                            return done if type(done) is np.ndarray else done.wait()  # type: ignore[union-attr]
                    return self._allreduce_now(lane.request(x, name or self.engine.names.next(), inplace))
            if lane is not False:
                got = self.engine.run_lane(lane, x, name)
                if type(got) is np.ndarray:
                    return got
                if got is not None:
                    return got.wait()  # type: ignore[union-attr,no-any-return]
        if is_adasum(op):
            return self._adasum([x], name, "allreduce", single=True, inplace=inplace).wait()  # type: ignore[no-any-return]
        return self._allreduce_now(self._allreduce_request(x, op, name, None, None, inplace))

    def _new_lane(self, x: np.ndarray, op: Any,
                  inplace: bool) -> prepared_calls.Lane | prepared_calls.Prepared | Literal[False]:
        """This call signature's lane (small), its prepared checks (larger), or False where
        it can take neither (the usual path then runs it, and refuses what its checks refuse)."""
        eng = self.engine
        if len(self._lanes) > 256:
            self._lanes.clear()
        if is_adasum(op):
            return False
        try:
            reduction_input(x, op, "allreduce", writable=inplace)
        except (TypeError, ValueError):
            return False

        def request(arr: np.ndarray, name: str) -> Request:
            return self._allreduce_request(arr, op, name, None, None, inplace)

        first = request(x, "prepared")
        if prepared_calls.eligible(x, eng.exchange.inline_capacity, self.ctx.config.algorithm):
            return eng.prepare_lane(first, op, request) or False
        return prepared_calls.prepare(first, op) or False

    def _allreduce_now(self, req: Request) -> np.ndarray:
        """A synchronous allreduce: the engine's lean path when it is free, else the queue."""
        if not self.engine.run_alone(req):
            self.engine.submit(req, wake=False)
        return req.handle.wait()  # type: ignore[no-any-return]

    def _allreduce_request(self, x: Any, op: Any, name: str | None, algorithm: str | None, compression: Any,
                           inplace: bool, prescale: float = 1.0, postscale: float = 1.0) -> Request:
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
        fields = (arr.shape, dtype_name, rop.name) + _scales(prescale, postscale)
        desc = Descriptor("allreduce", name, fields, alg, comp.name)
        return Request("allreduce", name, desc, Handle(name), array=arr, op=rop, algorithm=alg,
                       compression=comp, inplace=inplace, prescale=float(prescale), postscale=float(postscale))

    def grouped_allreduce_async(self, xs: Sequence[Any], *, op: Any = ReduceOp.AVERAGE, name: str | None = None,
                                algorithm: str | None = None, compression: Any = None,
                                wake: bool = True, prescale: float = 1.0, postscale: float = 1.0,
                                now: bool = False) -> Handle:
        """Start one allreduce of several arrays; see :func:`ddl.grouped_allreduce_async`.

        ``now``: the caller waits at once (:meth:`grouped_allreduce`, SyncBatchNorm's
        statistics): a group of one dtype runs in the caller's own cycle, as a lone
        synchronous allreduce does (:meth:`ddl.engine.engine.Engine.run_alone`).

        The arrays of each dtype are copied once into one flat private buffer, submitted
        as one request (its descriptor lists every shape, so ranks that group differently
        get a MismatchError), and reduced where they lie: a bucket the caller built costs
        one submission, not one per tensor.
        """
        eng = self.engine
        if is_adasum(op):
            return self._adasum(list(xs), name, "grouped_allreduce", single=False, wait=False)
        base = name or eng.names.next()
        try:
            if isinstance(xs, (np.ndarray, str, bytes)) or not isinstance(xs, Sequence):
                raise TypeError(f"grouped_allreduce takes a list of arrays, got {type(xs).__name__}")
            arrays, rop, checked, last, mixed = [], as_op(op), self._checked, None, False
            for x in xs:
                # Arrays of a (dtype, op) that passed before skip the checks (hundreds per call);
                # the previous array's very dtype object passed them, no lookup needed.
                if type(x) is not np.ndarray or (x.dtype is not last and (x.dtype, rop) not in checked):
                    x = reduction_input(x, rop, "grouped_allreduce")[0]
                    checked[(x.dtype, rop)] = (rop, str(x.dtype))
                if x.dtype is not last:
                    mixed = mixed or (last is not None and x.dtype != last)
                    last = x.dtype
                arrays.append(x)
            alg = algorithms.check_for(algorithm, self.topology) if algorithm else self.ctx.config.algorithm
            comp = Compression.none if compression is None else as_compressor(compression)
        except (TypeError, ValueError) as exc:
            self._refuse("grouped_allreduce", base, exc)
        # An empty group still takes part, so a rank that groups nothing where others
        # group something gets a MismatchError, not a stall.
        dtype_groups: dict[np.dtype, list[int]] = {} if arrays else {np.dtype(np.float64): []}
        if arrays and not mixed:  # one dtype (the usual group): every position, no pass to sort them
            dtype_groups[arrays[0].dtype] = list(range(len(arrays)))
        else:
            for i, a in enumerate(arrays):
                dtype_groups.setdefault(a.dtype, []).append(i)
        parts = []
        for dtype, positions in dtype_groups.items():
            sub = base if len(dtype_groups) == 1 else f"{base}<{dtype}>"
            members = arrays if len(positions) == len(arrays) else [arrays[i] for i in positions]
            shapes = [a.shape for a in members]
            if len(positions) == 1:
                flat = np.array(members[0], copy=True).reshape(-1)
            else:  # (axis=None flattens each in C: no view per array)
                flat = np.concatenate(members or [np.empty(0, dtype)], axis=None)
            fields = (tuple(shapes), str(dtype), rop.name) + _scales(prescale, postscale)
            desc = Descriptor("grouped_allreduce", sub, fields, alg, comp.name)
            req = Request("allreduce", sub, desc, Handle(sub), array=flat, op=rop, algorithm=alg,
                          compression=comp, inplace=True, prescale=float(prescale), postscale=float(postscale))
            ran = now and len(dtype_groups) == 1 and eng.run_alone(req)
            parts.append((positions, shapes, [a.size for a in members],
                          req.handle if ran else eng.submit(req, wake=wake)))
        return GroupHandle(base, parts, len(arrays))

    def grouped_allreduce(self, xs: Sequence[Any], *, op: Any = ReduceOp.AVERAGE, name: str | None = None,
                          algorithm: str | None = None, compression: Any = None, prescale: float = 1.0,
                          postscale: float = 1.0) -> list[np.ndarray]:
        """See :func:`ddl.grouped_allreduce`."""
        return self.grouped_allreduce_async(xs, op=op, name=name, algorithm=algorithm,  # type: ignore[no-any-return]
                                            compression=compression, wake=False, prescale=prescale,
                                            postscale=postscale, now=True).wait()

    def _adasum(self, xs: list[Any], name: str | None, kind: str, *, single: bool, inplace: bool = False,
                wait: bool = True) -> Handle:
        """Adasum of each array over the ranks (never fused: the combination is per tensor)."""
        def prepare() -> tuple[tuple[Any, ...], Callable[[], Any]]:
            arrays = [reduction_input(x, ReduceOp.ADASUM, kind, writable=inplace)[0] for x in xs]
            if len({a.dtype for a in arrays}) > 1:
                raise TypeError("Adasum reduces a group of one dtype; group tensors by dtype")

            def run() -> Any:
                outs = self.ctx.adasum(arrays)
                if inplace:
                    for a, o in zip(arrays, outs, strict=True):
                        a[...] = o
                    outs = arrays
                return outs[0] if single else outs

            return (tuple(a.shape for a in arrays), tuple(str(a.dtype) for a in arrays)), run

        return self._submit("adasum", name, prepare)

    # -- everything else -------------------------------------------------------------
    def allgather(self, x: Any, *, name: str | None = None) -> np.ndarray:
        """See :func:`ddl.allgather`."""
        return self.allgather_async(x, name=name).wait()  # type: ignore[no-any-return]

    def allgather_async(self, x: Any, *, name: str | None = None) -> Handle:
        """Start an allgather; ``wait()`` returns the concatenation."""
        return self.grouped_allgather_async([x], name=name, single=True)

    def grouped_allgather_async(self, xs: Sequence[Any], *, name: str | None = None, single: bool = False) -> Handle:
        """Start an allgather of each array, as one request; ``wait()`` returns the list."""
        what = "allgather" if single else "grouped_allgather"

        def prepare() -> tuple[tuple[Any, ...], Callable[[], Any]]:
            arrays = [as_array(x, what) for x in _as_list(xs, what)]
            for arr in arrays:
                if arr.ndim == 0:
                    raise ValueError(f"{what} needs arrays with at least one dimension; wrap a scalar as [x]")
                dtypes.check_dtype(arr.dtype, what=f"{what} input", moves_only=True)

            def run() -> Any:
                outs = [self.ctx.allgather(a) for a in arrays]
                return outs[0] if single else outs

            return tuple((a.shape[1:], str(a.dtype)) for a in arrays), run

        return self._submit(what, name, prepare)

    def broadcast(self, x: Any, root_rank: int = 0, *, name: str | None = None) -> np.ndarray:
        """See :func:`ddl.broadcast`."""
        return self.broadcast_async(x, root_rank, name=name).wait()  # type: ignore[no-any-return]

    def broadcast_(self, x: np.ndarray, root_rank: int = 0, *, name: str | None = None) -> np.ndarray:
        """See :func:`ddl.broadcast_`."""
        return self.broadcast_async(x, root_rank, name=name, inplace=True).wait()  # type: ignore[no-any-return]

    def broadcast_async(self, x: Any, root_rank: int = 0, *, name: str | None = None,
                        inplace: bool = False) -> Handle:
        """Start a broadcast; ``wait()`` returns the root's array (``x`` itself when in place)."""
        def prepare() -> tuple[tuple[Any, ...], Callable[[], Any]]:
            arr = as_array(x, "broadcast", writable=inplace)
            self._check_root(root_rank)
            dtypes.check_dtype(arr.dtype, what="broadcast input", moves_only=True)
            return ((arr.shape, str(arr.dtype), root_rank),
                    lambda: self.ctx.broadcast(arr, root_rank=root_rank, inplace=inplace))

        return self._submit("broadcast", name, prepare)

    def reducescatter(self, x: Any, *, op: Any = ReduceOp.SUM, name: str | None = None, prescale: float = 1.0,
                      postscale: float = 1.0) -> np.ndarray:
        """See :func:`ddl.reducescatter`."""
        return self.reducescatter_async(x, op=op, name=name, prescale=prescale,  # type: ignore[no-any-return]
                                        postscale=postscale).wait()

    def reducescatter_async(self, x: Any, *, op: Any = ReduceOp.SUM, name: str | None = None,
                            prescale: float = 1.0, postscale: float = 1.0) -> Handle:
        """Start a reduce-scatter; ``wait()`` returns this rank's rows."""
        return self.grouped_reducescatter_async([x], op=op, name=name, prescale=prescale, postscale=postscale,
                                                single=True)

    def grouped_reducescatter_async(self, xs: Sequence[Any], *, op: Any = ReduceOp.SUM, name: str | None = None,
                                    prescale: float = 1.0, postscale: float = 1.0, single: bool = False) -> Handle:
        """Start a reduce-scatter of each array, as one request; ``wait()`` returns the list."""
        what = "reducescatter" if single else "grouped_reducescatter"

        def prepare() -> tuple[tuple[Any, ...], Callable[[], Any]]:
            # Before the inputs' checks, whose dtype rule for Adasum would name the wrong
            # problem. NotImplementedError (a RuntimeError, as Horovod's refusal is).
            if as_op(op) is ReduceOp.ADASUM:
                raise NotImplementedError(f"{what} does not take ddl.Adasum (it combines whole gradients); "
                                          "use Sum or Average, or allreduce with Adasum")
            checked = [reduction_input(x, op, what, needs_axis=True) for x in _as_list(xs, what)]

            def run() -> Any:
                outs = []
                for arr, rop in checked:
                    src = arr
                    if prescale != 1.0:
                        src = np.array(arr, dtype=dtypes.accumulator(arr.dtype), copy=True)
                        dtypes.scale(src, prescale)
                    outs.append(self.ctx.reducescatter(src, op=rop, postscale=postscale, out_dtype=arr.dtype))
                return outs[0] if single else outs

            fields = tuple((a.shape, str(a.dtype), rop.name) for a, rop in checked) + _scales(prescale, postscale)
            return fields, run

        return self._submit(what, name, prepare)

    def reduce_segments_async(self, buf: np.ndarray, bounds: Sequence[int], *, op: Any = ReduceOp.AVERAGE,
                              name: str | None = None) -> Handle:
        """Start a reduce-scatter over owner segments, in place; see :func:`ddl.runtime.api.reduce_segments_async`."""
        def prepare() -> tuple[tuple[Any, ...], Callable[[], Any]]:
            arr, rop = _segment_input(buf, "reduce_segments", op)
            if rop not in (ReduceOp.SUM, ReduceOp.AVERAGE):
                raise ValueError(f"reduce_segments sums or averages, got ddl.{rop.name.title()}")
            cuts = check_bounds(bounds, self.topology.size, arr.size)
            return (arr.size, str(arr.dtype), cuts, rop.name), lambda: self.ctx.reduce_segments(arr, cuts, op=rop)

        return self._submit("reduce_segments", name, prepare)

    def allgather_segments_async(self, buf: np.ndarray, bounds: Sequence[int], *, name: str | None = None) -> Handle:
        """Start an allgather of owner segments, in place; see :func:`ddl.runtime.api.allgather_segments_async`."""
        def prepare() -> tuple[tuple[Any, ...], Callable[[], Any]]:
            arr, _ = _segment_input(buf, "allgather_segments", ReduceOp.SUM)
            cuts = check_bounds(bounds, self.topology.size, arr.size)
            return (arr.size, str(arr.dtype), cuts), lambda: self.ctx.allgather_segments(arr, cuts)

        return self._submit("allgather_segments", name, prepare)

    def alltoall_async(self, x: Any, splits: Sequence[int] | None = None, *, name: str | None = None) -> Handle:
        """Start an alltoall; ``wait()`` returns (rows received, rows received from each rank)."""
        def prepare() -> tuple[tuple[Any, ...], Callable[[], Any]]:
            arr = as_array(x, "alltoall")
            if arr.ndim == 0:
                raise ValueError("alltoall needs an array with at least one dimension")
            dtypes.check_dtype(arr.dtype, what="alltoall input", moves_only=True)
            p = self.topology.size
            if splits is None:
                if arr.shape[0] % p:
                    raise ValueError(f"alltoall without splits needs a first dimension divisible by the "
                                     f"{p} ranks, got {arr.shape[0]}; pass splits=")
                parts = [arr.shape[0] // p] * p
            else:
                parts = [int(n) for n in np.asarray(splits).reshape(-1)]
                if len(parts) != p or any(n < 0 for n in parts) or sum(parts) != arr.shape[0]:
                    raise ValueError(f"alltoall splits must be {p} non-negative row counts summing to the first "
                                     f"dimension {arr.shape[0]}, got {parts}")
            return (arr.shape[1:], str(arr.dtype)), lambda: self.ctx.alltoall(arr, parts)

        return self._submit("alltoall", name, prepare)

    def join(self) -> int:
        """See :func:`ddl.join`: wait, contributing zeros to the others' allreduces, until
        every rank has joined; return the last rank to join."""
        eng = self.engine
        req = Request(join.JOIN_KIND, join.JOIN_NAME, join.join_descriptor(), Handle(join.JOIN_NAME),
                      run=eng.last_joined)
        return int(eng.submit(req, wake=True).wait())

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
        return self._submit(kind, name, prepare, wake=False).wait()

    def _submit(self, kind: str, name: str | None, prepare: Callable[[], tuple[tuple[Any, ...], Callable[[], Any]]],
                *, wake: bool = True) -> Handle:
        """Check the arguments (``prepare``) and submit the collective; its handle."""
        name = name or self.engine.names.next()
        try:
            fields, run = prepare()
        except (TypeError, ValueError) as exc:
            self._refuse(kind, name, exc)
        req = Request(kind, name, Descriptor(kind, name, fields), Handle(name), run=run)
        return self.engine.submit(req, wake=wake)

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


def _segment_input(buf: Any, what: str, op: Any) -> tuple[np.ndarray, ReduceOp]:
    """``buf`` checked as the 1-D, contiguous, writable array a segment exchange works in."""
    arr, rop = reduction_input(buf, op, what, writable=True)
    if arr.ndim != 1 or not arr.flags.c_contiguous:
        raise ValueError(f"{what} works in place on a 1-D contiguous array, got shape {arr.shape}")
    return arr, rop


def _scales(prescale: float, postscale: float) -> tuple[float, ...]:
    """Descriptor fields for Horovod's scale factors: none when both are 1 (the common case)."""
    if not (isinstance(prescale, (int, float)) and isinstance(postscale, (int, float))):
        raise TypeError(f"prescale_factor and postscale_factor are numbers, got {prescale!r} and {postscale!r}")
    return () if prescale == 1.0 and postscale == 1.0 else (float(prescale), float(postscale))


def _as_list(xs: Any, what: str) -> list[Any]:
    if isinstance(xs, (np.ndarray, str, bytes)) or not isinstance(xs, Sequence):
        raise TypeError(f"{what} takes a list of arrays, got {type(xs).__name__}")
    return list(xs)


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
