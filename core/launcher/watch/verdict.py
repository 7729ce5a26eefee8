"""When a job has failed, and with which status: a pure function of (state, event).

``ddlrun`` feeds every keeper report here (:func:`step`) and carries out the actions. A job
fails, and every rank still running is stopped at once, when a rank

- ends with a non-zero status or a signal (its own status becomes the job's; a rank that
  failed only because another left it waiting, :class:`~ddl.base.errors.RankLeftError`,
  or was stopped from outside, by its launcher killing its keeper's anchor after another
  rank's ``MPI_Abort`` say, defers for :data:`BLAME_WAIT` seconds to a rank that failed
  by itself);
- ends with status 0 after ``ddl.init`` without ddl's shutdown (``os._exit``): the others
  would wait for it forever;
- ends with status 0 without ever calling ``ddl.init`` while other ranks call it (they
  would wait for it in theirs), as Open MPI's ``mpirun`` judges a process that "did not
  call init before exiting, but others in the job did".

A program that is not a ddl program (no rank ever calls ``ddl.init``) fails only by a
non-zero status or a signal.
"""

from __future__ import annotations

import dataclasses
import signal

from ddl.base import notes
from ddl.launcher.watch.protocol import Ended

#: Seconds a rank that failed because another left waits for that rank's own status.
BLAME_WAIT = 3.0
#: Lines of a failed rank's last words in the report.
REPORT_LINES = 8


@dataclasses.dataclass
class RankSeen:
    """What the reports said about one rank."""

    host: str = "?"
    inited: bool = False  # ddl.init began (the last time)
    ready: bool = False
    leaving: bool = False
    done: bool = False  # ddl's shutdown completed after the last init
    failing: str = ""  # the uncaught exception ddl saw
    aborted: int | None = None  # the code it gave MPI_Abort (ddl's, or the program's own)
    blame: int | None = None  # the rank whose leaving made this one fail
    ended: Ended | None = None
    ended_at: float = 0.0

    @property
    def phase(self) -> str:
        """How far it got, in words (``"before ddl.init"`` ...)."""
        if self.done:
            return "after ddl.shutdown"
        if self.leaving:
            return "in ddl.shutdown"
        if self.ready:
            return "after ddl.init"
        if self.inited:
            return "in ddl.init"
        return "before ddl.init"


@dataclasses.dataclass(frozen=True)
class Failure:
    rank: int
    status: int


@dataclasses.dataclass
class WatchState:
    np: int
    ranks: dict[int, RankSeen] = dataclasses.field(default_factory=dict)
    failure: Failure | None = None
    waiting: dict[int, float] = dataclasses.field(default_factory=dict)  # failed rank -> since when
    stopping: bool = False  # ddlrun itself was told to stop: stopped ranks are no failure
    aborter: int | None = None  # the first rank that aborted the job (MPI_Abort): the cause of what follows

    def seen(self, rank: int) -> RankSeen:
        return self.ranks.setdefault(rank, RankSeen())


# -- events ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Joined:
    rank: int
    host: str
    at: float


@dataclasses.dataclass(frozen=True)
class Told:
    rank: int
    note: notes.Note
    at: float


@dataclasses.dataclass(frozen=True)
class RankGone:
    rank: int
    ended: Ended
    at: float


@dataclasses.dataclass(frozen=True)
class Tick:
    at: float


@dataclasses.dataclass(frozen=True)
class Over:
    """Every rank has ended (or mpiexec has): nothing more will come, so no failure waits."""

    at: float


WatchEvent = Joined | Told | RankGone | Tick | Over


# -- actions -----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class EndWorld:
    """The job failed: print ``report`` and stop every rank; ``status`` is the job's."""

    status: int
    report: tuple[str, ...]


Action = EndWorld


def step(state: WatchState, event: WatchEvent) -> list[Action]:
    """Update ``state`` with ``event``; the actions to carry out (at most one :class:`EndWorld`)."""
    if isinstance(event, Joined):
        state.seen(event.rank).host = event.host
        return []
    if isinstance(event, Told):
        return _told(state, event)
    if isinstance(event, RankGone):
        return _gone(state, event)
    if isinstance(event, Over):
        return _tick(state, event.at + BLAME_WAIT + max(state.waiting.values(), default=0.0))
    return _tick(state, event.at)


def _told(state: WatchState, event: Told) -> list[Action]:
    seen, kind = state.seen(event.rank), event.note.kind
    if kind == notes.INIT:
        seen.inited, seen.ready, seen.leaving, seen.done = True, False, False, False
        # A rank that already ended cleanly without ever calling ddl.init leaves this one waiting.
        for q, other in sorted(state.ranks.items()):
            if other.ended is not None and other.ended.status == 0 and not other.inited:
                return _fail(state, q, 1, [f"it never called ddl.init, and rank {event.rank} now waits for it in "
                                           "its own"])
    elif kind == notes.READY:
        seen.ready = True
    elif kind == notes.LEAVING:
        seen.leaving = True
    elif kind == notes.DONE:
        seen.done = True
    elif kind == notes.FAILING:
        seen.failing, seen.blame = event.note.text, event.note.blame
    elif kind == notes.ABORT:
        seen.aborted = event.note.code if event.note.code is not None else 1
        if state.aborter is None:
            state.aborter = event.rank
            if seen.ended is not None and state.failure is None:
                return _fail(state, event.rank, seen.aborted, [])
    return []


