"""The messages between ddlrun's nodes when no ssh is at hand (a TrainJob's pods), and the pure steps on them.

Every node runs ``ddlrun``; node 0 (the master) listens on the master port. Each other
node connects, says :class:`Hello` (its node rank, the node count and ranks per node it
was given, its host name) and waits. Once every node has joined, the master starts MPICH's
``mpiexec -launcher manual``, which prints one ``hydra_pmi_proxy`` command line per host
instead of running ssh; the master sends each node its own (:class:`Assign`), runs proxy 0
itself, and when the job ends sends every node its status (:class:`Done`). A node the
master cannot take hears why (:class:`Refuse`). One JSON object a line, versioned.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping, Sequence

VERSION = 1


class NodeProtocolError(ValueError):
    """A line that is not a message of this protocol's version; the text says what came."""


@dataclasses.dataclass(frozen=True)
class Hello:
    """A node joins: who it is and the world it was told."""

    node_rank: int
    nnodes: int
    nproc_per_node: int
    hostname: str
    kind: str = "hello"


@dataclasses.dataclass(frozen=True)
class Assign:
    """The master's answer: the hydra proxy command this node runs."""

    proxy: tuple[str, ...]
    kind: str = "assign"


@dataclasses.dataclass(frozen=True)
class Refuse:
    """The master will not take this node; ``reason`` says why and what to do."""

    reason: str
    kind: str = "refuse"


@dataclasses.dataclass(frozen=True)
class Done:
    """The job ended with ``status`` (the master's ddlrun exit status)."""

    status: int
    kind: str = "done"


Message = Hello | Assign | Refuse | Done
_KINDS: dict[str, type[Message]] = {"hello": Hello, "assign": Assign, "refuse": Refuse, "done": Done}


def encode(message: Message) -> bytes:
    """One line of JSON.

    Example:
        >>> encode(Done(0))
        b'{"v": 1, "kind": "done", "status": 0}\\n'
    """
    fields = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(message).items() if k != "kind"}
    return (json.dumps({"v": VERSION, "kind": message.kind, **fields}) + "\n").encode()


def decode(line: bytes) -> Message:
    """The message on one line.

    Raises:
        NodeProtocolError: not JSON, another version, an unknown kind or missing fields.

    Example:
        >>> decode(b'{"v": 1, "kind": "assign", "proxy": ["hydra_pmi_proxy", "--proxy-id", "1"]}')
        Assign(proxy=('hydra_pmi_proxy', '--proxy-id', '1'), kind='assign')
    """
    text = line.decode(errors="replace").strip()
    try:
        data = json.loads(text)
        version, kind = data.pop("v"), data.pop("kind")
    except (ValueError, KeyError, AttributeError, TypeError):
        raise NodeProtocolError(f"not a ddlrun node message: {text[:200]!r}") from None
    if version != VERSION:
        raise NodeProtocolError(f"a ddlrun node message of protocol version {version!r}, not {VERSION}: run the same "
                            "ddl version on every node")
    if kind not in _KINDS:
        raise NodeProtocolError(f"unknown ddlrun node message kind {kind!r}")
    if "proxy" in data and isinstance(data["proxy"], list):
        data["proxy"] = tuple(str(word) for word in data["proxy"])
    try:
        return _KINDS[kind](**data)
    except TypeError as exc:
        raise NodeProtocolError(f"a {kind!r} message with wrong fields ({exc})") from None


# -- the master's roster ---------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Roster:
    """The master's view of who has joined: node rank -> its :class:`Hello` (node 0 is the master's own)."""

    nnodes: int
    nproc_per_node: int
    joined: Mapping[int, Hello]

    @property
    def missing(self) -> list[int]:
        return [rank for rank in range(self.nnodes) if rank not in self.joined]

    @property
    def complete(self) -> bool:
        return not self.missing


