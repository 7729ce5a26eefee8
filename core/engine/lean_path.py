"""The engine's lean path: one cycle with one call, run by its caller (baton free, nothing pending).

A synchronous call runs, in its caller, the very cycle the queue would run with it alone
pending, and falls back to the queue's verdict when the others hold something else (the
engine's contract, :mod:`ddl.engine.engine`). :class:`LeanPath` is that half of
:class:`~ddl.engine.engine.Engine`, apart so each file keeps one concern: it uses the
engine's state (the baton, the exchange, the queue) and the cycle's own steps.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

import numpy as np

from ddl.base.dtypes import accumulator, float_division
from ddl.base.ops import ReduceOp, ufunc
from ddl.engine import fusion, negotiation, prepared_calls
from ddl.engine.codec import Exchange, Verdict
from ddl.engine.context import Context
from ddl.engine.fusion import Request
from ddl.engine.handle import Handle
from ddl.engine.naming import ThreadNamer
from ddl.engine.negotiation import Descriptor
from ddl.engine.prepared_calls import Lane, Prepared
from ddl.engine.timeline import Timeline
from ddl.engine.watchdog import StallWatch

_MASK = negotiation.MASK


class LeanPath:
    """The lean path's methods; :class:`~ddl.engine.engine.Engine` holds the state."""

    ctx: Context
    fusion_threshold: int
    timeline: Timeline | None
    names: ThreadNamer
    watch: StallWatch
    exchange: Exchange
    cycles: int
    inline_cycles: int
    _baton: threading.Lock
    _lock: threading.Lock
    _thread: threading.Thread | None
    _pending: list[Request]
    _in_flight: set[str]
    _stop: bool
    _finished: bool
    _failure: BaseException | None
    _interrupted: BaseException | None
    _last_cycle: float
    _lean_views: dict[tuple[np.dtype, tuple[int, ...]], tuple[np.ndarray, list[np.ndarray] | np.ndarray]]
    _alone_lanes: dict[tuple[np.dtype, tuple[int, ...], ReduceOp, bool], Lane]

    if TYPE_CHECKING:  # the engine's own steps of a cycle
        def _digest(self, descriptor: Descriptor) -> int: ...
        def _name_digest(self, name: str) -> int: ...
        def _fail(self, exc: BaseException, batch: list[Request], call: str = "") -> NoReturn: ...
        def _act(self, verdict: Verdict, batch: list[Request], stopping: bool, inline: int,
                 start: float) -> tuple[bool, bool]: ...
        def _settle_trials(self) -> None: ...
        def wait_for(self, handle: Handle, timeout: float | None) -> bool: ...

    # One cycle with one request, run in the caller instead of queued for the thread:
    # run_alone takes a request built by the usual checks, run_lane a small call's
    # prepared Lane (the same request's cached inputs), run_in_place a larger in-place
    # call's Prepared checks. All meet the others' verdict through _lean_cycle when not
    # every rank holds the call, so the engine's contract lives here and in its _cycle.
    def run_alone(self, req: Request) -> bool:
        """Run ``req`` in the caller as the one cycle :meth:`_cycle` would run with it
        alone pending; False (nothing done) when the engine is busy here or stopping,
        and the caller then submits it as usual. True: ``req.handle`` is done, or
        queued after a cycle whose verdict was carried out (wait on it).

        Other ranks, on this path or not, see the same calls: when every rank holds just
        this request, a small one is reduced from the exchanged records (inline) and a
        larger one runs at once as a bucket of its own; when they hold something else,
        the request joins the queue and this cycle's verdict is carried out as usual.
        """
        if not self._lean_baton():
            return False
        try:
            req.submitted = time.perf_counter()
            req.handle.attach(self)
            self._alone(req)
        finally:
            self._baton.release()
        return True

    def run_waited(self, handle: Handle) -> bool:
        """The cycle a caller waiting on ``handle`` runs (baton held) when its request is all this
        rank has pending: :meth:`run_alone`'s, not the queue's general one. It is the same
        exchange (one request, its digest); only the Python around it is shorter, which is
        most of an ``allreduce_async`` + ``synchronize`` pair of a small tensor. False
        (nothing done): something else is pending, the request is no allreduce, or the
        engine is stopping or tracing.

        The request leaves the queue for the cycle and keeps its name in flight: when every
        rank holds it, it is done and its name freed; when not, it rejoins the queue
        and this cycle's verdict is carried out, as for :meth:`run_alone`."""
        if self.timeline is not None or self._stop or self._finished or self._failure is not None \
                or self._interrupted is not None:
            return False
        with self._lock:
            if len(self._pending) != 1 or self._pending[0].handle is not handle \
                    or self._pending[0].kind != "allreduce":  # (as run_alone takes: the rest need the queue's cycle)
                return False
            req, self._pending = self._pending[0], []
        if self._alone(req):
            with self._lock:
                self._in_flight.discard(req.name)
        return True

    def _alone(self, req: Request) -> bool:
        """One cycle with ``req`` alone (baton held, ``req`` not queued); True when every
        rank held it (its handle is done), False when it joined the queue instead."""
        d = req.digest = req.digest or self._digest(req.descriptor)
        arr = req.array
        inline = fusion.inline_bytes([req], self.exchange.inline_capacity)
        # Own-accumulator dtypes ride typed views cached per shape, as a lane does;
        # the rest (half types, which sum in float32) the queued path's packing.
        lane = self._transient_lane(req) if inline and arr is not None \
            and accumulator(arr.dtype) == arr.dtype else None
        got = self._lean_cycle(d, inline, lane, arr, req.name, req)
        if type(got) is np.ndarray:
            req.handle.set_result(got)
        return got is None or type(got) is np.ndarray

    def run_lane(self, lane: Lane, x: np.ndarray, name: str | None) -> np.ndarray | Handle | None:
        """:meth:`run_alone` for a prepared small call (:mod:`ddl.engine.prepared_calls`): the
        same cycle and the same bits, with no request built unless the others hold
        something else. Returns the result, a handle to wait on (the call joined the
        queue after this cycle's verdict was carried out), or None (engine busy here or
        tracing: nothing done, no name taken; the caller goes the usual way).

        The common case (every rank holds this call) is written out here rather than
        through :meth:`_lean_cycle`: a 4 KiB call is a few microseconds, and the frames
        and branches it saves were a visible share of them."""
        if self.timeline is not None or self._thread is None or not self._baton.acquire(False):
            return None
        try:
            if self._pending or self._stop or self._finished or self._failure is not None \
                    or self._interrupted is not None:  # (_lean_baton's test, written out)
                return None
            try:
                if not name:  # unnamed ("" too, as on the queued path): the thread's next count
                    stem, count, stem_digest = self.names.next_digest_excluded(negotiation.stem_digest)
                    # negotiation.counted_digest, written out (the baton excludes catch_up)
                    d = (lane.body ^ stem_digest ^ ((count * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF)) & _MASK
                else:
                    stem, count = name, -1
                    d = (lane.body ^ self._name_digest(name)) & _MASK
                lane.staged[...] = x
                if self.exchange.run_one(d, lane.nbytes, time.monotonic() >= self.watch.next_check):
                    self.cycles += 1
                    self.inline_cycles += 1
                    out = fusion.reduce_with(lane.parts, lane.combine, lane.average, x if lane.inplace else None,
                                             lane.scale)
                    if self.watch.timed:
                        self.watch.done((stem if count < 0 else f"{stem}{count}",))
                    self._last_cycle = time.perf_counter()
                    return out
            except BaseException as exc:  # the failure report names this collective
                self._last_cycle = time.perf_counter()
                self._fail(exc, [], name or "an unnamed allreduce")
            # Other ranks hold something else: go on as the queued request would.
            return self._lean_cycle(d, lane.nbytes, lane, x, stem if count < 0 else f"{stem}{count}", None,
                                    exchanged=True)
        finally:
            self._baton.release()

    def run_in_place(self, prepared: Prepared, x: np.ndarray, name: str | None) -> np.ndarray | Handle | None:
        """:meth:`run_lane` for a larger in-place call of a contiguous array
        (``prepared.in_place``): the same cycle as :meth:`run_alone`, and when every rank
        holds the call it is reduced where it lies (:func:`~ddl.engine.fusion.reduce_in_place`)
        with no request built. A large call's Python runs after its reduction has
        streamed megabytes through the caches, each line at several times its warm cost
        (4 MiB at 2 ranks: 57 us before the reduction and 19 us after it, through the request)."""
        if self.timeline is not None or not self._lean_baton():
            return None
        try:
            try:
                if not name:
                    stem, count, stem_digest = self.names.next_digest_excluded(negotiation.stem_digest)
                    name = f"{stem}{count}"
                    d = (prepared.body ^ stem_digest ^ negotiation.count_word(count)) & _MASK
                else:
                    d = (prepared.body ^ self._name_digest(name)) & _MASK
                if self._exchange_one(d, 0):
                    self.cycles += 1
                    fusion.reduce_in_place(self.ctx, x.reshape(-1), prepared.op, prepared.algorithm)
                    self._settle_trials()
                    if self.watch.watching:
                        self.watch.done((name,))
                    self._last_cycle = time.perf_counter()
                    return x
            except BaseException as exc:  # the failure report names this collective
                self._last_cycle = time.perf_counter()
                self._fail(exc, [], name or "an unnamed allreduce")
            # Other ranks hold something else: go on as the queued request would.
            req = prepared.request(x, name, True)
            req.submitted = time.perf_counter()
            return self._lean_cycle(d, 0, None, x, name, req, exchanged=True)
        finally:
            self._baton.release()

    def prepare_lane(self, request: Request, passed: object,
                     builder: Callable[[np.ndarray, str], Request]) -> Lane | None:
        """A small call signature's :class:`Lane`, riding this engine's cycle records (None:
        it cannot take one; see :func:`ddl.engine.prepared_calls.build`)."""
        if request.array is None:
            return None
        return prepared_calls.build(request, passed, self._inline_views(request.array), builder)

    def _lean_baton(self) -> bool:
        """Take the baton for a lean cycle: only when free and with nothing pending, stopping
        or failed here (else the caller goes the queued way, which raises or queues)."""
        if self._thread is None or not self._baton.acquire(False):  # positional: half the cost
            return False
        if self._pending or self._stop or self._finished or self._failure is not None \
                or self._interrupted is not None:
            self._baton.release()
            return False
        return True

    def _transient_lane(self, req: Request) -> Lane:
        """run_alone's request as a lane for its cycle, cached per (dtype, shape, op, in place):
        building one cost an async call waited alone (run_waited) 2.7 of its ~18 us. Its
        ``request`` is never called: these cycles always hold their request."""
        arr = req.array
        assert arr is not None
        key = (arr.dtype, arr.shape, req.op, req.inplace)
        lane = self._alone_lanes.get(key)
        if lane is None:
            staged, parts = self._inline_views(arr)
            average = req.op is ReduceOp.AVERAGE
            if len(self._alone_lanes) > 256:
                self._alone_lanes.clear()
            lane = self._alone_lanes[key] = Lane(
                passed=req.op, op=req.op, combine=ufunc(req.op), average=average,
                scale=float_division(arr.dtype, len(parts)) if average else None, inplace=req.inplace,
                nbytes=arr.nbytes, body=0, staged=staged, parts=parts, request=_held_request)
        return lane

    def _lean_cycle(self, d: int, inline: int, lane: Lane | None, x: np.ndarray | None, name: str,
                    req: Request | None, *, exchanged: bool = False) -> np.ndarray | Handle | None:
        """The lean path's one cycle (the caller holds the baton). Either ``lane`` (its
        staged views carry ``x`` inline) or ``req`` alone (packed inline, or run as its own
        bucket after the exchange). Returns the lane's result when every rank held this
        call; None when ``req`` ran to its handle; the handle the call waits on when the
        others held something else (it joined the queue and this cycle's verdict was
        carried out). ``exchanged``: :meth:`run_lane` ran the exchange already, and not
        every rank held this call."""
        ex = self.exchange
        start = req.submitted if req is not None else 0.0  # a lane's clock starts only if it queues
        try:
            if exchanged:
                held = False
            else:
                if lane is not None:
                    lane.staged[...] = x
                elif inline:
                    fusion.pack_inline([req], ex.payload_out)  # type: ignore[list-item]
                held = self._exchange_one(d, inline)
            self.cycles += 1
            if held:
                out = None
                if lane is not None:
                    self.inline_cycles += 1
                    out = fusion.reduce_with(lane.parts, lane.combine, lane.average, x if lane.inplace else None, lane.scale)
                    if self.timeline is not None and req is not None:
                        fusion.trace_inline(self.timeline, [req], inline, (start, time.perf_counter()))
                elif inline:
                    self.inline_cycles += 1
                    fusion.finish_inline(self.ctx, [req], ex.payloads, inline, self.timeline,  # type: ignore[list-item]
                                         (start, time.perf_counter()))
                else:
                    fusion.execute(self.ctx, [req], self.fusion_threshold, self.timeline)  # type: ignore[list-item]
                    self._settle_trials()
                if self.watch.watching:
                    self.watch.done((name,))
                return out
            # Other ranks hold something else: go on as the queued request would.
            if req is None:
                assert lane is not None and x is not None
                req = lane.request(x, name)
                req.digest, req.submitted = d, time.perf_counter()
                start = req.submitted
            req.handle.attach(self)
            with self._lock:
                self._in_flight.add(req.name)
                self._pending.append(req)
            self._act(ex.verdict(d, 1), [req], False, inline, start)
            self._settle_trials()
            return req.handle
        except BaseException as exc:  # the failure report names this collective
            self._fail(exc, [req] if req is not None else [], name)
        finally:
            self._last_cycle = time.perf_counter()

    def _exchange_one(self, d: int, inline: int) -> bool:
        """This rank's cycle of one call of digest ``d`` (payload ready when ``inline``):
        whether every rank held exactly that call."""
        ex = self.exchange
        due = time.monotonic() >= self.watch.next_check
        if ex.compact:
            ex.run(d, 1, inline=inline, due=due)
            return ex.all_hold(d, 1)
        return ex.run_one(d, inline, due)

    def _inline_views(self, arr: np.ndarray) -> tuple[np.ndarray, list[np.ndarray] | np.ndarray]:
        """Typed, shaped views of this rank's outgoing payload and of every rank's incoming
        one (from :data:`~ddl.engine.fusion.STACKED_FROM` ranks, one strided array of them)."""
        key = (arr.dtype, arr.shape)
        views = self._lean_views.get(key)
        if views is None:
            n, ex = arr.nbytes, self.exchange
            staged = ex.payload_out[:n].view(arr.dtype).reshape(arr.shape)
            parts: list[np.ndarray] | np.ndarray
            if len(ex.payloads) >= fusion.STACKED_FROM:
                parts = ex.stacked_payloads(arr.dtype, arr.shape)
            else:
                parts = [payload[:n].view(arr.dtype).reshape(arr.shape) for payload in ex.payloads]
            if len(self._lean_views) > 256:
                self._lean_views.clear()
            views = self._lean_views[key] = (staged, parts)
        return views


def _held_request(x: np.ndarray, name: str) -> Request:
    """A transient lane's ``request``: its cycle holds the request already, so never called."""
    raise AssertionError(f"a transient lane built no request for {name!r}")
