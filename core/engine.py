"""The engine: one lockstep sequence of *cycles* per rank owns every MPI call after ``init``.

Callers submit named requests and get :class:`~ddl.handle.Handle` objects. Each cycle
the ranks agree on what is ready everywhere with one Allgather of a fixed record per
rank: a hash of the rank's pending list, its length, a stop flag, and up to
:data:`~ddl.fusion.INLINE_BYTES` of payload. Equal hashes mean equal lists: the batch
runs (a small allreduce batch is already done, reduced from the payloads). Otherwise
the full lists are gathered and requests are matched by name (unnamed ones by
submission order), so ranks may submit in different orders. Requests that share a
name but not a shape/dtype/op fail with a MismatchError on every rank; a request
missing on some ranks for the stall timeout is reported and aborts the job.

Cycles run under one lock (the *baton*), so MPI calls stay in one order per rank. A
caller that waits on a pending handle runs cycles itself when the baton is free
(no thread hand-off on the critical path); the background thread runs them when
nobody waits — after submissions have paused, or a cycle time after the oldest one —
and keeps idle ranks answering the others' cycles.
"""

from __future__ import annotations

import hashlib
import sys
import threading
import time
from typing import Any

import numpy as np

from ddl import fusion
from ddl.context import Context
from ddl.errors import DDLError, MismatchError
from ddl.fusion import INLINE_BYTES, Request
from ddl.handle import Handle
from ddl.negotiation import describe_mismatch, digest
from ddl.timeline import Timeline

__all__ = ["Engine", "Request"]

_HEADER = 5  # int64 words: digest, batch length, stop flag, inline payload bytes, stall check due
_RECORD = _HEADER * 8 + INLINE_BYTES
_MASK = (1 << 62) - 1
_IDLE_MAX = 0.02  # seconds between idle cycles once nothing has been pending for a while


