"""Every message of an elastic job, typed and versioned: what each process may say to which, and with what fields.

Four kinds of process talk (``ddlrun``'s supervisor, one agent per host, the stub
``mpiexec`` starts per rank, the forked rank), over two transports: TCP between the
supervisor and the agents, a unix socket in the host's folder between an agent and its
stubs and ranks (:mod:`ddl.runtime.elastic.wire`). Each message is one class here with
its :attr:`~Message.kind`, its :attr:`~Message.route` and its fields; :func:`encode`
writes ``{"v": VERSION, "t": kind, ...fields}`` and :func:`decode` reads it back into
the class, refusing another protocol version, an unknown kind or a missing or mistyped
field with a :class:`ProtocolError` that says which. Standard library only: the stub
imports this before anything heavy.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from typing import Any, ClassVar

#: The protocol's version; every message carries it, and a peer speaking another is refused.
VERSION = 3


class ProtocolError(ValueError):
    """A message this process cannot take: another version, an unknown kind, a bad field."""


class Route(str, enum.Enum):
    """Who sends a message to whom."""

    AGENT_TO_SUPERVISOR = "agent -> supervisor"
    SUPERVISOR_TO_AGENT = "supervisor -> agent"
    STUB_TO_AGENT = "stub -> agent"
    AGENT_TO_STUB = "agent -> stub"
    RANK_TO_AGENT = "rank -> agent"
    AGENT_TO_RANK = "agent -> rank"


class Step(str, enum.Enum):
    """How far a rank has come in its world (what it reports)."""

    SYNCED = "synced"      # state.sync() done: the rank trains from the newest commit
    COMMIT = "commit"      # state.commit() done
    RESET = "reset"        # leaving for the next world (reason: at a commit, or after a failed collective)
    DONE = "done"          # the training function returned
    FAILED = "failed"      # the training function raised (reason EXCEPTION; detail: the exception)


class Reason(str, enum.Enum):
    """Why a rank reports what it reports (the supervisor branches on it, never on text)."""

    NONE = "none"
    HOSTS_UPDATED = "hosts_updated"            # HostsUpdatedInterrupt: every rank leaves at this commit
    COLLECTIVE_FAILED = "collective_failed"    # HorovodInternalError: a collective failed (a peer lost)
    EXCEPTION = "exception"                    # any other exception of the program: the job's error


class EndCause(str, enum.Enum):
    """Why a rank's process ended, as its agent saw it."""

    EXIT = "exit"          # it exited by itself (its status)
    SIGNAL = "signal"      # killed by a signal nobody in ddl sent: the host is suspect
    STOP = "stop"          # killed because ddlrun said stop
    STUB = "stub"          # its stub went away or was signalled: mpiexec tore the world down
    FROZEN = "frozen"      # killed by its agent: no heartbeat from it for the bound (stopped, not scheduled)


class StopWhy(str, enum.Enum):
    """Why ddlrun ends a world."""

    LOST = "lost"          # a host of it was lost: ranks get WorldLost first, then are killed
    RESET = "reset"        # a rank left after a failed collective, or ranks did not leave at a commit
    ERROR = "error"        # an error of the program
    DONE = "done"          # the job is over (or ddlrun was interrupted)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Message:
    """A message: its kind and route are the class's, its fields the dataclass's."""

    kind: ClassVar[str]
    route: ClassVar[Route]
    about: ClassVar[str]


# -- agent -> supervisor (TCP) -------------------------------------------------------------

@dataclasses.dataclass(frozen=True, kw_only=True)
class AgentHello(Message):
    kind: ClassVar[str] = "hello"
    route: ClassVar[Route] = Route.AGENT_TO_SUPERVISOR
    about: ClassVar[str] = "the agent's first message: which host of the list it serves, and its folder"
    host: str
    pid: int
    folder: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Beat(Message):
    kind: ClassVar[str] = "beat"
    route: ClassVar[Route] = Route.AGENT_TO_SUPERVISOR
    about: ClassVar[str] = "the agent's heartbeat, at a rate derived from --elastic-timeout (missed ones: lost)"
    host: str
    seq: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class AgentWarm(Message):
    kind: ClassVar[str] = "warm"
    route: ClassVar[Route] = Route.AGENT_TO_SUPERVISOR
    about: ClassVar[str] = "the program's modules are imported: ranks may be forked here"
    host: str
    seconds: float
    imported: list[str]
    failed: dict[str, str]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RankStarted(Message):
    kind: ClassVar[str] = "started"
    route: ClassVar[Route] = Route.AGENT_TO_SUPERVISOR
    about: ClassVar[str] = "a rank of a world was forked on this host"
    host: str
    world: int
    rank: int
    pid: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class RankEnded(Message):
    kind: ClassVar[str] = "ended"
    route: ClassVar[Route] = Route.AGENT_TO_SUPERVISOR
    about: ClassVar[str] = "a rank's process ended: its status (negative: the signal) and why"
    host: str
    world: int
    rank: int
    code: int
    cause: EndCause


