"""The communicator splits: this rank's shared-memory group, checked to really share memory.

The one module that splits communicators (the world communicator itself is duplicated
in :func:`ddl.wire.comm.world_comm`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ddl.base.errors import TopologyError


def split_shared_group(comm: Any, members: Sequence[int], rank: int) -> Any:
    """The mpi4py communicator of ``members`` (this rank's dim-0 ring), split from ``comm``.

    A collective over ``comm``: every rank calls it at the same point, each with its
    own group (the group's first rank is the colour, the position the key). It then
    checks that each group's processes really share memory (host names can be set by
    hand) and agrees on the answer, so every rank raises or none does.

    Raises:
        TopologyError: some group's ranks are on different machines.
    """
    from mpi4py import MPI

    group = comm.Split(members[0], list(members).index(rank))
    shared = group.Split_type(MPI.COMM_TYPE_SHARED)
    ok = int(shared.Get_size() == group.Get_size())
    shared.Free()
    if comm.allreduce(ok, op=MPI.MIN) != 1:
        group.Free()
        raise TopologyError(
            f"the ranks of a dim-0 ring (this rank's: {list(members)[:8]}) do not share memory, although their "
            "host names say one host; set DDL_HOSTNAME per machine, or use an algorithm other than 'shm'"
        )
    return group


def split_members(comm: Any, members: Sequence[int], rank: int) -> Any:
    """The mpi4py communicator of ``members`` (a process set), split from ``comm``, or
    None on a rank outside them. A collective over ``comm``: every rank calls it at the
    same point with the same ``members``; ranks keep their order."""
    from mpi4py import MPI

    inside = rank in members
    sub = comm.Split(0 if inside else MPI.UNDEFINED, rank)
    return sub if inside else None


def shared_node_leader(comm: Any) -> int:
    """The lowest rank of ``comm`` among the processes MPI lets share memory with this one.

    MPI's launchers count one node per host entry, so two entries naming one machine
    make two nodes whose ranks cannot share memory although their host names agree;
    ``init`` keeps such ranks apart by this. A collective over ``comm``.
    """
    from mpi4py import MPI

    shared = comm.Split_type(MPI.COMM_TYPE_SHARED)
    leader = int(shared.allreduce(comm.Get_rank(), op=MPI.MIN))
    shared.Free()
    return leader
