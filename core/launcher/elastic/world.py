"""One ``mpiexec`` world of an elastic job as a pure state machine: its ranks' reports in, the supervisor's actions out.

:func:`step` takes a :class:`WorldState`, one event and the job's
:class:`~ddl.launcher.elastic.timing.Timing`, and returns the next state and the
actions; it reads no clock and starts no process, so every transition is tested in
tier 1 (``tests/tier1/test_elastic_machines.py``; the transitions are numbered W1..W20
there and in :data:`TRANSITIONS`).

A world is STARTING until every rank has synced, then RUNNING; an end (every rank done,
an error of the program, a lost host, ranks leaving for the next world) makes it
ENDING, and once its ranks are gone (or :attr:`Timing.ending` has passed) it is CLOSED
with an :class:`Ending` that the job acts on: done, error, or a next world (lost, reset).
"""

from __future__ import annotations

import dataclasses
import enum
import signal
from collections.abc import Mapping

from ddl.launcher.elastic.membership import WorldPlan
from ddl.launcher.elastic.timing import Timing
from ddl.runtime.elastic.protocol import EndCause, Reason, Step, StopWhy
from ddl.runtime.elastic.wire import RESET_EXIT

#: Signals a process gets from its own fault (a crash), not from outside; MPI may send a survivor of a
#: lost peer there, so they count against a host only when nothing else explains them.
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGFPE, signal.SIGILL})

#: Every transition of :func:`step`, as the tests name them.
TRANSITIONS: dict[str, str] = {
    "W1": "a rank was forked: counted as started",
    "W2": "a rank synced; when the last one has, the world is RUNNING (logged)",
    "W3": "rank 0's first commit is logged",
    "W4": "a rank left after a failed collective (reason collective_failed): the others are stopped (reset); "
          "a rank that ended early before it is judged at once (W14, W21, W23): it broke the collective; "
          "after a rank raised (W22) it is that error of the program: the world ends (error, status 1)",
    "W5": "rank 0 leaves at a commit for the next world (reason hosts_updated): logged",
    "W6": "a rank's training function returned (done): recorded",
    "W7": "a rank was killed by a signal nobody in ddl sent: noted, judged after the settle time (MPI may crash "
          "the survivors of a peer's loss: another end or a lost host may explain it)",
    "W8": "a rank left at a commit (status 75): the world ends (reset) and the others leave by themselves",
    "W9": "a rank ended by itself before it finished (before init, mid-step, after raising; any status but 75, "
          "or status 0 without done): noted, judged after the settle time",
    "W10": "mpiexec ended a rank's stub (MPI_Abort, or a failure elsewhere): noted as an error to judge",
    "W11": "any other rank end (status 0 after done, stopped, or while the world ends): recorded",
    "W12": "a host of this world was lost: its ranks are stopped (lost); ignored for another host",
    "W13": "every rank ended with status 0: the world ends (done)",
    "W14": "an early end no lost host explained within the settle time, of a rank that raised (or after done, or "
           "by MPI_Abort): an error of the program, the world ends (error)",
    "W15": "mpiexec ended before every rank reported: the hosts whose ranks never started fail (lost), "
           "or the job ends (error)",
    "W16": "ranks did not all sync within --start-timeout: the hosts whose ranks never started fail (lost), "
           "or the job ends (error)",
    "W17": "every rank synced and the hosts changed: the ranks are told (they leave at the next commit)",
    "W18": "ranks told to leave at a commit have not after a while: stopped again",
    "W19": "an ending world whose forked ranks are gone (those never forked are not waited for), or that took "
           "too long: CLOSED",
    "W20": "ddlrun ends (interrupted, or the job is over): the ranks are stopped",
    "W21": "an early end no lost host explained within the settle time, of a rank that did not raise (it exited, "
           "before init or mid-step): a lost rank, its host fails, the world ends (lost)",
    "W22": "a rank's training function raised (failed): recorded with the exception, its end follows",
    "W23": "only deaths by signal are unexplained after the settle time: the hosts of ranks killed from outside "
           "(SIGKILL...) fail, or, with none, those of ranks that crashed (SIGSEGV...); the world ends (lost)",
    "W24": "a rank killed by its agent for silence (frozen): its host fails at once, the world ends (lost)",
}