@dataclasses.dataclass(frozen=True, kw_only=True)
class RankProgress(Message):
    kind: ClassVar[str] = "progress"
    route: ClassVar[Route] = Route.AGENT_TO_SUPERVISOR
    about: ClassVar[str] = "a rank's report (RankReport), with the world and rank its agent knows it by"
    host: str
    world: int
    rank: int
    step: Step
    serial: int
    reason: Reason = Reason.NONE
    detail: str = ""


# -- supervisor -> agent (TCP) -------------------------------------------------------------

@dataclasses.dataclass(frozen=True, kw_only=True)
class Ping(Message):
    kind: ClassVar[str] = "ping"
    route: ClassVar[Route] = Route.SUPERVISOR_TO_AGENT
    about: ClassVar[str] = "ddlrun is still there (an agent that hears nothing for elastic-timeout fences itself)"
    seq: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class StopWorld(Message):
    kind: ClassVar[str] = "stop"
    route: ClassVar[Route] = Route.SUPERVISOR_TO_AGENT
    about: ClassVar[str] = "end the ranks of this world (and older ones) on this host (lost: the hosts it lost)"
    world: int
    why: StopWhy
    lost: list[str]


@dataclasses.dataclass(frozen=True, kw_only=True)
class AnnounceHosts(Message):
    kind: ClassVar[str] = "announce"
    route: ClassVar[Route] = Route.SUPERVISOR_TO_AGENT
    about: ClassVar[str] = "the hosts changed: tell this world's ranks (they leave at their next commit)"
    world: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class Quit(Message):
    kind: ClassVar[str] = "quit"
    route: ClassVar[Route] = Route.SUPERVISOR_TO_AGENT
    about: ClassVar[str] = "the job is over: end every rank, remove the host's folder, exit"


# -- stub <-> agent (unix socket) ------------------------------------------------------------

@dataclasses.dataclass(frozen=True, kw_only=True)
class LaunchRank(Message):
    kind: ClassVar[str] = "launch"
    route: ClassVar[Route] = Route.STUB_TO_AGENT
    about: ClassVar[str] = "fork a rank: the program, its environment and folder; stdio and PMI socket attached"
    argv: list[str]
    env: dict[str, str]
    cwd: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class ForwardSignal(Message):
    kind: ClassVar[str] = "signal"
    route: ClassVar[Route] = Route.STUB_TO_AGENT
    about: ClassVar[str] = "the stub got SIGINT/SIGTERM/SIGHUP (from mpiexec): pass it to the rank"
    sig: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class StubExit(Message):
    kind: ClassVar[str] = "exit"
    route: ClassVar[Route] = Route.AGENT_TO_STUB
    about: ClassVar[str] = "the rank ended: the stub ends alike (its status, or its signal)"
    code: int


# -- rank <-> agent (unix socket) -------------------------------------------------------------

@dataclasses.dataclass(frozen=True, kw_only=True)
class RankLink(Message):
    kind: ClassVar[str] = "link"
    route: ClassVar[Route] = Route.RANK_TO_AGENT
    about: ClassVar[str] = "the rank's first message on its own connection: its process id"
    pid: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class RankReport(Message):
    kind: ClassVar[str] = "report"
    route: ClassVar[Route] = Route.RANK_TO_AGENT
    about: ClassVar[str] = "how far the rank has come (relayed to ddlrun as RankProgress)"
    step: Step
    serial: int
    reason: Reason = Reason.NONE
    detail: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RankBeat(Message):
    kind: ClassVar[str] = "rank-beat"
    route: ClassVar[Route] = Route.RANK_TO_AGENT
    about: ClassVar[str] = ("the rank's own heartbeat (a thread of its link, at the agents' rate): a linked rank "
                            "silent for the rank bound is frozen")
    seq: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class HostsUpdated(Message):
    kind: ClassVar[str] = "update"
    route: ClassVar[Route] = Route.AGENT_TO_RANK
    about: ClassVar[str] = "ddlrun announced other hosts: leave at the next commit (HostsUpdatedInterrupt)"


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorldLost(Message):
    kind: ClassVar[str] = "lost"
    route: ClassVar[Route] = Route.AGENT_TO_RANK
    about: ClassVar[str] = "a host of this world was lost: waiting collectives raise HorovodInternalError"
    world: int
    lost: list[str]


