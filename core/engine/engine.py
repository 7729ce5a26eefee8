"""The engine: one lockstep sequence of *cycles* per rank owns every MPI call after ``init``.

THE CONTRACT: every rank issues the same sequence of MPI calls, whichever thread runs
a cycle. Everything here serves it:

- *One baton*: cycles run under one lock, so a rank's MPI calls never interleave; a
  caller that waits on a handle runs cycles itself when the baton is free (no thread
  hand-off on the critical path), the background thread runs them otherwise.
- *Agree before you act*: a cycle's work is decided from the exchanged words alone
  (:mod:`ddl.engine.codec`, one codec for both exchange modes), so every rank decides alike. Argument errors travel as
  requests too (see :mod:`ddl.engine.collectives`): a call one rank refused is cancelled on
  every rank, with a :class:`~ddl.base.errors.RemoteError` naming that rank.
- *Fail together*: an exception inside a cycle (after the ranks agreed to run
  something) leaves the others inside a collective this rank will never finish, so it
  aborts the job with its message instead of returning to a caller who might catch it.
- *Names are per thread* (:mod:`ddl.engine.naming`); settings that change the call sequence
  are compared at ``init`` (:mod:`ddl.base.config`).
- *One cycle, whoever runs it*: a synchronous call with nothing pending runs, in its
  caller, the very cycle the queue would run with it alone pending
  (:meth:`Engine.run_alone`), and falls back to the queue's verdict when the others
  hold something else; the timeline records it like any other.
- *Shutdown* agrees with every rank to stop and returns only when this engine's
  thread has ended, so the communicator is never freed under it.
- *A leaving rank tells the others*: a rank in shutdown with nothing pending will never
  submit again, and says so in every cycle's record (:data:`~ddl.engine.codec.STOP`, with
  why: its program ended, or an uncaught exception). A rank that holds requests then
  fails them at once with :class:`~ddl.base.errors.RankLeftError` naming the leaving rank
  and its host, instead of waiting for the stall timeout (the ``"abandon"`` verdict, read
  alike on every rank: no rank makes a call the others do not).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import NoReturn

import numpy as np

from ddl.base.errors import DDLError
from ddl.base.ops import ReduceOp
from ddl.engine import codec, failures, fusion, join, negotiation
from ddl.engine.codec import Exchange, Verdict
from ddl.engine.compression import as_compressor
from ddl.engine.context import Context
from ddl.engine.fusion import Request
from ddl.engine.handle import Handle
from ddl.engine.lean_path import LeanPath
from ddl.engine.naming import ThreadNamer
from ddl.engine.negotiation import Descriptor
from ddl.engine.prepared_calls import Lane
from ddl.engine.timeline import Timeline
from ddl.engine.watchdog import StallWatch

__all__ = ["Engine", "Request"]


# Seconds between idle cycles: the first gap after work, doubling while nothing is
# pending, up to the last. Idle cycles only serve stall reports and shutdown (work wakes
# the thread at once), but each one gathers every rank's record: at 16 ranks a cycle
# every 20 ms sent 3.5 MB/s per host, half the bytes on a 200 Mbit/s emulated link
# during a training rehearsal.
_IDLE_MIN = 0.02
_IDLE_MAX = 0.32
#: Cycle times after a submission in which the thread looks by itself (no wake-up needed).
_POLL_CYCLES = 8


class Engine(LeanPath):
    """Cycles of negotiation and execution of collectives for one :class:`Context`."""

    def __init__(
        self, ctx: Context, *, fusion_threshold: int, stall_timeout: float,
        cycle_time: float = 0.002, timeline: Timeline | None = None, start: bool = True,
    ) -> None:
        """``start=False``: the thread waits for :meth:`start_cycles` (init probes first)."""
        self.ctx = ctx
        self.fusion_threshold = fusion_threshold
        self.cycle_time = cycle_time
        self.timeline = timeline
        self.names = ThreadNamer()
        p = ctx.topology.size
        self.watch = StallWatch(ctx.topology.rank, p, stall_timeout, self._abort_job)
        self._pending: list[Request] = []
        self._in_flight: set[str] = set()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._baton = threading.Lock()
        self._digests: dict[Descriptor, int] = {}
        self._name_digests: dict[str, int] = {}
        self._lean_views: dict[tuple[np.dtype, tuple[int, ...]], tuple[np.ndarray, list[np.ndarray] | np.ndarray]] = {}
        self._alone_lanes: dict[tuple[np.dtype, tuple[int, ...], ReduceOp, bool], Lane] = {}
        self._stop = False
        self._stop_word = codec.STOP_END  # why this rank stops (sent while it does)
        self._finished = False
        self._last_submit = 0.0
        self._long_sleep = False
        self._last_cycle = 0.0
        self._idle_gap = _IDLE_MIN
        self._failure: BaseException | None = None
        self._interrupted: BaseException | None = None
        self.exchange = Exchange(ctx.comm)
        self.cycles = 0
        self.slow_cycles = 0
        self.inline_cycles = 0
        self.joined_before: set[int] = set()  # ranks seen in join() by earlier cycles
        self._started = threading.Event()
        if start:
            self._started.set()
        self._thread: threading.Thread | None = None
        if p > 1:
            self._thread = threading.Thread(target=self._loop, name="ddl-engine", daemon=True)
            self._thread.start()

    # -- submission (any thread) ---------------------------------------------------
    def submit(self, req: Request, *, wake: bool = True) -> Handle:
        """Queue ``req``; at world size 1 it runs at once in the caller.

        ``wake=False``: the caller waits on the handle at once (and so runs the cycle).

        Raises:
            DDLError: the engine stopped after an error, or is shutting down.
            ValueError: a request of the same name is still in flight on this rank.
        """
        if self._interrupted is not None:
            raise self._interrupted
        if self._failure is not None:
            raise DDLError(f"the ddl engine has stopped after an error: {self._failure}")
        req.submitted = now = time.perf_counter()
        if not req.digest:  # 0: not computed by the caller
            req.digest = self._digest(req.descriptor)
        if self._thread is None:
            self._execute([req])
            return req.handle
        req.handle.attach(self)
        with self._lock:
            if self._stop:
                raise DDLError("ddl is shutting down; no new collectives are accepted")
            if req.name in self._in_flight:
                raise ValueError(
                    f"a collective named {req.name!r} is already in flight; wait for it or use another name"
                )
            self._in_flight.add(req.name)
            self._pending.append(req)
            self._last_submit = now
            if wake and self._long_sleep:
                # Only then, and once: until the woken thread runs it still reads as
                # asleep, and a backward pass would notify it again for every tensor.
                self._long_sleep = False
                self._wake.notify()
        return req.handle

    def digest_of(self, descriptor: Descriptor) -> int:
        """The digest a request of ``descriptor`` negotiates with (cached for named ones)."""
        return self._digest(descriptor)

    def _digest(self, descriptor: Descriptor) -> int:
        if descriptor.name[0] == "#":  # unnamed: a new name every call, nothing to look up
            return negotiation.digest(descriptor)
        # Training repeats the same named descriptors every step: hash each one once.
        d = self._digests.get(descriptor)
        if d is None:
            if len(self._digests) > 65536:
                self._digests.clear()
            d = self._digests[descriptor] = negotiation.digest(descriptor)
        return d

    def wait_for(self, handle: Handle, timeout: float | None) -> bool:
        """Block until ``handle`` is done, running cycles here while nobody else does.

        Waiting on the baton itself (not on a notification) picks up the result the
        moment the cycle holding it ends.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while not handle._done:
            if self._interrupted is not None:
                raise self._interrupted
            if self._failure is not None:
                raise DDLError(f"the ddl engine has stopped after an error: {self._failure}")
            if self._finished:
                raise DDLError(f"ddl has shut down with collective {handle.name!r} unfinished")
            wait = 0.05 if deadline is None else max(0.0, min(0.05, deadline - time.monotonic()))
            if self._baton.acquire(timeout=wait):
                try:
                    # A request waited on alone (an async call and its synchronize) runs the
                    # lean path's cycle: the same exchange, a fraction of the Python.
                    if not handle._done and not self._finished and not self.run_waited(handle):
                        self._cycle()
                finally:
                    self._baton.release()
            if deadline is not None and not handle._done and time.monotonic() >= deadline:
                return False
        return True

    def cycle_bytes(self) -> int:
        """Bytes one rank sends plus receives in a steady-state cycle."""
        return self.exchange.bytes_per_cycle()

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

    # -- lifecycle -----------------------------------------------------------------
    def start_cycles(self) -> None:
        """Let the thread begin cycling (every rank at the same point, after init's probes)."""
        self._started.set()

    def stop(self, *, failed: bool = False, timeout: float | None = None) -> bool:
        """Finish pending work, agree with all ranks to stop, and return once the thread
        has ended (however long other ranks take to reach their own shutdown).

        From the first cycle on, the others see this rank leaving: what they hold and this
        rank does not fails there at once (:class:`RankLeftError`). ``failed``: it leaves
        after an uncaught exception (their error says so). ``timeout``: give up waiting
        after that many seconds and return False (the engine is then unusable: the
        caller ends the process; the others may still wait in an agreed cycle).
        """
        if self._thread is None:
            self._finished = True
            return True
        with self._wake:
            self._stop = True
            if failed:
                self._stop_word = codec.STOP_FAILED
            self._wake.notify()
        self._thread.join(timeout)
        if self._thread.is_alive():
            return False
        with self._baton:  # a caller's cycle in progress ends before the comm may go
            self._finished = True
        return True

    def discard(self) -> None:
        """End an engine that never started cycling (``init`` failed): no collective."""
        self._finished = True
        self._started.set()
        if self._thread is not None:
            self._thread.join()

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
                        # Except right after submissions: asynchronous calls that their callers
                        # wait on at once, one after another, would each wake the thread, and
                        # a wake-up costs the caller more than a small call (2 ranks on 2
                        # cores: ~25 us against ~20). Then look once a cycle time instead.
                        if self._pending:
                            timeout, self._long_sleep = min(idle, self.cycle_time / 4), False
                        elif time.perf_counter() - self._last_submit < _POLL_CYCLES * self.cycle_time:
                            timeout, self._long_sleep = self.cycle_time, False
                        else:
                            timeout, self._long_sleep = self._idle_gap, True
                        self._wake.wait(timeout)
                        self._long_sleep = False
                    pending, stopping = bool(self._pending), self._stop
                now = time.perf_counter()
                if not stopping and (self._deferred(now) if pending else now - self._last_cycle < self._idle_gap):
                    # Submissions still coming, or callers are cycling: an idle cycle here
                    # would only cost every rank a collective. Look again later.
                    idle = min(idle * 2, self.cycle_time)
                    continue
                seen = self._last_cycle
                with self._baton:
                    if self._finished or self._interrupted is not None:
                        return  # an interrupted world runs no collective again
                    if self._last_cycle != seen and not stopping:
                        continue  # a caller cycled while this thread waited for the baton
                    busy = self._cycle()
                idle = self.cycle_time / 8 if busy else min(idle * 2, self.cycle_time)
                self._idle_gap = _IDLE_MIN if busy or pending else min(2 * self._idle_gap, _IDLE_MAX)
        except BaseException as exc:  # noqa: BLE001 - _cycle has failed the job already
            self._failure = self._failure or exc

    def _deferred(self, now: float) -> bool:
        """While submissions keep coming (a backward pass), wait to batch them, but at
        most a cycle time after the oldest."""
        with self._lock:
            oldest = self._pending[0].submitted if self._pending else now
        return now - self._last_submit < self.cycle_time / 4 and now - oldest < self.cycle_time

    # -- one cycle (baton held) ----------------------------------------------------
    def _cycle(self) -> bool:
        """Negotiate and run what is ready everywhere; True if anything ran."""
        if self._interrupted is not None:
            raise self._interrupted  # the world is over here: no MPI call after interrupt()
        with self._lock:
            batch = list(self._pending)
            stopping = self._stop
        try:
            ran, all_stop = self._negotiate(batch, stopping)
            self._settle_trials()
            self.cycles += 1
            if all_stop and not batch and not ran:
                self._finished = True
        except BaseException as exc:
            self._fail(exc, batch)
        self._last_cycle = time.perf_counter()
        return ran

    def interrupt(self, error: BaseException) -> None:
        """End this rank's part in the world from outside (an elastic world that lost a peer).

        Every pending and later collective raises ``error``, and a cycle waiting politely
        for the others leaves its MPI wait with it; a cycle inside a blocking MPI call
        stays there (ddlrun stops the rank). No collective runs after this: the process
        leaves without ``shutdown``, which the lost peer could never agree to.
        """
        self._interrupted = error
        self.ctx.comm.interrupted = error
        with self._lock:
            for req in self._pending:
                req.handle.set_error(error)
            self._pending.clear()
            self._in_flight.clear()
        with self._wake:
            self._wake.notify()

    def _fail(self, exc: BaseException, batch: list[Request], call: str = "") -> NoReturn:
        """A cycle raised after the ranks agreed on it: fail every waiter here, and end
        the job, because the other ranks wait in a collective this rank left. ``call``:
        the lean path's collective, which has no request in ``batch``."""
        if exc is self._interrupted:
            raise exc  # the world is ending anyway (see interrupt): no abort
        if self.ctx.config.elastic_world and failures.from_mpi(exc):
            # In an elastic world a collective that MPI fails is a peer lost (Horovod's rule):
            # this rank leaves for the next world (elastic.run), nothing is aborted.
            error = failures.peer_lost(self.ctx.config.elastic_world, exc)
            self.interrupt(error)
            raise error
        self._failure = exc
        with self._lock:
            for req in self._pending:
                req.handle.set_error(DDLError(f"ddl engine failed: {exc!r}"))
            self._pending.clear()
        names = [r.name for r in batch] or ([call] if call else [])
        sys.stderr.write(failures.engine_failed(self.ctx.topology.rank, names, exc))
        sys.stderr.flush()
        self._abort_job(1)

    def _abort_job(self, code: int) -> NoReturn:
        self.ctx.comm.abort(code)

    def _negotiate(self, batch: list[Request], stopping: bool) -> tuple[bool, bool]:
        """(whether anything ran or failed, whether all ranks stop)."""
        n = len(batch)
        h = negotiation.combine([r.digest for r in batch])
        # Whether to gather the full lists must be decided alike everywhere (they are
        # collectives), so each rank's "my stall check is due" travels in the exchange.
        due = bool(n) and self.watch.due(time.monotonic())
        inline = fusion.inline_bytes(batch, self.exchange.inline_capacity)
        if inline:
            fusion.pack_inline(batch, self.exchange.payload_out)
        start = time.perf_counter()
        self.exchange.run(h, n, stop=self._stop_word if stopping else 0, inline=inline, due=due)
        return self._act(self.exchange.verdict(h, n), batch, stopping, inline, start, h)

    def _act(self, verdict: Verdict, batch: list[Request], stopping: bool, inline: int,
             start: float, h: int = 0) -> tuple[bool, bool]:
        """Carry out this cycle's ``verdict`` on ``batch`` (what this rank exchanged, whose
        combined digest is ``h``)."""
        n = len(batch)
        if stopping:
            self.watch.waiting_to_stop(verdict.waiting_to_stop)
        if verdict.action == "run":
            self._take(batch)
            if verdict.inline:
                self.inline_cycles += 1
                fusion.finish_inline(self.ctx, batch, self.exchange.payloads, inline, self.timeline,
                                     (start, time.perf_counter()))
            else:
                self._execute(batch, digest=h)
            return n > 0, verdict.all_stop
        if verdict.action == "abandon":
            if batch:
                self._abandon(batch, verdict.left)
            return n > 0, verdict.all_stop
        if verdict.action == "prefix":
            ready, h = self._common_prefix(batch, verdict.prefix)
            if ready:
                self._execute(ready, digest=h)
                return True, verdict.all_stop
        if verdict.action in ("prefix", "match"):
            self.watch.checked(time.monotonic())
            return self._match(batch), verdict.all_stop
        return False, verdict.all_stop

    def _abandon(self, batch: list[Request], left: tuple[tuple[int, int], ...]) -> None:
        """Some rank is leaving (in shutdown, nothing pending) while this one holds ``batch``:
        none of it can ever run, so every request fails now, naming who left."""
        self._take(batch)
        for req in batch:  # an error each: one raised from several handles would pile up tracebacks
            req.handle.set_error(failures.rank_left(batch, left, self.ctx.describe_rank, self.ctx.topology.rank,
                                                    self.exchange.compact))

    def _common_prefix(self, batch: list[Request], m: int) -> tuple[list[Request], int]:
        """Ranks caught at different points of the same submission order (a backward pass
        seen mid-way): one more small round checks their first ``m`` requests agree
        (returned with their combined digest; none if they do not)."""
        h = negotiation.combine([r.digest for r in batch[:m]])
        self.exchange.run(h, m)
        if self.exchange.all_hold(h, m):
            self._take(batch[:m])
            return batch[:m], h
        return [], 0

    def _settle_trials(self) -> None:
        """End of a cycle (either path): where a bucket ran the last trial of a size class,
        every rank did the same in this very cycle, so all agree on the trials' times here
        (:mod:`ddl.reduction.trials`) and settle alike."""
        trials = self.ctx.trials
        if trials is not None and trials.awaiting:
            times = np.array(trials.agreement(), np.float64)
            self.ctx.comm.allreduce_native(times, ReduceOp.MAX)
            trials.settle(times.tolist())

    def _name_digest(self, name: str) -> int:
        d = self._name_digests.get(name)
        if d is None:
            if len(self._name_digests) > 65536:
                self._name_digests.clear()
            d = self._name_digests[name] = negotiation.name_digest(name)
        return d

    def _match(self, batch: list[Request]) -> bool:
        """The slow path: gather every rank's descriptors and pair them by name."""
        self.slow_cycles += 1
        everyone = self.ctx.comm.allgather_object([r.descriptor for r in batch])
        result = negotiation.match(everyone)
        joined = join.joined_ranks(everyone)
        if self.ctx.topology.rank in joined:
            # Waiting in join(): the others' unnamed calls count as made here too, or the
            # names of every unnamed call after the join would differ between the ranks.
            for descriptors in everyone:
                for d in descriptors:
                    self.names.catch_up(d.name)
        substitutes = join.resolve(everyone, result, joined)
        now = time.monotonic()
        if result.missing:
            doing = {q: [d.name for d in descriptors] for q, descriptors in enumerate(everyone)}
            for name, have in result.missing.items():
                self.watch.missing(name, have, now, doing, self.ctx.describe_rank)
        mine = {r.name: r for r in batch}
        ready = [mine.get(name) or _stand_in(substitutes[name]) for name in result.ready]
        failed = [(mine[name], why) for name, why in result.failed.items() if name in mine]
        self._take([r for r in ready if r.name in mine] + [r for r, _ in failed])  # not the stand-ins
        for req, (failing, message) in failed:
            req.handle.set_error(failures.not_run_together(req, failing, message, self.ctx.topology.rank))
        if joined and self.ctx.config.join_average == "contributors":
            # Ranks that joined contribute zeros; Average divides by those that did not
            # (DDL_JOIN_AVERAGE=contributors; Horovod's rule, the default, divides by all).
            contributors = self.ctx.topology.size - len(joined)
            for req in ready:
                if req.kind == "allreduce":
                    req.divisor = max(contributors, 1)
        finishing = any(r.kind == join.JOIN_KIND for r in ready)
        self._execute(ready, solo=not joined)
        if not finishing:
            self.joined_before.update(joined)
        return bool(ready or failed)

    def last_joined(self) -> int:
        """The result of ``join()`` (run in the cycle in which every rank holds it): the
        rank that joined last. Forgets the joined ranks for the next ``join``."""
        last = join.last_to_join(self.ctx.topology.size, self.joined_before)
        self.joined_before = set()
        return last

    def _execute(self, ready: list[Request], *, solo: bool = True, digest: int = 0) -> None:
        """Run agreed requests in the agreed order; refused calls end with their error.
        ``digest``: the combined digest of exactly ``ready`` (0: not known)."""
        if any(r.kind == "error" for r in ready):
            for r in ready:
                if r.kind == "error":
                    assert r.error is not None
                    r.handle.set_error(r.error)
            ready, digest = [r for r in ready if r.kind != "error"], 0
        if ready:
            fusion.execute(self.ctx, ready, self.fusion_threshold, self.timeline, solo=solo, digest=digest)

    def _take(self, done: list[Request]) -> None:
        if not done:
            return
        with self._lock:
            if len(done) == len(self._pending):
                self._pending = []
            else:
                ids = {id(r) for r in done}
                self._pending = [r for r in self._pending if id(r) not in ids]
            self._in_flight.difference_update(r.name for r in done)
        # Names are reused every step; one seen missing once and then run on the fast
        # path must not keep its old clock, or a later brief skew reads as a long stall.
        self.watch.done(r.name for r in done)


def _stand_in(desc: Descriptor) -> Request:
    """A joined rank's zero request for an allreduce the working ranks agreed on."""
    pre, post = join.scales_of(desc)
    return Request("allreduce", desc.name, desc, Handle(desc.name), array=join.stand_in(desc), op=join.op_of(desc),
                   algorithm=desc.algorithm, compression=as_compressor(desc.compression), inplace=True,
                   prescale=pre, postscale=post)
