"""Shared-memory allreduce: reduce-scatter through one host's memory, multi-ring outside.

The ranks of each dim-0 ring (one host) reduce-scatter the whole buffer through a
shared window (a :class:`~ddl.reduction.schedule.GroupStep`): member i ends owning chunk i, as
after multiring's dim-0 ring. The outer dims run multiring's rings on that 1/d0 slice,
then a shared-memory allgather hands every member the whole result. Inside a host this
replaces 2(d0-1) messages with two steps of a few barriers and memory copies.
"""

from __future__ import annotations

from ddl.base.topology import Topology
from ddl.reduction.algorithms.multiring import multiring_steps
from ddl.reduction.schedule import GroupStep, Schedule, chunks_of, partition


def why_not_shared(topology: Topology) -> str | None:
    """Why ``topology``'s dim-0 rings cannot share memory, or None when every one lies on one host."""
    d0 = topology.dims[0]
    split = topology.split_dim0_ring if d0 > 1 else None
    if d0 > 1 and split is None:
        return None
    local = topology.local_size
    hint = (f"use algorithm='multiring' or 'auto', or a topology whose first dim is the ranks per host "
            f"(e.g. '{local}x{topology.size // local}')" if 1 < local < topology.size and topology.size % local == 0
            else "use algorithm='multiring' or 'auto'")
    if split is None:
        return f"topology {topology} has dims[0] = {d0}: no two ranks of a dim-0 ring to share memory; {hint}"
    on = sorted({topology.hosts[r] for r in split})
    return (f"topology {topology}: the dim-0 ring of ranks {list(split)[:8]} spans hosts {on[:8]} "
            f"(shared memory needs each dim-0 ring on one host); {hint}")


class SharedMemory:
    """Shared-memory reduce-scatter on dim 0, multi-ring on the outer dims, shared-memory allgather."""

    name = "shm"

    def unavailable(self, topology: Topology) -> str | None:
        return why_not_shared(topology)

    def compile(self, topology: Topology, rank: int, count: int) -> Schedule:
        """Raises:
            ValueError: a dim-0 ring spans hosts, or dims[0] is 1 (the message says what to use).
        """
        reason = why_not_shared(topology)
        if reason is not None:
            raise ValueError(f"allreduce algorithm 'shm' cannot run: {reason}")
        members = tuple(topology.ring(0, rank))
        chunks = tuple(chunks_of(partition(0, count, len(members))))
        lo, hi = chunks[members.index(rank)]
        steps = [
            GroupStep(members, chunks, reduce=True, dim=0, phase="shm reduce-scatter"),
            *multiring_steps(topology, rank, lo, hi, first_dim=1),
            GroupStep(members, chunks, reduce=False, dim=0, phase="shm allgather"),
        ]
        return Schedule(self.name, rank, count, tuple(steps))
