"""A host agent's decisions as a pure state machine: what ddlrun, the stubs and the ranks say in, what to do out.

:func:`step` takes the agent's :class:`AgentState`, one event and the job's
:class:`~ddl.launcher.elastic.timing.Timing`, and returns the next state and the actions
the agent's loop (:mod:`ddl.launcher.elastic.agent`) carries out: kill a rank, send a
message to ddlrun, a rank or a stub, end the agent. It reads no clock and touches no
process (transitions A1..A15 of :data:`TRANSITIONS`, each tested in
``tests/tier1/test_elastic_machines.py``). Ranks are known by their process id.
"""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Mapping

from ddl.launcher.elastic.timing import Timing
from ddl.runtime.elastic.protocol import (
    AnnounceHosts,
    Beat,
    EndCause,
    HostsUpdated,
    Message,
    Ping,
    Quit,
    RankBeat,
    RankEnded,
    RankProgress,
    RankReport,
    RankStarted,
    Step,
    StopWhy,
    StopWorld,
    StubExit,
    WorldLost,
)

TRANSITIONS: dict[str, str] = {
    "A1": "a ping from ddlrun: ddlrun is still there",
    "A2": "ddlrun announced other hosts: the linked ranks of that world (and older) are told",
    "A3": "ddlrun stops a world that lost a host: its linked ranks are told (their collectives raise) and "
          "killed after the grace; unlinked ones at once",
    "A4": "ddlrun stops a world for another reason: its ranks are killed",
    "A5": "ddlrun says quit: the agent ends (its ranks with it)",
    "A6": "ddlrun's connection closed: the agent ends",
    "A7": "a rank was forked for a stub: ddlrun is told",
    "A8": "a rank linked up: told at once if its world was announced already",
    "A9": "a rank reported progress: relayed to ddlrun with its world and rank",
    "A10": "a rank's stub went away (mpiexec tore the world down): the rank is killed",
    "A11": "a rank's stub got a signal: the rank gets it",
    "A12": "a rank ended: ddlrun learns how (its status, and who ended it), its stub ends alike",
    "A13": "a rank told of a lost host is still there after the grace: killed",
    "A14": "a heartbeat is due: sent",
    "A15": "nothing from ddlrun for --elastic-timeout: the agent ends its host's ranks (fences itself)",
    "A16": "a rank's own heartbeat (or any word from it) arrived: it is alive, however slow its steps",
    "A17": "a linked rank silent for the rank bound (stopped, or not scheduled: frozen) that has not said it leaves "
           "(done, reset, failed: its interpreter's exit beats no more): killed, ddlrun learns it was frozen",
    "A18": "a rank forked for a world ddlrun already stopped (its stub came late): killed at once",
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class RankEntry:
    pid: int
    world: int
    rank: int
    linked: bool = False
    killed_because: EndCause | None = None
    kill_at: float | None = None  # told its world lost a host: killed then if still running
    heard: float = 0.0  # its last word (link, report, beat); judged once it linked
    leaving: bool = False  # it reported done, a reset or a failure: its interpreter's exit beats no more


@dataclasses.dataclass(frozen=True, kw_only=True)
class AgentState:
    host: str
    last_heard: float  # from ddlrun
    ranks: Mapping[int, RankEntry] = dataclasses.field(default_factory=dict)
    announced_world: int = 0
    stopped_world: int = 0  # the newest world ddlrun stopped (its ranks, and older ones, have no place)
    next_beat: float = 0.0
    beats: int = 0


# -- events --------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class FromSupervisor:
    message: Ping | StopWorld | AnnounceHosts | Quit
    at: float


@dataclasses.dataclass(frozen=True)
class SupervisorGone:
    at: float


@dataclasses.dataclass(frozen=True)
class RankForked:
    pid: int
    world: int
    rank: int


@dataclasses.dataclass(frozen=True)
class RankLinked:
    pid: int
    at: float


@dataclasses.dataclass(frozen=True)
class RankSaid:
    """A rank's report or heartbeat arrived at ``at``."""

    pid: int
    report: RankReport | RankBeat
    at: float


@dataclasses.dataclass(frozen=True)
class StubGone:
    pid: int


@dataclasses.dataclass(frozen=True)
class StubSignalled:
    pid: int
    sig: int


@dataclasses.dataclass(frozen=True)
class RankExited:
    """The rank was reaped: ``code`` as ``os.waitstatus_to_exitcode`` gives it (negative: a signal)."""

    pid: int
    code: int


@dataclasses.dataclass(frozen=True)
class AgentTick:
    now: float


AgentEvent = (FromSupervisor | SupervisorGone | RankForked | RankLinked | RankSaid | StubGone | StubSignalled
              | RankExited | AgentTick)


# -- actions ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class KillRank:
    pid: int
    sig: int = signal.SIGKILL


@dataclasses.dataclass(frozen=True)
class TellSupervisor:
    message: Message


@dataclasses.dataclass(frozen=True)
class TellRank:
    pid: int
    message: HostsUpdated | WorldLost


@dataclasses.dataclass(frozen=True)
class TellStub:
    """Send the rank's stub its end, then forget the stub."""

    pid: int
    message: StubExit


@dataclasses.dataclass(frozen=True)
class EndAgent:
    why: str


@dataclasses.dataclass(frozen=True)
class Log:
    """A line for the agent's output."""

    text: str


AgentAction = KillRank | TellSupervisor | TellRank | TellStub | EndAgent | Log


#: Reports after which a rank is on its way out (its beating thread stops with the interpreter's exit).
_LEAVING = frozenset({Step.DONE, Step.RESET, Step.FAILED})


def step(state: AgentState, event: AgentEvent, timing: Timing) -> tuple[AgentState, list[AgentAction]]:
    """The agent after ``event``, and what its loop must do (see :data:`TRANSITIONS`)."""
    if isinstance(event, FromSupervisor):
        return _from_supervisor(dataclasses.replace(state, last_heard=max(state.last_heard, event.at)),
                                event.message, event.at, timing)
    if isinstance(event, SupervisorGone):  # A6
        return state, [EndAgent("ddlrun closed the connection; ending")]
    if isinstance(event, RankForked):  # A7
        state = _with(state, RankEntry(pid=event.pid, world=event.world, rank=event.rank))
        started = TellSupervisor(RankStarted(host=state.host, world=event.world, rank=event.rank, pid=event.pid))
        if event.world <= state.stopped_world:  # A18
            state, kill = _kill(state, state.ranks[event.pid], EndCause.STOP)
            return state, [started, *kill]
        return state, [started]
    if isinstance(event, AgentTick):
        return _tick(state, event.now, timing)
    known = state.ranks.get(event.pid)
    if known is None:
        return state, []
    entry = known
    if isinstance(event, RankLinked):  # A8
        state = _with(state, dataclasses.replace(entry, linked=True, heard=event.at))
        return state, [TellRank(entry.pid, HostsUpdated())] if entry.world <= state.announced_world else []
    if isinstance(event, RankSaid):
        report = event.report
        leaving = entry.leaving or (isinstance(report, RankReport) and report.step in _LEAVING)
        state = _with(state, dataclasses.replace(entry, heard=max(entry.heard, event.at), leaving=leaving))  # A16
        if isinstance(report, RankBeat):
            return state, []
        return state, [TellSupervisor(RankProgress(host=state.host, world=entry.world, rank=entry.rank,  # A9
                                                   step=report.step, serial=report.serial, reason=report.reason,
                                                   detail=report.detail))]
    if isinstance(event, StubGone):  # A10
        return _kill(state, entry, EndCause.STUB) if entry.killed_because is None else (state, [])
    if isinstance(event, StubSignalled):  # A11
        return _kill(state, entry, EndCause.STUB, event.sig) if entry.killed_because is None else (state, [])
    # A12: RankExited
    cause = entry.killed_because or (EndCause.SIGNAL if event.code < 0 else EndCause.EXIT)
    ranks = {pid: e for pid, e in state.ranks.items() if pid != entry.pid}
    return dataclasses.replace(state, ranks=ranks), [
        TellSupervisor(RankEnded(host=state.host, world=entry.world, rank=entry.rank, code=event.code, cause=cause)),
        TellStub(entry.pid, StubExit(code=event.code))]


def _from_supervisor(state: AgentState, message: Ping | StopWorld | AnnounceHosts | Quit, at: float,
                     timing: Timing) -> tuple[AgentState, list[AgentAction]]:
    if isinstance(message, Ping):  # A1
        return state, []
    if isinstance(message, Quit):  # A5
        return state, [EndAgent("ddlrun says the job is over")]
    if isinstance(message, AnnounceHosts):  # A2
        announced = max(state.announced_world, message.world)
        state = dataclasses.replace(state, announced_world=announced)
        return state, [TellRank(e.pid, HostsUpdated()) for e in state.ranks.values()
                       if e.world <= announced and e.linked]
    actions: list[AgentAction] = []  # A3, A4: StopWorld
    state = dataclasses.replace(state, stopped_world=max(state.stopped_world, message.world))
    for entry in list(state.ranks.values()):
        if entry.world > message.world or entry.killed_because is not None:
            continue
        if message.why is StopWhy.LOST and entry.linked:
            if entry.kill_at is None:
                # Its collectives raise HorovodInternalError first (elastic.run restores and
                # leaves); one blocked inside an MPI call is killed when the grace ends.
                state = _with(state, dataclasses.replace(entry, kill_at=at + timing.lost_grace))
                actions.append(TellRank(entry.pid, WorldLost(world=entry.world, lost=list(message.lost))))
        else:
            state, more = _kill(state, entry, EndCause.STOP)
            actions += more
    return state, actions


def _tick(state: AgentState, now: float, timing: Timing) -> tuple[AgentState, list[AgentAction]]:
    if now - state.last_heard > timing.fence_after:  # A15
        return state, [EndAgent(f"nothing from ddlrun for {timing.fence_after:g} s; ending this host's ranks "
                                "(it may be cut off from the job)")]
    actions: list[AgentAction] = []
    for entry in list(state.ranks.values()):
        if entry.killed_because is not None:
            continue
        if entry.kill_at is not None and now >= entry.kill_at:  # A13
            state, more = _kill(state, entry, EndCause.STOP)
            actions += more
        elif entry.linked and not entry.leaving and now - entry.heard > timing.rank_silent_after:  # A17
            state, more = _kill(state, entry, EndCause.FROZEN)
            actions += [Log(f"rank {entry.rank} of world {entry.world} (pid {entry.pid}) sent nothing for "
                            f"{now - entry.heard:.1f} s (frozen: stopped, or not scheduled); killing it"), *more]
    if now >= state.next_beat:  # A14
        state = dataclasses.replace(state, beats=state.beats + 1, next_beat=now + timing.beat)
        actions.append(TellSupervisor(Beat(host=state.host, seq=state.beats)))
    return state, actions


def _kill(state: AgentState, entry: RankEntry, cause: EndCause,
          sig: int = signal.SIGKILL) -> tuple[AgentState, list[AgentAction]]:
    return _with(state, dataclasses.replace(entry, killed_because=cause)), [KillRank(entry.pid, sig)]


def _with(state: AgentState, entry: RankEntry) -> AgentState:
    return dataclasses.replace(state, ranks={**state.ranks, entry.pid: entry})
