"""A rank's line to its host's agent: its reports go out, the announcement of other hosts and news of a lost one come in."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time

from ddl.base.errors import HorovodInternalError
from ddl.runtime.elastic.protocol import (
    HostsUpdated,
    ProtocolError,
    RankBeat,
    RankLink,
    RankReport,
    Reason,
    Route,
    Step,
    WorldLost,
)
from ddl.runtime.elastic.wire import AGENT_SOCKET, RANK_BEAT_SECONDS, LineReader, request, send
from ddl.runtime.running import context, current_engine


class AgentLink:
    """This rank's connection to its host's agent: a reader thread takes what the agent sends, a
    beating thread tells the agent the process runs (a rank frozen with its sockets open stops beating)."""

    def __init__(self, path: str) -> None:
        self._sock = request(path, RankLink(pid=os.getpid()))
        self._lock = threading.Lock()
        self.updates = threading.Event()
        self._reader = threading.Thread(target=self._read, args=(self._sock,), name="ddl-elastic-link", daemon=True)
        self._reader.start()
        self._beater = threading.Thread(target=self._beat, name="ddl-elastic-beat", daemon=True)
        self._beater.start()

    def _beat(self) -> None:
        seq = 0
        while True:
            seq += 1
            try:
                with self._lock:
                    send(self._sock, RankBeat(seq=seq))
            except OSError:
                return  # the agent is gone: its end is this rank's too
            time.sleep(RANK_BEAT_SECONDS)

    def _read(self, sock: socket.socket) -> None:
        reader = LineReader(Route.AGENT_TO_RANK)
        while True:
            try:
                messages = reader.receive(sock)
            except (OSError, ProtocolError):
                return
            if messages is None:
                return
            for message in messages:
                if isinstance(message, HostsUpdated):
                    self.updates.set()
                elif isinstance(message, WorldLost):
                    # ddlrun ends this world because a host was lost: what this rank waits
                    # for can never come, so its collectives raise as Horovod's do.
                    lost = f"host {', '.join(message.lost)}" if message.lost else "a host"
                    engine = current_engine()
                    rank = f"rank {engine.ctx.topology.rank}" if engine is not None else f"process {os.getpid()}"
                    print(f"ddl: {rank}: world {message.world} lost ({lost}); leaving it for the next world, which "
                          "resumes from the last commit", file=sys.stderr, flush=True)
                    if engine is not None:
                        engine.interrupt(HorovodInternalError(
                            f"a collective failed: world {message.world} lost ({lost}); elastic.run restores the "
                            "last commit and the next world resumes from it"))

    def report(self, step: Step, *, serial: int, reason: Reason = Reason.NONE, detail: str = "") -> None:
        """Tell the agent (and through it ``ddlrun``) how far this rank has come; a gone agent is ignored."""
        with self._lock, contextlib.suppress(OSError):
            send(self._sock, RankReport(step=step, serial=serial, reason=reason, detail=detail))


_link: AgentLink | None = None
_link_lock = threading.Lock()


def agent_link() -> AgentLink | None:
    """The link to this host's agent under ``ddlrun --elastic``, else None (connects on first use)."""
    global _link
    config = context().config
    if config.elastic_store is None or config.elastic_world == 0:
        return None  # not under ddlrun --elastic (a store alone: commits are kept, nobody to talk to)
    with _link_lock:
        if _link is None:
            _link = AgentLink(os.path.join(config.elastic_store, AGENT_SOCKET))
        return _link


def world_number() -> int:
    """This world's number under ``ddlrun --elastic`` (1, 2, ... one more per change of hosts); 0 outside."""
    return context().config.elastic_world


def updates_pending() -> bool:
    """Whether ``ddlrun`` announced new or leaving hosts to this rank (the next commit acts on it)."""
    link = agent_link()
    return link is not None and link.updates.is_set()


def wait_for_host_updates(timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for ``ddlrun`` to announce other hosts; whether it did.

    For demonstrations and tests that hold a smaller world until a host joins. Outside
    ``ddlrun --elastic`` it returns False at once (nobody would announce anything).

    Raises:
        ValueError: ``timeout`` is not a positive number of seconds.
    """
    if not timeout > 0:
        raise ValueError(f"wait_for_host_updates(timeout={timeout!r}): give the longest wait in seconds, > 0")
    link = agent_link()
    return link is not None and link.updates.wait(timeout)
