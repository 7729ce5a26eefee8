"""The elastic job's small messages: JSON lines between ddlrun, the host agents, the stubs and the ranks.

``ddlrun --elastic`` (the supervisor) talks to one agent per host over TCP; on each host,
the rank stubs that ``mpiexec`` starts and the training processes talk to their agent over
a unix socket in the host's store folder. Every message is one JSON object on one line,
``{"t": kind, ...}``; the stub's first message also carries file descriptors (its stdio
and the PMI socket) as ``SCM_RIGHTS``. Only the standard library: the stub and the agent
import this before anything heavy.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

#: Exit status of a rank that ended because the hosts changed (``HostsUpdatedInterrupt``) after
#: committing; the supervisor starts the next world instead of ending the job.
RESET_EXIT = 75
#: The unix socket of a host's agent, inside the host's store folder.
AGENT_SOCKET = "agent.sock"
#: Longest line accepted (a stub's environment is the largest message).
MAX_LINE = 1 << 22

Message = dict[str, Any]


def host_folder(root: str | Path, job: str, host: str) -> Path:
    """This host's folder of job ``job`` under ``root`` (tmpfs): committed state, agent socket.

    Example:
        >>> host_folder("/dev/shm", "4f2a", "h1").as_posix()
        '/dev/shm/ddl-elastic-4f2a/h1'
    """
    return Path(root) / f"ddl-elastic-{job}" / host


def encode(message: Message) -> bytes:
    """One message as a line of compact JSON."""
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def send(sock: socket.socket, message: Message, fds: list[int] | None = None) -> None:
    """Send one message (and ``fds``, on a unix socket); raises OSError when the peer is gone."""
    data = encode(message)
    if fds:
        sent = socket.send_fds(sock, [data], fds)
        data = data[sent:]
    if data:
        sock.sendall(data)


class LineReader:
    """Splits what a socket delivers into messages; keeps the descriptors that came with them."""

    def __init__(self) -> None:
        self._buffer = b""
        self.fds: list[int] = []

    def feed(self, data: bytes) -> list[Message]:
        """Messages completed by ``data``.

        Raises:
            ValueError: a line is not a JSON object, or longer than :data:`MAX_LINE`.
        """
        self._buffer += data
        out: list[Message] = []
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            if line.strip():
                message = json.loads(line)
                if not isinstance(message, dict) or "t" not in message:
                    raise ValueError(f"not an elastic message: {line[:200]!r}")
                out.append(message)
        if len(self._buffer) > MAX_LINE:
            raise ValueError(f"an elastic message longer than {MAX_LINE} bytes")
        return out

    def receive(self, sock: socket.socket, *, with_fds: bool = False) -> list[Message] | None:
        """Read once from ``sock``: the messages completed, or None when the peer closed it."""
        if with_fds:
            data, fds, _flags, _addr = socket.recv_fds(sock, 1 << 16, 8)
            self.fds += fds
        else:
            data = sock.recv(1 << 16)
        if not data:
            return None
        return self.feed(data)


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
