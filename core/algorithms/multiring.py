"""DDL's multi-dimensional ring: reduce-scatter dim by dim, then allgather in reverse.

Dim 0 (inside a host) reduce-scatters the whole buffer; dim 1 reduce-scatters only the
1/d0 slice each rank now owns, and so on, so the slow outer links carry 1/(d0...d_{i-1})
of the data. Cost: sum_i [2(d_i-1) a_i + 2(d_i-1)/D_i * N * b_i], D_i = d0...d_i.
"""

from __future__ import annotations

from ddl.schedule import Schedule, Step, chunks_of, partition, ring_allgather, ring_reduce_scatter
from ddl.topology import Topology


class MultiRing:
    """Multi-ring allreduce over ``topology.dims`` (a single dim is a plain ring)."""

    name = "multiring"

    def compile(self, topology: Topology, rank: int, count: int) -> Schedule:
        coords = topology.coords(rank)
        lo, hi = 0, count
        levels: list[tuple[int, list[int], list[tuple[int, int]]]] = []
        steps: list[Step] = []
        for dim, d in enumerate(topology.dims):
            if d == 1:
                continue
            members = topology.ring(dim, rank)
            chunks = chunks_of(partition(lo, hi, d))
            steps += ring_reduce_scatter(members, rank, chunks, dim=dim, phase=f"reduce-scatter dim {dim}")
            levels.append((dim, members, chunks))
            lo, hi = chunks[coords[dim]]
        for dim, members, chunks in reversed(levels):
            steps += ring_allgather(members, rank, chunks, dim=dim, phase=f"allgather dim {dim}")
        return Schedule(self.name, rank, count, tuple(steps))