class WorldPhase(str, enum.Enum):
    STARTING = "starting"  # mpiexec started; not every rank has synced
    RUNNING = "running"    # every rank synced
    ENDING = "ending"      # an end was decided; waiting for the ranks to go
    CLOSED = "closed"      # done with: the job acts on the ending


class Ending(str, enum.Enum):
    DONE = "done"    # every rank finished: the job is done
    ERROR = "error"  # an error of the program: the job ends with its status
    LOST = "lost"    # a host was lost: the next world
    RESET = "reset"  # the ranks left at a commit (hosts changed, or a failed collective): the next world


@dataclasses.dataclass(frozen=True, kw_only=True)
class RankEnd:
    code: int
    cause: EndCause


@dataclasses.dataclass(frozen=True, kw_only=True)
class EarlyEnd:
    """A rank that ended before its world did (status 0: mpiexec ended it, for a STUB cause), judged
    after :attr:`Timing.settle`: a lost host may explain it, or every other rank may end too."""

    rank: int
    code: int
    cause: EndCause
    at: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorldState:
    number: int
    plan: WorldPlan
    started: float
    phase: WorldPhase = WorldPhase.STARTING
    forked: frozenset[int] = frozenset()
    synced: frozenset[int] = frozenset()
    exits: Mapping[int, RankEnd] = dataclasses.field(default_factory=dict)
    ending: Ending | None = None
    ending_since: float = 0.0
    lost_hosts: frozenset[str] = frozenset()
    early: tuple[EarlyEnd, ...] = ()  # ranks that ended early, in the order heard; judged together
    done: frozenset[int] = frozenset()  # ranks whose training function returned
    raised: Mapping[int, str] = dataclasses.field(default_factory=dict)  # rank -> the exception it reported
    status: int = 0  # the job's status when the world ends in an error
    announced: bool = False
    mpiexec_ended_at: float | None = None
    first_commit_logged: bool = False

    def running(self) -> list[int]:
        """Ranks that have not ended."""
        return [r for r in range(self.plan.np) if r not in self.exits]


# -- events --------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class WorldRankStarted:
    rank: int


@dataclasses.dataclass(frozen=True)
class WorldRankProgress:
    rank: int
    step: Step
    serial: int
    at: float
    reason: Reason = Reason.NONE
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class WorldRankEnded:
    rank: int
    code: int
    cause: EndCause
    at: float


@dataclasses.dataclass(frozen=True)
class HostLost:
    host: str
    why: str
    at: float


@dataclasses.dataclass(frozen=True)
class WorldTick:
    """Time passes. ``mpiexec_code``: the world's mpiexec's status once it ended (None while it
    runs); ``desired``: the world the hosts ready now would make (None: no change to announce)."""

    now: float
    mpiexec_code: int | None = None
    desired: WorldPlan | None = None


@dataclasses.dataclass(frozen=True)
class Shutdown:
    at: float


WorldEvent = WorldRankStarted | WorldRankProgress | WorldRankEnded | HostLost | WorldTick | Shutdown


# -- actions ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class StopRanks:
    """Tell the agents of this world's hosts to end its ranks (``lost``: the hosts it lost, for their words)."""

    world: int
    why: StopWhy
    lost: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Announce:
    """Tell the agents of this world's hosts that the hosts changed (ranks leave at the next commit)."""

    world: int


@dataclasses.dataclass(frozen=True)
class FailHost:
    """Leave ``host`` out of the next worlds (its agent stays: ddlrun did not lose it)."""

    host: str