#: Every message class, by kind.
KINDS: dict[str, type[Message]] = {cls.kind: cls for cls in (
    AgentHello, Beat, AgentWarm, RankStarted, RankEnded, RankProgress,
    Ping, StopWorld, AnnounceHosts, Quit,
    LaunchRank, ForwardSignal, StubExit,
    RankLink, RankReport, RankBeat, HostsUpdated, WorldLost,
)}

# Field checks by annotation (the module's own annotations are strings: no typing at run time).
_CHECKS: dict[str, Any] = {
    "str": lambda v: isinstance(v, str),
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "list[str]": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    "dict[str, str]": lambda v: isinstance(v, dict) and all(isinstance(k, str) and isinstance(x, str)
                                                            for k, x in v.items()),
}
_ENUMS: dict[str, type[enum.Enum]] = {e.__name__: e for e in (Step, Reason, EndCause, StopWhy)}


def fields_of(cls: type[Message]) -> list[tuple[str, str]]:
    """(name, type) of each field of a message class, in order (for the docs' table and the checks)."""
    return [(f.name, str(f.type)) for f in dataclasses.fields(cls)]


def to_dict(message: Message) -> dict[str, Any]:
    """``message`` as the JSON object that travels."""
    out: dict[str, Any] = {"v": VERSION, "t": message.kind}
    for f in dataclasses.fields(message):
        value = getattr(message, f.name)
        out[f.name] = value.value if isinstance(value, enum.Enum) else value
    return out


def encode(message: Message) -> bytes:
    """One message as a line of compact JSON."""
    return json.dumps(to_dict(message), separators=(",", ":")).encode() + b"\n"


def decode(data: dict[str, Any], *, expect: Route | tuple[Route, ...] | None = None) -> Message:
    """The message ``data`` (a JSON object read from a line) holds.

    Args:
        expect: the route(s) this reader takes; a message of another is refused.

    Raises:
        ProtocolError: another protocol version, an unknown kind, a missing, unknown or
            mistyped field, or a message on the wrong route; the text says which.

    Example:
        >>> decode({"v": VERSION, "t": "stop", "world": 3, "why": "lost", "lost": ["h3"]})
        StopWorld(world=3, why=<StopWhy.LOST: 'lost'>, lost=['h3'])
    """
    version = data.get("v")
    if version != VERSION:
        raise ProtocolError(f"an elastic message of protocol version {version!r}, but this ddl speaks version "
                            f"{VERSION}: install the same ddl on every host ({_clip(data)})")
    cls = KINDS.get(data.get("t"))  # type: ignore[arg-type]
    if cls is None:
        raise ProtocolError(f"unknown elastic message kind {data.get('t')!r}; known: {', '.join(KINDS)}")
    routes = (expect,) if isinstance(expect, Route) else expect
    if routes is not None and cls.route not in routes:
        raise ProtocolError(f"elastic message {cls.kind!r} travels {cls.route.value}, not "
                            f"{' or '.join(r.value for r in routes)}")
    values: dict[str, Any] = {}
    names = set()
    for f in dataclasses.fields(cls):
        names.add(f.name)
        if f.name not in data:
            if f.default is not dataclasses.MISSING:
                continue
            raise ProtocolError(f"elastic message {cls.kind!r} lacks its field {f.name!r} ({_clip(data)})")
        values[f.name] = _field(cls.kind, f.name, str(f.type), data[f.name])
    extra = set(data) - names - {"v", "t"}
    if extra:
        raise ProtocolError(f"elastic message {cls.kind!r} has unknown field(s) {sorted(extra)}; "
                            f"its fields: {sorted(names)}")
    return cls(**values)


def _field(kind: str, name: str, annotation: str, value: Any) -> Any:
    if annotation in _ENUMS:
        try:
            return _ENUMS[annotation](value)
        except ValueError:
            allowed = ", ".join(m.value for m in _ENUMS[annotation])
            raise ProtocolError(f"elastic message {kind!r}: field {name!r} is {value!r}; one of {allowed}") from None
    if not _CHECKS[annotation](value):
        raise ProtocolError(f"elastic message {kind!r}: field {name!r} must be {annotation}, got {value!r}")
    return float(value) if annotation == "float" else value


def _clip(data: dict[str, Any]) -> str:
    text = json.dumps(data)
    return text if len(text) <= 200 else text[:200] + "..."
