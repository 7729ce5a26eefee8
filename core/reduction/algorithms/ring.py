"""Flat ring allreduce: bandwidth-optimal reduce-scatter + allgather over all ranks.

The ring follows topology order (hosts contiguous), so it crosses each host boundary
once; cost 2(p-1) a + 2(p-1)/p * N * b. The executor cuts long steps into segments.
"""

from __future__ import annotations

from collections.abc import Sequence

from ddl.base.topology import Topology
from ddl.reduction.algorithms.multiring import MultiRing
from ddl.reduction.schedule import Schedule, ring_reduce_scatter


class Ring:
    """One ring through every rank, ignoring the multi-ring dims."""

    name = "ring"

    def unavailable(self, topology: Topology) -> str | None:
        return None

    def compile(self, topology: Topology, rank: int, count: int) -> Schedule:
        flat = MultiRing().compile(topology.flat(), rank, count)
        return Schedule(self.name, rank, count, flat.steps)

    def compile_reduce_scatter(self, topology: Topology, rank: int, bounds: Sequence[int]) -> Schedule:
        """Reduce-scatter along the ring: rank r ends owning ``[bounds[r], bounds[r+1])``
        summed over every rank (the ranges follow rank order, the ring topology order)."""
        p = topology.size
        members = [topology.order[i] for i in range(p)]
        chunks = [(bounds[r], bounds[r + 1]) for r in members]
        steps = ring_reduce_scatter(members, rank, chunks, dim=0, phase="reduce-scatter")
        return Schedule("ring reduce-scatter", rank, bounds[-1], tuple(steps))
