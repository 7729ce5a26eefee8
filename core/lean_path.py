"""The engine's lean path: a synchronous allreduce run by its caller as one cycle, no queue.

A mixin of :class:`~ddl.engine.Engine` (it uses the engine's baton, buffers and
verdicts), kept apart because it is the one hot path a training step's synchronous
calls take: see :meth:`LeanPath.lean_allreduce` for how it keeps the engine's contract.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from ddl import fusion, negotiation
from ddl.compression import Compression
from ddl.fusion import Request
from ddl.handle import Handle
from ddl.negotiation import INLINE_BYTES
from ddl.ops import ReduceOp

if TYPE_CHECKING:
    from ddl.context import Context
    from ddl.timeline import Timeline
    from ddl.watchdog import StallWatch



class LeanPath:
    """What :class:`~ddl.engine.Engine` adds for synchronous calls with nothing pending."""

    # The engine's state this path shares (set in Engine.__init__).
    ctx: Context
    timeline: Timeline | None
    watch: StallWatch
    compact: bool
    fusion_threshold: int
    cycles: int
    inline_cycles: int
    _thread: threading.Thread | None
    _baton: threading.Lock
    _lock: threading.Lock
    _pending: list[Request]
    _in_flight: set[str]
    _stop: bool
    _finished: bool
    _failure: BaseException | None
    _digests: dict[tuple[Any, ...], int]
    _lean_views: dict[tuple[np.dtype, tuple[int, ...]], tuple[np.ndarray, list[np.ndarray]]]
    _vec: np.ndarray
    _send: np.ndarray
    _recv: np.ndarray
    _send_words: memoryview
    _recv_words: memoryview
    _payload_out: np.ndarray
    _payloads: list[np.ndarray]
    _last_cycle: float

    _digest: Callable[[tuple[Any, ...]], int]
    _act: Callable[[negotiation.Verdict, list[Request], bool, int, float], tuple[bool, bool]]
    _fail: Callable[[BaseException, list[Request]], NoReturn]
    wait_for: Callable[[Handle, float | None], bool]

    def lean_allreduce(self, arr: np.ndarray, descriptor: tuple[Any, ...], op: ReduceOp,
                       inplace: bool) -> np.ndarray | None:
        """A synchronous allreduce run by the caller as one cycle, with no queue; None when
        it cannot (the engine is busy here, or stopping): the caller then submits as usual.

        The cycle exchanges what :meth:`_cycle` would with this request alone pending, so
        other ranks, on this path or not, see the same calls. When every rank holds just
        this request, a small one is reduced from the gathered records (inline) and a
        larger one runs at once as a bucket of its own; when they hold something else,
        the request joins the queue and this cycle's verdict is carried out as usual.
        ``arr``'s dtype must be its own accumulator (not a half type).
        """
        if self._thread is None or self.timeline is not None or not self._baton.acquire(blocking=False):
            return None
        try:
            if self._pending or self._stop or self._finished or self._failure is not None:
                return None
            d = self._digests.get(descriptor) or self._digest(descriptor)
            nbytes = arr.nbytes
            due = time.monotonic() >= self.watch.next_check
            # What fusion.inline_bytes gives this request alone: auto, no compression, fits.
            inline = 0 < nbytes <= INLINE_BYTES and not self.compact and descriptor[5] == "auto"
            req: Request | None = None
            try:
                if self.compact:
                    vec = self._vec
                    vec[0], vec[1], vec[2], vec[3], vec[4], vec[5], vec[6] = d, -d, 1, -1, 0, 0, -1 if due else 0
                    self.ctx.comm.allreduce_native(vec, ReduceOp.MIN)
                    words = vec.tolist()
                    agreed = negotiation.compact_prefix_agreed(words, d, 1)
                else:
                    if inline:
                        views = self._lean_views.get((arr.dtype, arr.shape)) or self._lean_view(arr.dtype, arr.shape)
                        views[0][...] = arr
                    head = self._send_words
                    # Words as in _exchange: digest, one request, not stopping, inline bytes, stall check due.
                    head[0], head[1], head[2], head[3], head[4] = d, 1, 0, nbytes if inline else 0, 1 if due else 0
                    self.ctx.comm.allgather_buffer(self._send, self._recv)
                    agreed = negotiation.all_hold(self._recv_words, len(self._payloads), d, 1)
                self.cycles += 1
                start = time.perf_counter()
                if agreed and inline:
                    self.inline_cycles += 1
                    out = fusion.reduce_payloads(views[1], op, arr if inplace else None)
                else:
                    req = Request("allreduce", descriptor[1], descriptor, Handle(descriptor[1], self), array=arr,
                                  op=op, algorithm=descriptor[5], compression=Compression.none, inplace=inplace,
                                  submitted=start, digest=d)
                    if agreed:
                        fusion.execute(self.ctx, [req], self.fusion_threshold, None)
                        out = req.handle._result
                if agreed:
                    self.watch.done((descriptor[1],))
                    return out  # type: ignore[no-any-return]
                # Other ranks hold something else: go on as the queued request would.
                assert req is not None
                with self._lock:
                    self._in_flight.add(req.name)
                    self._pending.append(req)
                verdict = (negotiation.decide_compact(words, d, 1) if self.compact
                           else negotiation.decide(self._recv_words, len(self._payloads), d, 1))
                self._act(verdict, [req], False, nbytes if inline else 0, start)
            except BaseException as exc:  # the failure report names this collective
                self._fail(exc, [req or Request("allreduce", descriptor[1], descriptor, Handle(descriptor[1]))])
            finally:
                self._last_cycle = time.perf_counter()
        finally:
            self._baton.release()
        assert req is not None
        return req.handle.wait()  # type: ignore[no-any-return]

    def _lean_view(self, dtype: np.dtype, shape: tuple[int, ...]) -> tuple[np.ndarray, list[np.ndarray]]:
        """Typed, shaped views of this rank's outgoing payload and of every rank's incoming one."""
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        staged = self._payload_out[:n].view(dtype).reshape(shape)
        parts = [payload[:n].view(dtype).reshape(shape) for payload in self._payloads]
        if len(self._lean_views) > 256:
            self._lean_views.clear()
        self._lean_views[(dtype, shape)] = views = (staged, parts)
        return views