@dataclasses.dataclass(frozen=True)
class WorldNote:
    text: str


@dataclasses.dataclass(frozen=True)
class Close:
    """The world is over: kill what is left of its mpiexec; ``status`` is the error's, if any."""

    world: int
    ending: Ending
    status: int = 0


WorldAction = StopRanks | Announce | FailHost | WorldNote | Close


def step(state: WorldState, event: WorldEvent, timing: Timing) -> tuple[WorldState, list[WorldAction]]:
    """The world after ``event``, and what the supervisor must do (see :data:`TRANSITIONS`)."""
    if state.phase is WorldPhase.CLOSED:
        return state, []
    if isinstance(event, WorldRankStarted):  # W1
        return dataclasses.replace(state, forked=state.forked | {event.rank}), []
    if isinstance(event, WorldRankProgress):
        return _progress(state, event)
    if isinstance(event, WorldRankEnded):
        return _rank_ended(state, event)
    if isinstance(event, HostLost):  # W12
        if event.host not in state.plan.names:
            return state, []
        return _host_failed(state, event.host, event.why, event.at)
    if isinstance(event, Shutdown):  # W20
        return _end(state, Ending.DONE, event.at, StopWhy.DONE)
    if state.ending is None:
        return _tick_live(state, event, timing)
    return _tick_ending(state, event, timing)


def _progress(state: WorldState, event: WorldRankProgress) -> tuple[WorldState, list[WorldAction]]:
    if event.step is Step.SYNCED:  # W2
        synced = state.synced | {event.rank}
        state = dataclasses.replace(state, synced=synced)
        if len(synced) == state.plan.np and state.phase is WorldPhase.STARTING:
            start = f"from commit {event.serial}" if event.serial else "nothing committed yet"
            return dataclasses.replace(state, phase=WorldPhase.RUNNING), [
                WorldNote(f"world {state.number}: every rank synced, {start}")]
        return state, []
    if event.step is Step.COMMIT:  # W3
        if event.rank == 0 and not state.first_commit_logged:
            return dataclasses.replace(state, first_commit_logged=True), [
                WorldNote(f"world {state.number}: first commit ({event.serial})")]
        return state, []
    if event.step is Step.RESET and event.reason is Reason.COLLECTIVE_FAILED:  # W4
        if state.ending is not None:
            return state, []
        if state.early:
            return _judge(state, event.at)  # what broke the collective
        if state.raised:  # a rank raised first and is leaving with it: that broke the collective
            rank, detail = min(state.raised.items())
            ended, actions = _end(dataclasses.replace(state, status=1), Ending.ERROR, event.at, StopWhy.ERROR)
            return ended, [WorldNote(f"world {state.number}: rank {rank} raised {detail}, then rank {event.rank}'s "
                                     "collective failed: an error of the program, not a lost host; ending the job"),
                           *actions]
        # A collective failed there: the others wait for it in one and cannot reach a commit.
        ended, actions = _end(state, Ending.RESET, event.at, StopWhy.RESET)
        return ended, [WorldNote(f"world {state.number}: rank {event.rank} left after a failed collective "
                            f"(HorovodInternalError); stopping the other ranks, the next world resumes from "
                            f"commit {event.serial}"), *actions]
    if event.step is Step.RESET:  # W5
        if event.rank == 0:
            return state, [WorldNote(f"world {state.number}: the ranks leave at commit {event.serial} for the next world")]
        return state, []
    if event.step is Step.FAILED:  # W22
        return dataclasses.replace(state, raised={**state.raised, event.rank: event.detail}), []
    return dataclasses.replace(state, done=state.done | {event.rank}), []  # W6


