"""ddlrun's side of the elastic agents' connections: a TCP server whose messages become timed events, its pings, and processes.

Every connection gets a reader thread (:class:`~ddl.launcher.tcp_listener.TcpListener`) that
turns its lines into :class:`Event` s on one queue (a :class:`Gone` for a closed connection,
or one that sent what this ddlrun cannot read), so the supervisor's loop is single threaded and decides in one place. Each event
carries the time its bytes arrived, taken by the reader: a supervisor held up for a
moment (a loaded host) then judges heartbeats by when they came, not by when it got to
them. The pings that keep the agents from fencing themselves come from a thread of
their own (:meth:`EventServer.start_pinging`), so they never wait for the loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

from ddl.launcher.tcp_listener import TcpListener
from ddl.runtime.elastic.protocol import Message, Ping, ProtocolError, Route, encode
from ddl.runtime.elastic.wire import LineReader


@dataclasses.dataclass(frozen=True)
class Gone:
    """The connection closed, or sent what this ddlrun cannot read (``why``)."""

    why: str = "its agent's connection closed"


@dataclasses.dataclass(frozen=True)
class Event:
    connection: int
    what: Message | Gone
    at: float  # time.monotonic() when it arrived


class EventServer:
    """Accepts the agents' connections; :attr:`events` carries what they send."""

    def __init__(self) -> None:
        #: What the readers post; the supervisor's other sources (discovery) post here too.
        self.events: queue.Queue[Any] = queue.Queue()
        self._send_lock = threading.Lock()  # the pinger and the loop send on the same sockets
        self._listener = TcpListener(self._read, name="ddlrun-elastic", backlog=256, nodelay=True)
        self.port = self._listener.port

    def start_pinging(self, interval: float, *, while_: Callable[[], bool]) -> None:
        """Ping every connection each ``interval`` seconds from a thread of its own, while
        ``while_()`` holds (the supervisor's loop still turns: a loop stuck for good lets the
        agents fence themselves rather than keep a job alive that nobody runs)."""

        def ping() -> None:
            seq = 0
            while not self._listener.closed:
                if while_():
                    seq += 1
                    for cid in self._listener.connection_ids():
                        self.send(cid, Ping(seq=seq))
                time.sleep(interval)

        threading.Thread(target=ping, name="ddlrun-elastic-ping", daemon=True).start()

    def _read(self, cid: int, conn: socket.socket) -> None:
        reader = LineReader(Route.AGENT_TO_SUPERVISOR)
        while True:
            gone = Gone()
            try:
                messages = reader.receive(conn)
            except OSError:
                messages = None
            except ProtocolError as exc:
                messages, gone = None, Gone(f"its agent sent what this ddlrun cannot read: {exc}")
            at = time.monotonic()
            if messages is None:
                self.events.put(Event(cid, gone, at))
                return
            for message in messages:
                self.events.put(Event(cid, message, at))

    def send(self, cid: int, message: Message) -> bool:
        """Send to connection ``cid`` without waiting; False when it is gone.

        Never blocks the supervisor's loop (a host cut off from the network would): the
        messages are small, so a full send buffer means the peer has not read for a long
        time; the connection is then dropped, and the agent counts as lost.
        """
        conn = self._listener.connection(cid)
        if conn is None:
            return False
        data = encode(message)
        try:
            with self._send_lock:
                while data:
                    sent = conn.send(data, socket.MSG_DONTWAIT)
                    data = data[sent:]
            return True
        except BlockingIOError:
            self.drop(cid)
            return False
        except OSError:
            return False

    def drop(self, cid: int) -> None:
        self._listener.drop(cid)

    def close(self) -> None:
        self._listener.close()


def start_process(argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Start an ``mpiexec`` in its own session, so that it and what it starts can be killed together."""
    return subprocess.Popen(argv, env=env, start_new_session=True)


def kill_now(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``process`` and its process group without waiting (the caller reaps it later with ``poll``)."""
    _kill_group(process.pid, signal.SIGKILL)


def kill_process(process: subprocess.Popen[bytes], *, grace: float = 0.0, wait: float = 0.0) -> None:
    """End ``process`` and its process group: after ``wait`` seconds for it to end by itself,
    SIGTERM, then SIGKILL after ``grace``; waits (for the job's end, never inside the loop)."""
    if wait > 0:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=wait)
    if process.poll() is not None:
        _kill_group(process.pid, signal.SIGKILL)
        return
    if grace > 0:
        _kill_group(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace)
    _kill_group(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5)


def _kill_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