class Engine:
    """Cycles of negotiation and execution of collectives for one :class:`Context`."""

    def __init__(
        self, ctx: Context, *, fusion_threshold: int, stall_timeout: float,
        cycle_time: float = 0.002, timeline: Timeline | None = None, start: bool = True,
    ) -> None:
        """``start=False``: the thread waits for :meth:`start_cycles` (init probes first)."""
        self.ctx = ctx
        self.fusion_threshold = fusion_threshold
        self.stall_timeout = stall_timeout
        self.cycle_time = cycle_time
        self.timeline = timeline
        self._pending: list[Request] = []
        self._names: set[str] = set()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._baton = threading.Lock()
        self._digests: dict[tuple[Any, ...], int] = {}
        self._seq = 0
        self._stop = False
        self._finished = False
        self._last_submit = 0.0
        self._long_sleep = False
        self._last_cycle = 0.0
        self._next_stall_check = 0.0
        self._waiting_since: dict[str, float] = {}
        self._warned: set[str] = set()
        self._failure: BaseException | None = None
        p = ctx.topology.size
        self._send = np.zeros(_RECORD, np.uint8)
        self._recv = np.zeros(p * _RECORD, np.uint8)
        # Header words through memoryviews: numpy calls on tiny arrays cost microseconds.
        self._send_words = memoryview(self._send.data).cast("q")
        self._recv_words = memoryview(self._recv.data).cast("q")
        self._payload_out = self._send[_HEADER * 8 :]
        self._payloads = [self._recv[q * _RECORD + _HEADER * 8 : (q + 1) * _RECORD] for q in range(p)]
        self.cycles = 0
        self.slow_cycles = 0
        self.inline_cycles = 0
        self._started = threading.Event()
        if start:
            self._started.set()
        self._thread: threading.Thread | None = None
        if p > 1:
            self._thread = threading.Thread(target=self._loop, name="ddl-engine", daemon=True)
            self._thread.start()

    # -- submission (any thread) ---------------------------------------------------
    def next_name(self) -> str:
        """A name for an unnamed request: one counter for every kind, so ranks that call
        different collectives at the same point collide on the name and get a MismatchError."""
        with self._lock:
            self._seq += 1
            return f"#{self._seq}"

    def submit(self, req: Request, *, wake: bool = True) -> Handle:
        """Queue ``req``; at world size 1 it runs at once in the caller.

        ``wake=False``: the caller waits on the handle at once (and so runs the cycle).
        """
        if self._failure is not None:
            raise DDLError(f"the ddl engine has stopped after an error: {self._failure}")
        req.submitted = now = time.perf_counter()
        # Training repeats the same descriptors every step: hash each one once.
        d = self._digests.get(req.descriptor)
        if d is None:
            d = digest(req.descriptor)
            if req.name[0] != "#":  # unnamed ones never repeat
                if len(self._digests) > 65536:
                    self._digests.clear()
                self._digests[req.descriptor] = d
        req.digest = d
        if self._thread is None:
            fusion.execute(self.ctx, [req], self.fusion_threshold, self.timeline)
            return req.handle
        req.handle._waiter = self
        with self._lock:
            if self._stop:
                raise DDLError("ddl is shutting down; no new collectives are accepted")
            if req.name in self._names:
                raise ValueError(
                    f"a collective named {req.name!r} is already in flight; wait for it or use another name"
                )
            self._names.add(req.name)
            self._pending.append(req)
            self._last_submit = now
            if wake and self._long_sleep:
                self._wake.notify()  # only then: waking it for every submission costs the caller
        return req.handle

    def wait_for(self, handle: Handle, timeout: float | None) -> bool:
        """Block until ``handle`` is done, running cycles here while nobody else does.

        Waiting on the baton itself (not on a notification) picks up the result the
        moment the cycle holding it ends.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while not handle._done:
            if self._failure is not None:
                raise DDLError(f"the ddl engine has stopped after an error: {self._failure}")
            if self._finished:
                raise DDLError(f"ddl has shut down with collective {handle.name!r} unfinished")
            wait = 0.05 if deadline is None else max(0.0, min(0.05, deadline - time.monotonic()))
            if self._baton.acquire(timeout=wait):
                try:
                    if not handle._done and not self._finished:
                        self._cycle()
                finally:
                    self._baton.release()
            if deadline is not None and not handle._done and time.monotonic() >= deadline:
                return False
        return True

    def time_cycle(self, reps: int = 50) -> float:
        """Median seconds of one negotiation cycle with nothing pending: what the checks
        cost per step. Collective: every rank calls it at the same point."""
        times = []
        with self._baton:
            for _ in range(reps):
                t0 = time.perf_counter()
                self._cycle()
                times.append(time.perf_counter() - t0)
        return sorted(times)[len(times) // 2]

    def stop(self, timeout: float = 30.0) -> None:
        """Finish pending work, agree with all ranks to stop, and join the thread."""
        if self._thread is None:
            return
        with self._wake:
            self._stop = True
            self._wake.notify()
        self._thread.join(timeout)

    # -- the loop (engine thread) --------------------------------------------------
    def start_cycles(self) -> None:
        """Let the thread begin cycling (every rank at the same point, after init's probes)."""
        self._started.set()

    def _loop(self) -> None:
        idle = self.cycle_time / 8
        self._started.wait()
        try:
            while not self._finished:
                with self._wake:
                    if not self._stop:
                        # Nothing pending here: nothing can become ready anywhere until this
                        # rank submits (which wakes the thread), so sleep long and give the
                        # core to the training loop; idle cycles only serve stop and stall reports.
                        self._long_sleep = not self._pending
                        self._wake.wait(min(idle, self.cycle_time / 4) if self._pending else _IDLE_MAX)
                        self._long_sleep = False
                    pending, stopping = bool(self._pending), self._stop
                now = time.perf_counter()
                if not stopping and (self._deferred(now) if pending else now - self._last_cycle < _IDLE_MAX):
                    # Submissions still coming, or callers are cycling: an idle cycle here
                    # would only cost every rank a collective. Look again later.
                    idle = min(idle * 2, self.cycle_time)
                    continue
                seen = self._last_cycle
                with self._baton:
                    if self._finished:
                        return
                    if self._last_cycle != seen and not stopping:
                        continue  # a caller cycled while this thread waited for the baton
                    busy = self._cycle()
                idle = self.cycle_time / 8 if busy else min(idle * 2, self.cycle_time)
        except BaseException as exc:  # noqa: BLE001 - fail every waiter, then the job
            self._fail(exc)
            raise

    def _deferred(self, now: float) -> bool:
        """While submissions keep coming (a backward pass), wait to batch them, but at
        most a cycle time after the oldest."""
        with self._lock:
            oldest = self._pending[0].submitted if self._pending else now
        return now - self._last_submit < self.cycle_time / 4 and now - oldest < self.cycle_time

    def _fail(self, exc: BaseException) -> None:
        self._failure = exc
        with self._lock:
            for req in self._pending:
                req.handle.set_error(DDLError(f"ddl engine failed: {exc!r}"))
            self._pending.clear()

    # -- one cycle (baton held) ----------------------------------------------------
    def _cycle(self) -> bool:
        """Negotiate and run what is ready everywhere; True if anything ran."""
        with self._lock:
            batch = list(self._pending)
            stopping = self._stop
        try:
            ready, ran, all_stop = self._negotiate(batch, stopping)
            self.cycles += 1
            if ready:
                fusion.execute(self.ctx, ready, self.fusion_threshold, self.timeline)
            if all_stop and not batch and not ran:
                self._finished = True
        except BaseException as exc:
            self._fail(exc)
            raise
        self._last_cycle = time.perf_counter()
        return ran

    def _negotiate(self, batch: list[Request], stopping: bool) -> tuple[list[Request], bool, bool]:
        """(requests to execute, whether anything ran or failed, whether all ranks stop)."""
        comm, p = self.ctx.comm, self.ctx.topology.size
        n = len(batch)
        h = _combine([r.digest for r in batch])
        inline = fusion.inline_bytes(batch)
        head = self._send_words
        # Whether to gather the full lists must be decided alike everywhere (they are
        # collectives), so each rank's "my stall check is due" travels in the header.
        due = 1 if n and time.monotonic() >= self._next_stall_check else 0
        head[0], head[1], head[2], head[3], head[4] = h, n, 1 if stopping else 0, inline, due
        if inline:
            fusion.pack_inline(batch, self._payload_out)
        start = time.perf_counter()
        comm.allgather_buffer(self._send, self._recv)
        words, stride = self._recv_words, _RECORD // 8
        same, all_stop, everyone_has, check = True, True, True, False
        for q in range(0, p * stride, stride):
            same = same and words[q] == h and words[q + 1] == n
            all_stop = all_stop and words[q + 2] != 0
            everyone_has = everyone_has and words[q + 1] > 0
            check = check or words[q + 4] != 0
        if same:
            self._take(batch)
            if inline:
                self.inline_cycles += 1
                span = (start, time.perf_counter())
                fusion.finish_inline(self.ctx, batch, self._payloads, inline, self.timeline, span)
                return [], True, all_stop
            return batch, n > 0, all_stop
        if everyone_has:
            ready = self._common_prefix(batch, min(words[q + 1] for q in range(0, p * stride, stride)))
            if ready:
                return ready, True, all_stop
        # A rank with nothing pending (often just a cycle early) makes nothing ready:
        # skip gathering the lists, except now and then to watch for stalls.
        if everyone_has or check:
            self._next_stall_check = time.monotonic() + min(1.0, self.stall_timeout / 8)
            return self._match(batch, all_stop)
        return [], False, all_stop

    def _common_prefix(self, batch: list[Request], m: int) -> list[Request]:
        """Ranks caught at different points of the same submission order (a backward pass
        seen mid-way): one more small round checks their first ``m`` requests agree."""
        head = self._send_words
        head[0], head[1], head[3], head[4] = _combine([r.digest for r in batch[:m]]), m, 0, 0
        self.ctx.comm.allgather_buffer(self._send, self._recv)
        words, stride, p = self._recv_words, _RECORD // 8, self.ctx.topology.size
        if all(words[q] == head[0] and words[q + 1] == m for q in range(0, p * stride, stride)):
            self._take(batch[:m])
            return batch[:m]
        return []

    def _match(self, batch: list[Request], all_stop: bool) -> tuple[list[Request], bool, bool]:
        """The slow path: gather every rank's descriptors and match them by name."""
        self.slow_cycles += 1
        everyone: list[list[tuple[Any, ...]]] = self.ctx.comm.allgather_object([r.descriptor for r in batch])
        mine = {r.name: r for r in batch}
        tables = [{d[1]: d for d in lst} for lst in everyone]
        ready: list[Request] = []
        failed: list[tuple[Request, str]] = []
        now = time.monotonic()
        seen: set[str] = set()
        for lst in everyone:
            for d in lst:
                name = d[1]
                if name in seen:
                    continue
                seen.add(name)
                have = [r for r, t in enumerate(tables) if name in t]
                if len(have) < len(tables):
                    self._watch_stall(name, have, len(tables), now)
                    continue
                self._waiting_since.pop(name, None)
                descs = [t[name] for t in tables]
                req = mine[name]
                if any(x != descs[0] for x in descs):
                    failed.append((req, describe_mismatch(descs)))
                else:
                    ready.append(req)
        self._take(ready + [r for r, _ in failed])
        for req, message in failed:
            req.handle.set_error(MismatchError(f"tensor {req.name!r}: {message}"))
        return ready, bool(ready or failed), all_stop

    def _take(self, done: list[Request]) -> None:
        if not done:
            return
        with self._lock:
            if len(done) == len(self._pending):
                self._pending = []
            else:
                ids = {id(r) for r in done}
                self._pending = [r for r in self._pending if id(r) not in ids]
            self._names.difference_update(r.name for r in done)

    def _watch_stall(self, name: str, have: list[int], size: int, now: float) -> None:
        first = self._waiting_since.setdefault(name, now)
        waited = now - first
        missing = [r for r in range(size) if r not in have]
        text = (f"tensor {name!r} was submitted by rank(s) {have} but not by rank(s) {missing} "
                f"for {waited:.1f} s")
        if waited >= self.stall_timeout:
            sys.stderr.write(f"ddl: rank {self.ctx.topology.rank}: stall: {text}; aborting the job "
                             f"(DDL_STALL_TIMEOUT={self.stall_timeout:g})\n")
            sys.stderr.flush()
            self.ctx.comm.abort(1)
        elif waited >= self.stall_timeout / 2 and name not in self._warned:
            self._warned.add(name)
            sys.stderr.write(f"ddl: rank {self.ctx.topology.rank}: warning: {text}\n")
            sys.stderr.flush()


def _combine(digests: list[int]) -> int:
    """One 62-bit hash of an ordered list of request digests."""
    if not digests:
        return 0
    if len(digests) == 1:
        return digests[0]
    raw = hashlib.blake2b(np.array(digests, dtype=np.int64).tobytes(), digest_size=8).digest()
    return int.from_bytes(raw, "little") & _MASK