def _rank_ended(state: WorldState, event: WorldRankEnded) -> tuple[WorldState, list[WorldAction]]:
    state = dataclasses.replace(state, exits={**state.exits, event.rank: RankEnd(code=event.code, cause=event.cause)})
    if state.ending is not None:
        return state, []  # W11
    host = state.plan.host_of(event.rank)
    if event.cause is EndCause.FROZEN:  # W24
        why = (f"rank {event.rank} sent no heartbeat for the rank bound (frozen: stopped, or not scheduled); "
               "its agent killed it")
        failed, actions = _host_failed(state, host, why, event.at)
        return failed, [FailHost(host), *actions]
    if event.cause is EndCause.EXIT and event.code == RESET_EXIT:  # W8
        return _end(state, Ending.RESET, event.at, None)
    early = (*state.early, EarlyEnd(rank=event.rank, code=event.code, cause=event.cause, at=event.at))
    if event.cause is EndCause.SIGNAL:  # W7
        return dataclasses.replace(state, early=early), []
    if event.cause is EndCause.EXIT and (event.code != 0 or event.rank not in state.done):  # W9
        return dataclasses.replace(state, early=early), []
    if event.cause is EndCause.STUB:  # W10: MPI_Abort, or a lost host that will show within the settle time
        return dataclasses.replace(state, early=early), []
    return state, []  # W11


def _tick_live(state: WorldState, event: WorldTick, timing: Timing) -> tuple[WorldState, list[WorldAction]]:
    now, n = event.now, state.plan.np
    if len(state.exits) == n and all(end.code == 0 for end in state.exits.values()):  # W13
        return _end(state, Ending.DONE, now, None)
    if state.early and now - state.early[0].at > timing.settle:
        return _judge(state, now)
    if event.mpiexec_code is not None and len(state.exits) < n:  # W15
        since = state.mpiexec_ended_at if state.mpiexec_ended_at is not None else now
        state = dataclasses.replace(state, mpiexec_ended_at=since)
        if now - since <= timing.mpiexec_grace:
            return state, []
        return _never_started(state, now, f"mpiexec ended (status {event.mpiexec_code}) before its ranks started there",
                              f"mpiexec ended with status {event.mpiexec_code} before every rank reported",
                              event.mpiexec_code or 1)
    if now - state.started > timing.start_timeout and len(state.synced) < n:  # W16
        return _never_started(state, now, f"its ranks did not start in {timing.start_timeout:g} s",
                              f"the ranks did not all sync in {timing.start_timeout:g} s (--start-timeout)", 1)
    desired = event.desired  # W17
    if (not state.announced and len(state.synced) == n and desired is not None
            and desired.hosts != state.plan.hosts
            and (desired.np > n or any(h not in desired.names for h in state.plan.names))):
        return dataclasses.replace(state, announced=True), [
            WorldNote(f"world {state.number}: hosts changed, next world {desired}; every rank leaves at its next commit"),
            Announce(state.number)]
    return state, []


def _judge(state: WorldState, now: float) -> tuple[WorldState, list[WorldAction]]:
    """What the early ends of this world mean, no lost host having explained them: an error of the
    program (W14) first; else the first rank that exited by itself is a lost rank (W21), and the
    deaths by signal that followed are taken for what its loss did to MPI; else the hosts of the
    ranks killed by a signal fail (W23)."""
    for early in state.early:
        if early.cause is EndCause.STUB or early.rank in state.raised or early.rank in state.done:  # W14
            return _program_error(state, early, now)
    exited = [e for e in state.early if e.cause is EndCause.EXIT]
    if exited:  # W21
        early = exited[0]
        host = state.plan.host_of(early.rank)
        failed, lost = _host_failed(state, host, f"rank {early.rank} exited with status {early.code} before it "
                                                 "finished (a lost rank)", now)
        return failed, [FailHost(host), *lost]
    # W23: signals sent from outside (SIGKILL: the OOM killer, an operator) before crashes (SIGSEGV,
    # SIGABRT: what MPI may do to a survivor), which count only when nothing else explains them.
    killed = [e for e in state.early if -e.code not in CRASH_SIGNALS] or list(state.early)
    actions: list[WorldAction] = []
    for early in killed:
        host = state.plan.host_of(early.rank)
        if host not in state.lost_hosts:
            state, more = _host_failed(state, host, f"rank {early.rank} was killed by signal {-early.code}", now)
            actions += [FailHost(host), *more]
    return state, actions