def admit(roster: Roster, hello: Hello, *, connected: Iterable[int]) -> tuple[Roster, Refuse | None]:
    """The roster after ``hello`` arrives, or the same roster and why the node is refused.

    A node whose earlier connection is gone (``connected`` no longer lists it) may join again.

    Example:
        >>> r = Roster(2, 1, {0: Hello(0, 2, 1, "n0")})
        >>> admit(r, Hello(1, 3, 1, "n1"), connected=[])[1].reason[:60]
        'node n1 (rank 1) was told 3 nodes but the master (n0) was to'
    """
    master = roster.joined.get(0)
    where = f"the master ({master.hostname})" if master else "the master"
    who = f"node {hello.hostname} (rank {hello.node_rank})"
    if hello.nnodes != roster.nnodes:
        return roster, Refuse(f"{who} was told {hello.nnodes} nodes but {where} was told {roster.nnodes}; "
                              "give every node the same --nnodes (PET_NNODES)")
    if hello.nproc_per_node != roster.nproc_per_node:
        return roster, Refuse(f"{who} runs {hello.nproc_per_node} ranks per node but {where} runs "
                              f"{roster.nproc_per_node}; give every node the same --nproc-per-node")
    if not 0 < hello.node_rank < roster.nnodes:
        return roster, Refuse(f"{who}: node rank {hello.node_rank} is not one of 1..{roster.nnodes - 1} "
                              "(0 is the master's); give each node its own --node-rank (PET_NODE_RANK)")
    earlier = roster.joined.get(hello.node_rank)
    if earlier is not None and hello.node_rank in set(connected):
        return roster, Refuse(f"{who}: node rank {hello.node_rank} has already joined from {earlier.hostname}; "
                              "give each node its own --node-rank (PET_NODE_RANK)")
    return dataclasses.replace(roster, joined={**roster.joined, hello.node_rank: hello}), None


def waiting_line(roster: Roster, *, elapsed: float, timeout: float) -> str:
    """What the master waits for, for its log.

    Example:
        >>> waiting_line(Roster(3, 1, {0: Hello(0, 3, 1, "n0")}), elapsed=4, timeout=300)
        'waiting for node(s) 1, 2 of 3 to join (4 s of 300 s)'
    """
    return (f"waiting for node(s) {', '.join(map(str, roster.missing))} of {roster.nnodes} to join "
            f"({elapsed:.0f} s of {timeout:.0f} s)")


def hosts_argument(roster: Roster) -> list[tuple[str, int]]:
    """Hosts for ``mpiexec -hosts``: each node's host name and ranks, in node-rank order.

    Host names that repeat (two nodes on one machine) get their node rank appended, so
    that hydra keeps one proxy per node (with the manual launcher it resolves none of them).

    Example:
        >>> hosts_argument(Roster(2, 2, {0: Hello(0, 2, 2, "n"), 1: Hello(1, 2, 2, "n")}))
        [('n-0', 2), ('n-1', 2)]
    """
    names = [roster.joined[rank].hostname for rank in range(roster.nnodes)]
    return [(name if names.count(name) == 1 else f"{name}-{rank}", roster.nproc_per_node)
            for rank, name in enumerate(names)]


# -- hydra's manual launcher ---------------------------------------------------------------

LAUNCH_PREFIX = "HYDRA_LAUNCH:"
LAUNCH_END = "HYDRA_LAUNCH_END"


def parse_launch_lines(lines: Sequence[str]) -> dict[int, list[str]]:
    """The proxy command of each host from ``mpiexec -launcher manual``'s lines, by proxy id.

    Raises:
        NodeProtocolError: a line names no ``--proxy-id``, or an id twice.

    Example:
        >>> parse_launch_lines(["HYDRA_LAUNCH: /v/bin/hydra_pmi_proxy --control-port n0:4000 --proxy-id 1 "])
        {1: ['/v/bin/hydra_pmi_proxy', '--control-port', 'n0:4000', '--proxy-id', '1']}
    """
    found: dict[int, list[str]] = {}
    for line in lines:
        if not line.startswith(LAUNCH_PREFIX):
            continue
        argv = line[len(LAUNCH_PREFIX):].split()
        if "--proxy-id" not in argv or argv.index("--proxy-id") + 1 >= len(argv):
            raise NodeProtocolError(f"hydra's launch line names no --proxy-id: {line.strip()!r}")
        proxy = int(argv[argv.index("--proxy-id") + 1])
        if proxy in found:
            raise NodeProtocolError(f"hydra printed proxy {proxy} twice")
        found[proxy] = argv
    return found


def reachable_proxy(argv: Sequence[str], master_addr: str) -> list[str]:
    """``argv`` with its ``--control-port`` host replaced by the master's address.

    Hydra writes its own host name there, which other pods cannot resolve (a JobSet pod's
    short name is not in their DNS search path); the master address is the name every
    node reached the master by.

    Example:
        >>> reachable_proxy(["p", "--control-port", "t-node-0-0:4000"], "t-node-0-0.t")
        ['p', '--control-port', 't-node-0-0.t:4000']
    """
    out = list(argv)
    for i, word in enumerate(out[:-1]):
        if word == "--control-port":
            out[i + 1] = re.sub(r"^.*:(\d+)$", lambda m: f"{master_addr}:{m.group(1)}", out[i + 1])
    return out