def _gone(state: WatchState, event: RankGone) -> list[Action]:
    r, ended = event.rank, event.ended
    seen = state.seen(r)
    seen.ended, seen.ended_at = ended, event.at
    if state.failure is not None:
        return []
    actions: list[Action] = []
    # Ranks that failed because this one left: this one's status decides now.
    for waiter in sorted(q for q in state.waiting if state.ranks[q].blame == r):
        del state.waiting[waiter]
        if ended.status == 0:
            return _fail(state, waiter, state.ranks[waiter].ended.status,  # type: ignore[union-attr]
                         [f"rank {r} had ended normally {seen.phase}"])
    aborter = state.aborter
    if aborter is not None:  # everything that ends now follows from that rank's MPI_Abort
        if r == aborter:
            return _fail(state, r, seen.aborted or ended.status, [])
        if ended.status != 0:
            state.ranks[r].blame = aborter
            state.waiting[r] = event.at
            return actions
    if ended.status != 0 and ended.stopped:
        if not state.stopping:
            state.waiting[r] = event.at  # a consequence, most likely: wait for the cause
        return actions
    if ended.status != 0:
        blame = seen.blame
        if blame is not None and blame != r and blame in state.ranks and state.ranks[blame].ended is None:
            state.waiting[r] = event.at
            return actions
        if blame is not None and blame != r and blame in state.ranks:
            other = state.ranks[blame].ended
            if other is not None and other.status != 0:
                return _fail(state, blame, other.status, [])
        return _fail(state, r, ended.status, [])
    if seen.inited and not seen.done:
        return _fail(state, r, 1, ["it ended without ddl's shutdown (os._exit?), so the other ranks would wait "
                                   "for it in their next collective or shutdown forever"])
    if not seen.inited:
        waiting = [q for q, other in sorted(state.ranks.items()) if other.inited and other.ended is None]
        if waiting:
            return _fail(state, r, 1, [f"it never called ddl.init, while rank(s) {waiting} wait for it in theirs"])
    return actions


def _tick(state: WatchState, now: float) -> list[Action]:
    for r, since in sorted(state.waiting.items()):
        if now - since >= BLAME_WAIT:
            del state.waiting[r]
            ended = state.ranks[r].ended
            assert ended is not None
            blame = state.ranks[r].blame
            why = (f"rank {blame} did not end within {BLAME_WAIT:g} s" if blame is not None else
                   "it was stopped from outside (its keeper's anchor was killed), and no rank failed by itself")
            return _fail(state, r, ended.status, [why])
    return []


def _fail(state: WatchState, r: int, status: int, why: list[str]) -> list[Action]:
    """Record the job's first failure and say it."""
    state.failure = Failure(r, status)
    state.waiting.clear()
    seen = state.seen(r)
    ended = seen.ended
    how = f"aborted the job with error code {seen.aborted}" if seen.aborted is not None else how_it_ended(ended)
    lines = [f"ddlrun: {describe(r, seen)} {how} {seen.phase}" +
             (f"; it raised {seen.failing}" if seen.failing else "")]
    lines += [f"ddlrun:   {text}" for text in why]
    for q, other in sorted(state.ranks.items()):
        if q != r and other.blame == r and other.ended is not None and other.ended.status != 0:
            lines.append(f"ddlrun:   {describe(q, other)} {how_it_ended(other.ended)} because of it")
    if ended is not None and ended.status != 0:
        words = list(ended.last_words)[-REPORT_LINES:]
        lines.append("ddlrun:   its last words on stderr:" if words else "ddlrun:   it wrote nothing on stderr")
        lines += [f"ddlrun:   | {w}" for w in words]
    running = [q for q, other in sorted(state.ranks.items()) if other.ended is None]
    stop = f"stopping rank(s) {running[:16]}{' ...' if len(running) > 16 else ''}; " if running else ""
    lines.append(f"ddlrun: the job failed: {stop}exit status {status}" +
                 (f" (rank {r}'s own)" if ended is not None and ended.status == status else ""))
    return [EndWorld(status, tuple(lines))]


def describe(r: int, seen: RankSeen) -> str:
    return f"rank {r} (host {seen.host})"


def how_it_ended(ended: Ended | None) -> str:
    """``"exited with status 3"``, ``"was killed by signal 9 (SIGKILL)"``."""
    if ended is None:
        return "failed"
    if ended.signal is not None:
        try:
            name = signal.Signals(ended.signal).name
        except ValueError:
            name = "?"
        return f"was killed by signal {ended.signal} ({name})"
    return f"exited with status {ended.code}"
