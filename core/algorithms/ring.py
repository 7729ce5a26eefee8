"""Flat ring allreduce: bandwidth-optimal reduce-scatter + allgather over all ranks.

The ring follows topology order (hosts contiguous), so it crosses each host boundary
once; cost 2(p-1) a + 2(p-1)/p * N * b. The executor cuts long steps into segments.
"""

from __future__ import annotations

from ddl.algorithms.multiring import MultiRing
from ddl.schedule import Schedule
from ddl.topology import Topology


class Ring:
    """One ring through every rank, ignoring the multi-ring dims."""

    name = "ring"

    def compile(self, topology: Topology, rank: int, count: int) -> Schedule:
        flat = MultiRing().compile(topology.flat(), rank, count)
        return Schedule(self.name, rank, count, flat.steps)
