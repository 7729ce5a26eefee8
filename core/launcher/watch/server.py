"""ddlrun's end of the keepers' connections: a TCP listener whose messages become one queue of events.

A reader thread per connection turns lines into messages (:mod:`~ddl.launcher.watch.protocol`);
a connection whose first message is not a :class:`~ddl.launcher.watch.protocol.KeeperHello` with
the job's token is dropped (a stray client, or a keeper of another job). The loop that
decides (:mod:`~ddl.launcher.watch.job`) reads :attr:`WatchServer.events` alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import secrets
import socket
import threading
import time

from ddl.launcher.watch import protocol
from ddl.launcher.watch.protocol import KeeperHello, Message


@dataclasses.dataclass(frozen=True)
class KeeperClosed:
    """A keeper's connection ended (``why``: what it last sent that was not understood, if anything)."""

    why: str = ""


@dataclasses.dataclass(frozen=True)
class KeeperEvent:
    connection: int
    what: Message | KeeperClosed
    at: float  # time.monotonic() when it arrived


class WatchServer:
    """Listens on every address of this machine, on a free port; :attr:`token` admits keepers."""

    def __init__(self) -> None:
        self.token = secrets.token_hex(8)
        self.listener = socket.create_server(("0.0.0.0", 0), backlog=1024)
        self.port = int(self.listener.getsockname()[1])
        self.events: queue.Queue[KeeperEvent] = queue.Queue()
        self._connections: dict[int, socket.socket] = {}
        self._lock = threading.Lock()
        self._ids = 0
        self._closed = False
        threading.Thread(target=self._accept, name="ddlrun-watch-accept", daemon=True).start()

    def address(self, host: str) -> str:
        """``DDL_MONITOR``'s value for keepers that reach this machine at ``host``."""
        return f"{host}:{self.port}/{self.token}"

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with self._lock:
                self._ids += 1
                cid = self._ids
                self._connections[cid] = conn
            threading.Thread(target=self._read, args=(cid, conn), name=f"ddlrun-watch-{cid}", daemon=True).start()

    def _read(self, cid: int, conn: socket.socket) -> None:
        buffered = b""
        admitted = False
        why = ""
        try:
            while True:
                data = conn.recv(1 << 16)
                if not data:
                    break
                *lines, buffered = (buffered + data).split(b"\n")
                at = time.monotonic()
                for line in lines:
                    message = protocol.decode(line)
                    if not admitted:
                        if not isinstance(message, KeeperHello) or message.token != self.token:
                            raise protocol.KeeperProtocolError("the first message did not carry this job's token")
                        admitted = True
                    self.events.put(KeeperEvent(cid, message, at))
        except protocol.KeeperProtocolError as exc:
            why = str(exc)
        except OSError:
            pass
        if admitted:
            self.events.put(KeeperEvent(cid, KeeperClosed(why), time.monotonic()))
        self.drop(cid)

    def drop(self, cid: int) -> None:
        with self._lock:
            conn = self._connections.pop(cid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self.listener.close()
        for cid in list(self._connections):
            self.drop(cid)


def reachable_address(hosts: list[str]) -> str:
    """This machine's address that the ranks' hosts reach it at (their keepers connect to it).

    The kernel's own choice of source address toward the first host that resolves (a UDP
    ``connect`` sends nothing); ``127.0.0.1`` for a job on this machine alone.
    """
    for host in hosts:
        try:
            found = socket.getaddrinfo(host, 9, socket.AF_INET, socket.SOCK_DGRAM)
        except (OSError, UnicodeError):
            continue
        for *_, target in found:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                try:
                    probe.connect(target)
                    return str(probe.getsockname()[0])
                except OSError:
                    continue
    return "127.0.0.1"