def _program_error(state: WorldState, early: EarlyEnd, now: float) -> tuple[WorldState, list[WorldAction]]:
    if early.cause is EndCause.STUB:
        how = f"mpiexec ended rank {early.rank} (MPI_Abort: an uncaught exception on some rank)"
    elif early.rank in state.raised:
        how = f"rank {early.rank} raised {state.raised[early.rank]} and exited with status {early.code}"
    else:
        how = f"rank {early.rank} exited with status {early.code} after its training function returned"
    state = dataclasses.replace(state, status=early.code if early.cause is EndCause.EXIT else 0)
    ended, actions = _end(state, Ending.ERROR, now, StopWhy.ERROR)
    return ended, [WorldNote(f"world {state.number}: {how}: an error of the program, not a lost host; ending the job"),
                   *actions]


def _never_started(state: WorldState, now: float, host_why: str, job_why: str,
                   status: int) -> tuple[WorldState, list[WorldAction]]:
    """The hosts whose ranks never started fail, when they are some but not all of the world's
    (those hosts are the problem); otherwise the job ends (the problem is everywhere)."""
    hosts = sorted({state.plan.host_of(r) for r in state.running() if r not in state.forked})
    if hosts and len(hosts) < len(state.plan.names):
        actions: list[WorldAction] = []
        for host in hosts:
            state, more = _host_failed(state, host, host_why, now)
            actions += [FailHost(host), *more]
        return state, actions
    state = dataclasses.replace(state, status=status)
    ended, actions = _end(state, Ending.ERROR, now, StopWhy.ERROR)
    return ended, [WorldNote(f"world {state.number}: {job_why}; ending the job"), *actions]


def _tick_ending(state: WorldState, event: WorldTick, timing: Timing) -> tuple[WorldState, list[WorldAction]]:
    now = event.now
    # Ranks never forked are stubs inside this world's mpiexec, which Close kills (a stub that reaches
    # its agent after the stop has its rank killed there at once: A18): nobody waits for them.
    alive = [r for r in state.running() if state.plan.host_of(r) not in state.lost_hosts and r in state.forked]
    if alive and now - state.ending_since < timing.ending:
        if state.ending is Ending.RESET and now - state.ending_since > timing.restop:  # W18
            return dataclasses.replace(state, ending_since=now), [StopRanks(state.number, StopWhy.RESET)]
        return state, []
    status = state.status if state.ending is Ending.ERROR else 0  # W19
    assert state.ending is not None
    return dataclasses.replace(state, phase=WorldPhase.CLOSED), [Close(state.number, state.ending, status)]


def _host_failed(state: WorldState, host: str, why: str, now: float) -> tuple[WorldState, list[WorldAction]]:
    state = dataclasses.replace(state, lost_hosts=state.lost_hosts | {host})
    note = WorldNote(f"world {state.number}: lost host {host} ({why}); stopping its other ranks")
    if state.ending in (None, Ending.RESET, Ending.ERROR):
        ended, actions = _end(state, Ending.LOST, now, StopWhy.LOST)
        return ended, [note, *actions]
    return state, [note]


def _end(state: WorldState, ending: Ending, now: float, stop: StopWhy | None) -> tuple[WorldState, list[WorldAction]]:
    state = dataclasses.replace(state, phase=WorldPhase.ENDING, ending=ending, ending_since=now)
    if stop is None:
        return state, []
    return state, [StopRanks(state.number, stop, tuple(sorted(state.lost_hosts)) if stop is StopWhy.LOST else ())]
