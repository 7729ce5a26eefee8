"""Elastic training state, Horovod's names: ``State``, ``ObjectState``, ``run``; kept on each host's tmpfs.

Under ``ddlrun --elastic`` a lost host ends the world it was in, and ``ddlrun`` starts the
next world on the hosts that remain (and those that join): see ``docs/guides/elastic.md``.
What carries the training across is the state object: ``state.commit()`` saves it in
memory (for ``restore()``) *and* writes it to this host's store on tmpfs (one writer per
host); the next world's ``state.sync()`` finds the newest whole commit among its hosts,
broadcasts it from a rank that holds it, and every rank continues from the same bytes.
``commit()`` also agrees with every rank, through rank 0, on whether ``ddlrun`` announced
a change of hosts; if so every rank raises :class:`HostsUpdatedInterrupt` at that same
commit, and :func:`run` ends the process for the next world (exit status 75).

Outside ``ddlrun --elastic`` the same objects keep their state in memory only, as
Horovod's do.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import pickle
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from ddl.base.errors import HorovodInternalError, HostsUpdatedInterrupt
from ddl.runtime.api import allgather_object, broadcast_object
from ddl.runtime.elastic_store import CommitStore
from ddl.runtime.elastic_wire import AGENT_SOCKET, RESET_EXIT, LineReader, request, send
from ddl.runtime.lifecycle import context, current_engine, shutdown

F = TypeVar("F", bound=Callable[..., Any])


class AgentLink:
    """This rank's line to its host's agent: reports go out, announcements of new hosts come in."""

    def __init__(self, path: str) -> None:
        self._sock = request(path, {"t": "rank", "pid": os.getpid()})
        self._lock = threading.Lock()
        self.updates = threading.Event()
        self._reader = threading.Thread(target=self._read, name="ddl-elastic-link", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        reader = LineReader()
        while True:
            try:
                messages = reader.receive(self._sock)
            except (OSError, ValueError):
                return
            if messages is None:
                return
            for message in messages:
                if message["t"] == "update":
                    self.updates.set()
                elif message["t"] == "lost":
                    # ddlrun ends this world because a host was lost: what this rank waits
                    # for can never come, so its collectives raise as Horovod's do.
                    engine = current_engine()
                    if engine is not None:
                        engine.interrupt(HorovodInternalError(
                            f"a collective failed: {message.get('why', 'a host of this elastic world was lost')}; "
                            "elastic.run restores the last commit and the next world resumes from it"))

    def report(self, kind: str, **fields: Any) -> None:
        """Tell the agent (and through it ``ddlrun``) about progress; a gone agent is ignored."""
        with self._lock, contextlib.suppress(OSError):
            send(self._sock, {"t": kind, **fields})


_link: AgentLink | None = None
_link_lock = threading.Lock()


def agent_link() -> AgentLink | None:
    """The link to this host's agent under ``ddlrun --elastic``, else None (connects on first use)."""
    global _link
    config = context().config
    if config.elastic_store is None or config.elastic_world == 0:
        return None  # not under ddlrun --elastic (a store alone: commits are kept, nobody to talk to)
    store = config.elastic_store
    with _link_lock:
        if _link is None:
            _link = AgentLink(os.path.join(store, AGENT_SOCKET))
        return _link


def world_number() -> int:
    """This world's number under ``ddlrun --elastic`` (1, 2, ... one more per change of hosts); 0 outside."""
    return context().config.elastic_world


def updates_pending() -> bool:
    """Whether ``ddlrun`` announced new or leaving hosts to this rank (the next commit acts on it)."""
    link = agent_link()
    return link is not None and link.updates.is_set()


def _store() -> CommitStore | None:
    """This host's store, on the one rank per host that writes it (local rank 0)."""
    ctx = context()
    if ctx.config.elastic_store is None or ctx.topology.local_rank != 0:
        return None
    return CommitStore(ctx.config.elastic_store)


