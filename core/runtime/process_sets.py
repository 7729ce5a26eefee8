"""Process sets (Horovod's): collectives over a subset of the ranks, each set on its own
MPI sub-communicator with its own topology, engine and negotiation.

A set is made and removed by every rank of the job together (the split runs inside a
cycle of the world's engine, so its descriptor, the set's ranks, is compared like any
collective's: ranks that ask for different sets get a ``MismatchError``, a rank that
does not ask at all is reported as a stall). The ranks inside get an engine on the
sub-communicator that keeps the engine's contract among them; the ranks outside get
none, and a collective they call on the set is refused with a ``ValueError``.
Collectives name roots by their rank in the world, as Horovod does.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Sequence
from typing import Any

from ddl.base.topology import build_topology
from ddl.engine import codec
from ddl.engine.collectives import Collectives
from ddl.engine.context import Context
from ddl.engine.engine import Engine
from ddl.runtime import running
from ddl.wire.comm import MPIComm
from ddl.wire.splits import split_members


class ProcessSet:
    """A set of ranks that run collectives together (Horovod's ``ProcessSet``).

    Build it from a list of world ranks (or an mpi4py communicator) and pass it to
    :func:`add_process_set` (or ``init(process_sets=[...])``); then pass it as
    ``process_set=`` to any collective or to ``DistributedOptimizer``.

    Example:
        >>> evens = ddl.add_process_set([0, 2])                        # doctest: +SKIP
        >>> ddl.allreduce(x, process_set=evens) if evens.included() else None  # doctest: +SKIP
    """

    def __init__(self, ranks_or_comm: Sequence[int] | Any) -> None:
        self.process_set_id: int | None = None
        self.mpi_comm: Any = None
        self.ranks: list[int] | None = None
        if isinstance(ranks_or_comm, Sequence) and not isinstance(ranks_or_comm, (str, bytes)):
            if not all(isinstance(r, int) for r in ranks_or_comm):
                raise ValueError(f"ProcessSet takes a list of integer ranks or an mpi4py communicator, "
                                 f"got {list(ranks_or_comm)!r}")
            self.ranks = sorted(ranks_or_comm)
        elif hasattr(ranks_or_comm, "Get_group"):
            self.mpi_comm = ranks_or_comm
        else:
            raise ValueError(f"ProcessSet takes a list of integer ranks or an mpi4py communicator, "
                             f"got {type(ranks_or_comm).__name__}")

    def size(self) -> int | None:
        """The number of ranks in the set, or None before it is added."""
        return None if self.process_set_id is None or self.ranks is None else len(self.ranks)

    def rank(self) -> int | None:
        """This process's rank within the set (None before it is added; -1 outside it)."""
        if self.process_set_id is None or self.ranks is None:
            return None
        me = running.topology().rank
        return self.ranks.index(me) if me in self.ranks else -1

    def included(self) -> bool | None:
        """Whether this process is in the set (None while its ranks are unknown)."""
        return None if self.ranks is None else running.topology().rank in self.ranks

    def __str__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, mpi_comm={self.mpi_comm})"

    __repr__ = __str__


#: Every rank of the job; its ``ranks`` are filled in at ``init``.
global_process_set = ProcessSet([])
global_process_set.process_set_id = 0

_lock = threading.Lock()
_members: dict[int, Collectives | None] = {}  # id -> this rank's collectives on the set (None outside)
_ranks: dict[int, tuple[int, ...]] = {}
_next_id = 1
_calls = 0  # add/remove calls so far: the same on every rank (every rank makes them)


