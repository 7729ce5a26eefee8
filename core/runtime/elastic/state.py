"""The state an elastic job carries across worlds (Horovod's ``State``, ``ObjectState``): commit, restore, sync.

Under ``ddlrun --elastic`` a lost host ends the world it was in, and ``ddlrun`` starts the
next world on the hosts that remain (and those that join): see ``docs/guides/elastic.md``.
What carries the training across is the state object: ``state.commit()`` saves it in
memory (for ``restore()``) *and* writes it to this host's store on tmpfs (one writer per
host); the next world's ``state.sync()`` finds the newest whole commit among its hosts,
broadcasts it from a rank that holds it, and every rank continues from the same bytes.
A state with a sharded part (a ZeRO-1 optimizer: :meth:`State.sharded_entries`) keeps
only this rank's part in memory; each host's store receives every rank's part (one whole
copy per host), and a sync re-splits it for the new world (:mod:`~ddl.runtime.elastic.shards`).
``commit()`` also agrees with every rank, through rank 0, on whether ``ddlrun`` announced
a change of hosts; if so every rank raises :class:`HostsUpdatedInterrupt` at that same
commit, and :func:`ddl.runtime.elastic.run` ends the process for the next world (exit status 75).

Outside ``ddlrun --elastic`` the same objects keep their state in memory only, as
Horovod's do.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable
from typing import Any

from ddl.base.errors import HostsUpdatedInterrupt
from ddl.runtime.api import allgather_object, broadcast_object
from ddl.runtime.elastic import shards
from ddl.runtime.elastic.link import agent_link, updates_pending
from ddl.runtime.elastic.protocol import Step
from ddl.runtime.elastic.store import CommitStore
from ddl.runtime.running import context


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
            link.report(Step.COMMIT, serial=self._commits)
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
        me = context().topology.rank
        sharded = self.sharded_entries() is not None
        entries: dict[str, bytes] | None = None
        from_store = best > self._commits
        if from_store:
            root = serials.index(best)
            if found is not None and me == root:
                replicated, entries = shards.unpack(found[1])
                if sharded and entries is None:
                    raise ValueError("the newest commit holds no sharded entries, but this state shards its optimizer: "
                                     "every world of a job must shard alike")
                self.load_saved_bytes(replicated)
            self._commits = best
        else:
            root = 0
            if self._commits == 0:
                self.save()  # nothing committed yet: the state as it stands now
        payload = broadcast_object(self.saved_bytes() if me == root else None, root, name="ddl.elastic.sync")
        if me != root:
            self.load_saved_bytes(payload)
        if sharded and from_store:
            # The commit's entries, re-split for this world: each rank receives what it owns here.
            self.load_sharded_entries(shards.scatter_from(root, me, entries, self.sharded_owner,
                                                          context().topology.size))
        self.restore()
        self._persist()

    def _persist(self) -> None:
        """Write the commit to this host's store: the replicated state, and for a sharded state
        every rank's entries (gathered to each host's writer: one whole copy per host)."""
        ctx = context()
        if ctx.config.elastic_store is None:
            return
        entries = self.sharded_entries()
        if entries is not None and ctx.topology.size > 1:
            topo = ctx.topology
            writers = [r for r in range(topo.size) if topo.local_rank_of(r) == 0]
            entries = shards.gather_to_writers(entries, writers, topo.size)
        store = _store()
        if store is not None:
            replicated = self.saved_bytes()
            store.write(self._commits, replicated if entries is None else shards.pack(replicated, entries))

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

    # What a state with a sharded part (a ZeRO-1 optimizer) adds --------------------------
    def sharded_entries(self) -> dict[str, bytes] | None:
        """This rank's part of the saved copy's sharded state, by key (None: nothing is sharded,
        the default). :meth:`saved_bytes` leaves these entries out."""
        return None

    def sharded_owner(self, key: str) -> int:
        """The rank of this world that keeps entry ``key`` (by this world's partition)."""
        raise NotImplementedError

    def load_sharded_entries(self, entries: dict[str, bytes]) -> None:
        """Make ``entries`` (exactly this rank's in this world) the saved copy's sharded part."""
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