class State:
    """What an elastic job commits, restores and syncs (Horovod's ``hvd.elastic.State``).

    Subclasses say how to copy their objects (:meth:`save`, :meth:`restore`) and how the
    saved copy travels as bytes (:meth:`saved_bytes`, :meth:`load_saved_bytes`).
    """

    def __init__(self) -> None:
        self._reset_callbacks: list[Callable[[], None]] = []
        self._commits = 0  # the number of the commit this process holds (the same on every rank)

    def register_reset_callbacks(self, callbacks: list[Callable[[], None]]) -> None:
        """Run ``callbacks`` in each new world after a change of hosts, once the state is synced.

        Scale the learning rate to the new ``size()`` here, for example. Unlike Horovod's,
        they run *after* :meth:`sync`, so they see the restored state and change it last.
        """
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for callback in self._reset_callbacks:
            callback()

    @property
    def commits(self) -> int:
        """How many commits this state has seen (the number of the last, across worlds)."""
        return self._commits

    def commit(self) -> None:
        """Save the state in memory and on this host's tmpfs, then act on announced host changes.

        Raises:
            HostsUpdatedInterrupt: ``ddlrun`` announced new or leaving hosts (raised on every
                rank at this same commit, after the save).
        """
        self.save()
        self._commits += 1
        self._persist()
        link = agent_link()
        if link is not None:
            link.report("commit", serial=self._commits)
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise :class:`HostsUpdatedInterrupt` on every rank if rank 0 has heard of new hosts.

        One small broadcast: ranks hear of the change at different moments, so rank 0's
        view decides, and every rank raises at the same commit.
        """
        pending = updates_pending()
        if broadcast_object(pending, 0, name="ddl.elastic.hosts_updated"):
            raise HostsUpdatedInterrupt(skip_sync=True)

    def sync(self) -> None:
        """Give every rank the newest committed state among the hosts (or rank 0's, if none).

        Each host's writer offers the commit number in its store; the first rank holding
        the highest sends that commit to all (a survivor, after a loss: newcomers have
        none). Without any commit, rank 0's current state is sent, as Horovod does.
        """
        store = _store()
        found = store.read() if store is not None else None
        offered = found[0] if found else 0
        serials = allgather_object(offered, name="ddl.elastic.serials")
        best = max(serials)
        if best > self._commits:
            root = serials.index(best)
            if found is not None and context().topology.rank == root:
                self.load_saved_bytes(found[1])
            self._commits = best
        else:
            root = 0
            if self._commits == 0:
                self.save()  # nothing committed yet: the state as it stands now
        payload = broadcast_object(self.saved_bytes() if context().topology.rank == root else None, root,
                                   name="ddl.elastic.sync")
        if context().topology.rank != root:
            self.load_saved_bytes(payload)
        self.restore()
        self._persist()

    def _persist(self) -> None:
        store = _store()
        if store is not None:
            store.write(self._commits, self.saved_bytes())

    # What a subclass provides -------------------------------------------------------
    def save(self) -> None:
        """Copy the live state into the saved (committed) copy."""
        raise NotImplementedError

    def restore(self) -> None:
        """Put the saved copy back into the live objects, undoing what changed since."""
        raise NotImplementedError

    def saved_bytes(self) -> bytes:
        """The saved copy as bytes (what is written to the store and broadcast)."""
        raise NotImplementedError

    def load_saved_bytes(self, payload: bytes) -> None:
        """Make ``payload`` (from :meth:`saved_bytes`) the saved copy; :meth:`restore` applies it."""
        raise NotImplementedError


class ObjectState(State):
    """State of plain Python values, given as keywords and read and set as attributes.

    Example:
        >>> state = ObjectState(epoch=0, step=0)   # doctest: +SKIP
        >>> state.step += 1; state.commit()        # doctest: +SKIP
    """

    def __init__(self, **values: Any) -> None:
        super().__init__()
        self._saved_state: dict[str, Any] = copy.deepcopy(values)
        self._set_attrs()

    def save(self) -> None:
        self._saved_state = {name: copy.deepcopy(getattr(self, name)) for name in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def saved_bytes(self) -> bytes:
        return pickle.dumps(self._saved_state, protocol=pickle.HIGHEST_PROTOCOL)

    def load_saved_bytes(self, payload: bytes) -> None:
        self._saved_state = pickle.loads(payload)

    def _set_attrs(self) -> None:
        for name, value in self._saved_state.items():
            setattr(self, name, copy.deepcopy(value))


def _leave_broken_world() -> None:
    """End this process at once with status 75 after a collective failed (a peer lost, or
    the program raised :class:`HorovodInternalError`).

    Unlike :func:`_leave_for_next_world` there is no ``shutdown``: it waits for every
    rank to agree, and a lost or departed peer never would. ``ddlrun`` stops the world's
    other ranks and the next world resumes from the last commit.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(RESET_EXIT)


def _leave_for_next_world() -> None:
    """End this process at once with status 75, for ``ddlrun`` to start the next world.

    Every rank gets here at the same commit, so ``ddl.shutdown`` agrees with all of them;
    then ``os._exit``: the interpreter's own teardown of a process that imported PyTorch
    or TensorFlow takes seconds on a busy host, and the next world waits for the slowest
    rank to leave. (So ``finally`` blocks around the training call and ``atexit``
    handlers do not run; the next world starts the program afresh.)
    """
    sys.stdout.flush()
    sys.stderr.flush()
    shutdown()
    os._exit(RESET_EXIT)


def run(func: F) -> F:
    """Decorate the training function ``func(state, ...)`` of an elastic job (``hvd.elastic.run``).

    Each world first syncs ``state`` (the newest commit among the hosts), runs the reset
    callbacks when this world follows a change of hosts, then calls ``func``. When a
    commit raises :class:`HostsUpdatedInterrupt`, the process ends with status 75 so that
    ``ddlrun --elastic`` starts the next world, which resumes from that commit. A
    :class:`HorovodInternalError` (a collective failed: ddl raises it when a host of the
    world was lost; the program may raise it too) restores the last commit and ends the
    process at once, without the agreeing ``shutdown`` (a departed peer would never
    agree); ``ddlrun`` then stops the other ranks and starts the next world from that
    commit. Outside ``ddlrun --elastic`` it syncs and calls ``func`` once.

    Do not call collectives between building the state and calling the decorated function
    that the next world would not call in the same order (as with Horovod).
    """

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        link = agent_link()
        state.sync()
        if world_number() > 1:
            state.on_reset()
        if link is not None:
            link.report("synced", serial=state.commits)
        try:
            result = func(state, *args, **kwargs)
        except (HostsUpdatedInterrupt, HorovodInternalError) as exc:
            if link is None:
                raise
            if isinstance(exc, HorovodInternalError):
                state.restore()
                link.report("reset", serial=state.commits, why=type(exc).__name__)
                _leave_broken_world()
            link.report("reset", serial=state.commits, why=type(exc).__name__)
            _leave_for_next_world()
        if link is not None:
            link.report("done", serial=state.commits)
        return result

    return wrapper  # type: ignore[return-value]


__all__ = ["AgentLink", "ObjectState", "State", "agent_link", "run", "updates_pending",
           "world_number"]