def _next_call() -> int:
    global _calls
    _calls += 1
    return _calls


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Make a process set of the given world ranks; every rank of the job calls it alike.

    Raises:
        ValueError: a set of these ranks exists already, or a rank is out of range.
        ddl.MismatchError: ranks asked for different sets.
    """
    global _next_id
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    world = running.collectives()
    size = world.topology.size
    if ps.ranks is None:
        ps.ranks = _ranks_of_comm(ps.mpi_comm)
    if not ps.ranks or len(set(ps.ranks)) != len(ps.ranks) or not all(0 <= r < size for r in ps.ranks):
        raise ValueError(f"a process set needs distinct ranks in 0..{size - 1}, got {ps.ranks}")
    ranks = tuple(ps.ranks)
    if ranks in _ranks.values():
        raise ValueError(f"a process set of ranks {list(ranks)} exists already: {_find(ranks)}")

    def prepare() -> tuple[tuple[Any, ...], Any]:
        return (ranks,), lambda: _build(world, ranks)

    # Named by call count, not by the ranks: ranks that ask for different sets then meet
    # in one call, whose descriptors differ (a MismatchError naming both), not in a stall.
    members = world._call("process_set", f"ddl.add_process_set.{_next_call()}", prepare)
    with _lock:
        pid = _next_id
        _next_id += 1
        _members[pid], _ranks[pid] = members, ranks
    ps.process_set_id = pid
    return ps


def remove_process_set(process_set: ProcessSet) -> bool:
    """Remove a set made by :func:`add_process_set` (every rank calls it alike); False for
    the global set or one not added."""
    pid = process_set.process_set_id
    if pid is None or pid == 0 or pid not in _members:
        return False
    world = running.collectives()
    members = _members[pid]

    def prepare() -> tuple[tuple[Any, ...], Any]:
        return (_ranks[pid],), lambda: _close(members)

    world._call("process_set", f"ddl.remove_process_set.{_next_call()}", prepare)
    with _lock:
        del _members[pid], _ranks[pid]
    process_set.process_set_id = None
    return True


def collectives_for(process_set: ProcessSet | None) -> Collectives:
    """This rank's collectives on ``process_set`` (the world's for None or the global set).

    Raises:
        ValueError: the set was not added, or this rank is not in it.
    """
    if process_set is None or process_set.process_set_id == 0:
        return running.collectives()
    pid = process_set.process_set_id
    if pid is None or pid not in _members:
        raise ValueError(f"{process_set} has not been added; call add_process_set() on every rank first")
    found = _members[pid]
    if found is None:
        raise ValueError(f"rank {running.topology().rank} is not in {process_set}; only its ranks "
                         f"{list(_ranks[pid])} may call collectives on it")
    return found


def set_rank_of(process_set: ProcessSet | None, world_rank: int) -> int:
    """``world_rank``'s rank within ``process_set`` (roots are given as world ranks).

    Raises:
        ValueError: the rank is not in the set.
    """
    if process_set is None or process_set.process_set_id == 0:
        return world_rank
    ranks = _ranks.get(process_set.process_set_id or -1, ())
    if world_rank not in ranks:
        raise ValueError(f"root_rank={world_rank} is not in {process_set}; give a world rank of the set")
    return ranks.index(world_rank)


def init_sets(process_sets: Sequence[ProcessSet] | None) -> None:
    """``init``'s part: fill in the global set's ranks and add the given sets."""
    global_process_set.ranks = list(range(running.topology().size))
    for ps in process_sets or ():
        if ps.process_set_id is None:
            add_process_set(ps)


def close_all(*, failed: bool = False, deadline: float | None = None) -> bool:
    """Stop every set's engine and free its communicator (at ``shutdown``, on every rank).

    The ids and the call count start again too: the next ``init`` is a new world, whose
    first ``add_process_set`` must meet the other ranks' first one (a rank that kept its
    count from before would wait in a call named otherwise). ``failed``, ``deadline``: as
    :meth:`ddl.engine.engine.Engine.stop` (after an uncaught exception; give up at that
    ``time.monotonic()``); False when a set's ranks did not agree in time.
    """
    global _next_id, _calls
    with _lock:
        found = list(_members.values())
        _members.clear()
        _ranks.clear()
        _next_id = 1
        _calls = 0
    return all(_close(members, failed=failed, deadline=deadline) for members in found)


def _build(world: Collectives, ranks: tuple[int, ...]) -> Collectives | None:
    """Split the set's communicator from the world's and start its engine (inside a cycle)."""
    ctx = world.ctx
    comm = ctx.comm
    raw = split_members(comm.mpi_comm, ranks, ctx.topology.rank) if isinstance(comm, MPIComm) else None
    if ctx.topology.rank not in ranks:
        return None
    sub = MPIComm(raw) if raw is not None else comm  # a world of one: the set is that one rank
    sub_ranks = list(ranks)
    hostnames = [f"host{ctx.topology.hosts[r]}" for r in sub_ranks]
    topo = build_topology(sub_ranks.index(ctx.topology.rank), hostnames)
    if isinstance(sub, MPIComm) and isinstance(comm, MPIComm) and sub is not comm:
        # The world's wait settings, for the set's ranks (a frozen member is bounded too).
        sub.busy_wait, sub.poll_native, sub.stall_limit = comm.busy_wait, comm.poll_native, comm.stall_limit
        sub.remote = frozenset(q for q, r in enumerate(sub_ranks) if r in comm.remote)
        sub.negotiation_blocks = codec.gather_blocks(len(sub_ranks), sub.poll_native, bool(ctx.config.elastic_world))
    config = dataclasses.replace(ctx.config, topology=None, algorithm="auto")
    sub_ctx = Context(sub, topo, config)
    sub_ctx.world_ranks = tuple(sub_ranks)
    sub_ctx.hostnames = tuple(ctx.hostnames[r] for r in sub_ranks) if ctx.hostnames else ()
    parent = running.engine()
    engine = Engine(sub_ctx, fusion_threshold=parent.fusion_threshold, stall_timeout=parent.watch.timeout,
                    cycle_time=parent.cycle_time)
    return Collectives(engine)


def _close(members: Collectives | None, *, failed: bool = False, deadline: float | None = None) -> bool:
    if members is None:
        return True
    left = None if deadline is None else max(0.0, deadline - time.monotonic())
    if not members.engine.stop(failed=failed, timeout=left):
        return False
    if members.ctx.comm is not running.context().comm:
        members.ctx.comm.free()
    return True


def _ranks_of_comm(comm: Any) -> list[int]:
    from mpi4py import MPI

    world = MPI.COMM_WORLD.Get_group()
    mine = comm.Get_group()
    return sorted(int(r) for r in MPI.Group.Translate_ranks(mine, list(range(mine.Get_size())), world))


def _find(ranks: tuple[int, ...]) -> str:
    pid = next(p for p, r in _ranks.items() if r == ranks)
    return f"process_set_id={pid}"
