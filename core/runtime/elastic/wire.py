"""How elastic messages travel: one JSON line each, on TCP or a unix socket (with descriptors), and where the sockets live.

``ddlrun --elastic`` (the supervisor) talks to one agent per host over TCP; on each host,
the rank stubs ``mpiexec`` starts and the training processes talk to their agent over a
unix socket in the host's folder. What the lines say is :mod:`ddl.runtime.elastic.protocol`'s;
a stub's first line also carries file descriptors (its stdio and the PMI socket) as
``SCM_RIGHTS``. Standard library only: the stub and the agent import this before anything heavy.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

from ddl.runtime.elastic.protocol import Message, ProtocolError, Route, decode, encode

#: Exit status of a rank that leaves its world at a commit (hosts changed) or after a failed
#: collective; the supervisor starts the next world instead of ending the job.
RESET_EXIT = 75
#: Seconds between a linked rank's own heartbeats to its agent (see ``Timing.rank_silent_after``).
RANK_BEAT_SECONDS = 0.25
#: The unix socket of a host's agent, inside the host's folder.
AGENT_SOCKET = "agent.sock"
#: Longest line accepted (a stub's environment is the largest message).
MAX_LINE = 1 << 22


def host_folder(root: str | Path, job: str, host: str) -> Path:
    """The folder of host ``host`` (its name in ddlrun's host list) of job ``job`` under ``root`` (tmpfs):
    the committed state and the agent's socket. Two list entries for one machine get two folders.

    Example:
        >>> host_folder("/dev/shm", "4f2a", "h1").as_posix()
        '/dev/shm/ddl-elastic-4f2a/h1'
    """
    return Path(root) / f"ddl-elastic-{job}" / host


def send(sock: socket.socket, message: Message, fds: list[int] | None = None) -> None:
    """Send one message (and ``fds``, on a unix socket); raises OSError when the peer is gone."""
    data = encode(message)
    if fds:
        sent = socket.send_fds(sock, [data], fds)
        data = data[sent:]
    if data:
        sock.sendall(data)


class LineReader:
    """Splits what a socket delivers into messages of the routes it takes; keeps the descriptors that came along."""

    def __init__(self, *routes: Route) -> None:
        self._buffer = b""
        self._routes = routes or None
        self.fds: list[int] = []

    def feed(self, data: bytes) -> list[Message]:
        """Messages completed by ``data``.

        Raises:
            ProtocolError: a line is not a message of this protocol and these routes, or
                longer than :data:`MAX_LINE`.
        """
        self._buffer += data
        out: list[Message] = []
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            if line.strip():
                out.append(decode(_object(line), expect=self._routes))
        if len(self._buffer) > MAX_LINE:
            raise ProtocolError(f"an elastic message longer than {MAX_LINE} bytes")
        return out

    def receive(self, sock: socket.socket, *, with_fds: bool = False) -> list[Message] | None:
        """Read once from ``sock``: the messages completed, or None when the peer closed it.

        Raises:
            OSError: the socket failed. ProtocolError: see :meth:`feed`.
        """
        if with_fds:
            data, fds, _flags, _addr = socket.recv_fds(sock, 1 << 16, 8)
            self.fds += fds
        else:
            data = sock.recv(1 << 16)
        if not data:
            return None
        return self.feed(data)


def _object(line: bytes) -> dict[str, Any]:
    try:
        value = json.loads(line)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ProtocolError(f"not an elastic message (one JSON object a line): {line[:200]!r}")
    return value


def request(path: str | Path, message: Message, *, timeout: float = 5.0) -> socket.socket:
    """Connect to the unix socket at ``path`` and send ``message``; returns the connected socket."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(path))
        send(sock, message)
    except BaseException:
        sock.close()
        raise
    sock.settimeout(None)
    return sock
