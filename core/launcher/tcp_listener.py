"""ddlrun's TCP listener: a free port on every address of this machine, a reader thread per connection.

Both of ddlrun's servers stand on it: the keepers' (:mod:`ddl.launcher.watch.server`) and the
elastic agents' (:mod:`ddl.launcher.elastic.server`). Each brings its own reader, which turns a
connection's lines into its protocol's messages and puts them on its one queue of events; this
module only accepts, numbers, tracks and closes the connections.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Sequence

#: What runs in a connection's own thread: ``read(connection id, socket)``, until the peer is done.
Reader = Callable[[int, socket.socket], None]


class TcpListener:
    """Listens on every address, on a free port; each accepted connection gets an id and a thread running ``read``.

    Args:
        read: the connection's reader (it returns when the connection is done; dropping it is its choice).
        name: the threads' name prefix (``NAME-accept``, ``NAME-ID``).
        backlog: the listen backlog (connections queued before they are accepted).
        nodelay: set ``TCP_NODELAY`` on each connection (small messages sent at once).

    Example:
        >>> listener = TcpListener(lambda cid, conn: None, name="doc", backlog=8)
        >>> listener.port > 0
        True
        >>> listener.close()
    """

    def __init__(self, read: Reader, *, name: str, backlog: int, nodelay: bool = False) -> None:
        self.listener = socket.create_server(("0.0.0.0", 0), backlog=backlog)
        self.port = int(self.listener.getsockname()[1])
        self._read = read
        self._name = name
        self._nodelay = nodelay
        self._connections: dict[int, socket.socket] = {}
        self._lock = threading.Lock()
        self._ids = 0
        self.closed = False
        threading.Thread(target=self._accept, name=f"{name}-accept", daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            if self._nodelay:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._ids += 1
                cid = self._ids
                self._connections[cid] = conn
            threading.Thread(target=self._read, args=(cid, conn), name=f"{self._name}-{cid}", daemon=True).start()

    def connection(self, cid: int) -> socket.socket | None:
        """Connection ``cid``'s socket; None once it is dropped."""
        with self._lock:
            return self._connections.get(cid)

    def connection_ids(self) -> list[int]:
        """The ids of the connections open now."""
        with self._lock:
            return list(self._connections)

    def drop(self, cid: int) -> None:
        """Shut connection ``cid`` down and close it (nothing when it is already gone)."""
        with self._lock:
            conn = self._connections.pop(cid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def close(self) -> None:
        """Stop accepting and drop every connection."""
        self.closed = True
        with contextlib.suppress(OSError):
            self.listener.close()
        for cid in self.connection_ids():
            self.drop(cid)


def reachable_address(hosts: Sequence[str]) -> str:
    """This machine's address that ``hosts`` reach it at (what their keepers or agents connect to).

    The kernel's own choice of source address toward the first host that resolves (a UDP
    ``connect`` sends nothing); ``127.0.0.1`` for a job on this machine alone.

    Example:
        >>> reachable_address([])
        '127.0.0.1'
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
