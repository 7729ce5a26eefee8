"""ddlrun's end of the keepers' connections: a TCP listener whose messages become one queue of events.

A reader thread per connection (:class:`~ddl.launcher.tcp_listener.TcpListener`) turns lines
into messages (:mod:`~ddl.launcher.watch.protocol`); a connection whose first message is not a :class:`~ddl.launcher.watch.protocol.KeeperHello` with
the job's token is dropped (a stray client, or a keeper of another job). The loop that
decides (:mod:`~ddl.launcher.watch.watched_job`) reads :attr:`WatchServer.events` alone.
"""

from __future__ import annotations

import dataclasses
import queue
import secrets
import socket
import time

from ddl.launcher.tcp_listener import TcpListener
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
        self.events: queue.Queue[KeeperEvent] = queue.Queue()
        self._listener = TcpListener(self._read, name="ddlrun-watch", backlog=1024)
        self.port = self._listener.port

    def address(self, host: str) -> str:
        """``DDL_MONITOR``'s value for keepers that reach this machine at ``host``."""
        return f"{host}:{self.port}/{self.token}"

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
        self._listener.drop(cid)

    def close(self) -> None:
        self._listener.close()
