"""One host as ddlrun sees it: its agent's start, connection, import and heartbeats, as a pure state machine.

:func:`step` takes a host's :class:`HostState`, one event and the job's
:class:`~ddl.launcher.elastic.timing.Timing`, and returns the next state with the
actions for the supervisor to carry out; it reads no clock and touches no socket, so
every transition is tested in tier 1 (``tests/tier1/test_elastic_machines.py``).

    STARTING --Connected--> IMPORTING --Warmed--> READY
        |                       |                   |
        +--- ProcessEnded,      +--- Closed,        +--- Closed, 6 missed beats (Tick)
             start timeout           start timeout
             (Tick)                  (Tick)
                             all ----> LOST (terminal: the supervisor starts a new agent if the host returns)
"""

from __future__ import annotations

import dataclasses
import enum

from ddl.launcher.elastic.timing import MISSED_BEATS, Timing

#: Every transition of :func:`step`, as the tests name them.
TRANSITIONS: dict[str, str] = {
    "H1": "a starting agent said hello: IMPORTING",
    "H2": "a second hello for a connected host: the new connection is dropped",
    "H3": "a hello from an agent of a lost host: dropped",
    "H4": "any message: the host was heard (at the time it arrived)",
    "H5": "the agent finished importing: READY (logged)",
    "H6": "a warm report when not importing: ignored",
    "H7": "the connection of a connected host closed (or sent what ddlrun cannot read): LOST",
    "H8": "a close before any connection: ignored",
    "H9": "the agent's mpiexec ended before it connected: LOST",
    "H10": "the agent's mpiexec ended after it connected: ignored (the connection decides)",
    "H11": "a ready host missed its heartbeats: LOST",
    "H12": "a host still starting or importing after --start-timeout: LOST",
    "H13": "time passes within the limits: nothing",
    "H14": "anything but a hello for a lost host: ignored",
}


class HostPhase(str, enum.Enum):
    STARTING = "starting"    # its agent's mpiexec -n 1 runs; no connection yet
    IMPORTING = "importing"  # connected, importing the program's modules (beats may stall)
    READY = "ready"          # warm: ranks may be forked there; judged by its heartbeats
    LOST = "lost"            # given up on


@dataclasses.dataclass(frozen=True, kw_only=True)
class HostState:
    name: str
    phase: HostPhase = HostPhase.STARTING
    last_heard: float  # when the agent started, or its last message arrived
    connection: int | None = None
    folder: str | None = None
    warm_seconds: float = 0.0
    lost_why: str = ""

    @property
    def ready(self) -> bool:
        return self.phase is HostPhase.READY

    @property
    def usable_connection(self) -> int | None:
        """The connection to send on, while the host is not lost."""
        return None if self.phase is HostPhase.LOST else self.connection


# -- events --------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Connected:
    """The agent said hello on ``connection``."""

    connection: int
    folder: str
    at: float


@dataclasses.dataclass(frozen=True)
class Heard:
    """A message from the agent arrived (beats included) at ``at``."""

    at: float


@dataclasses.dataclass(frozen=True)
class Warmed:
    """The agent finished importing."""

    seconds: float
    failed: tuple[str, ...]
    at: float


@dataclasses.dataclass(frozen=True)
class Closed:
    """The agent's connection closed (or sent what ddlrun cannot read: ``why``)."""

    at: float
    why: str = "its agent's connection closed"


@dataclasses.dataclass(frozen=True)
class ProcessEnded:
    """The ``mpiexec -n 1`` that started the agent ended."""

    code: int
    at: float


@dataclasses.dataclass(frozen=True)
class HostTick:
    now: float


HostEvent = Connected | Heard | Warmed | Closed | ProcessEnded | HostTick


# -- actions ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class DropConnection:
    """Close ``connection`` (an agent ddlrun has given up on, or a second one for this host)."""

    connection: int


@dataclasses.dataclass(frozen=True)
class DeclareLost:
    """The host is lost: drop its connection, kill its agent, leave it out, end its world."""

    host: str
    why: str


@dataclasses.dataclass(frozen=True)
class HostNote:
    """A line for ddlrun's log."""

    text: str


HostAction = DropConnection | DeclareLost | HostNote


def step(state: HostState, event: HostEvent, timing: Timing) -> tuple[HostState, list[HostAction]]:
    """The host after ``event``, and what the supervisor must do (see :data:`TRANSITIONS`)."""
    phase = state.phase
    if isinstance(event, Connected):
        if phase is HostPhase.STARTING:  # H1
            return dataclasses.replace(state, phase=HostPhase.IMPORTING, connection=event.connection,
                                       folder=event.folder, last_heard=max(state.last_heard, event.at)), []
        return state, [DropConnection(event.connection)]  # H2, H3: a second agent for this host, or lost already
    if phase is HostPhase.LOST:  # H14
        return state, []
    if isinstance(event, Heard):  # H4
        return dataclasses.replace(state, last_heard=max(state.last_heard, event.at)), []
    if isinstance(event, Warmed):
        if phase is not HostPhase.IMPORTING:  # H6
            return state, []
        extra = f"; could not preload {', '.join(sorted(event.failed))}" if event.failed else ""
        return (dataclasses.replace(state, phase=HostPhase.READY, warm_seconds=event.seconds,  # H5
                                    last_heard=max(state.last_heard, event.at)),
                [HostNote(f"agent on {state.name} ready (preloaded in {event.seconds:.1f} s){extra}")])
    if isinstance(event, Closed):  # H7, H8
        return _lost(state, event.why) if phase is not HostPhase.STARTING else (state, [])
    if isinstance(event, ProcessEnded):
        if phase is HostPhase.STARTING:  # H9
            return _lost(state, f"its agent's mpiexec ended with status {event.code}")
        return state, []  # H10: once connected, the connection says whether the agent lives
    silent = event.now - state.last_heard
    if phase is HostPhase.READY:
        if silent > timing.lost_after:  # H11
            return _lost(state, f"its agent missed {MISSED_BEATS} heartbeats (silent for {silent:.2f} s, a beat "
                                f"every {timing.beat:g} s)")
        return state, []  # H13
    if silent > timing.start_timeout:  # H12
        what = "did not connect" if phase is HostPhase.STARTING else "was silent while importing"
        return _lost(state, f"its agent {what} for {timing.start_timeout:g} s (--start-timeout)")
    return state, []  # H13


def _lost(state: HostState, why: str) -> tuple[HostState, list[HostAction]]:
    return dataclasses.replace(state, phase=HostPhase.LOST, lost_why=why), [DeclareLost(state.name, why)]
