"""DDL's multi-dimensional ring: reduce-scatter dim by dim, then allgather in reverse.

Dim 0 (inside a host) reduce-scatters the whole buffer; dim 1 reduce-scatters only the
1/d0 slice each rank now owns, and so on, so the slow outer links carry 1/(d0...d_{i-1})
of the data. Cost: sum_i [2(d_i-1) a_i + 2(d_i-1)/D_i * N * b_i], D_i = d0...d_i.
"""

from __future__ import annotations

from ddl.base.topology import Topology
from ddl.reduction.schedule import (
    AnyStep,
    Schedule,
    chunks_of,
    partition,
    ring_allgather,
    ring_reduce_scatter,
)


def multiring_steps(topology: Topology, rank: int, lo: int, hi: int, *, first_dim: int = 0) -> list[AnyStep]:
    """Ring reduce-scatters over dims ``first_dim``... on ``[lo, hi)``, then the allgathers.

    Along each dim the range shrinks to the chunk this rank owns (chunk ``i`` for the
    rank at coordinate ``i``), so the next dim works on that slice only.
    """
    coords = topology.coords(rank)
    levels: list[tuple[int, list[int], list[tuple[int, int]]]] = []
    steps: list[AnyStep] = []
    for dim in range(first_dim, len(topology.dims)):
        d = topology.dims[dim]
        if d == 1:
            continue
        members = topology.ring(dim, rank)
        chunks = chunks_of(partition(lo, hi, d))
        steps += ring_reduce_scatter(members, rank, chunks, dim=dim, phase=f"reduce-scatter dim {dim}")
        levels.append((dim, members, chunks))
        lo, hi = chunks[coords[dim]]
    for dim, members, chunks in reversed(levels):
        steps += ring_allgather(members, rank, chunks, dim=dim, phase=f"allgather dim {dim}")
    return steps


class MultiRing:
    """Multi-ring allreduce over ``topology.dims`` (a single dim is a plain ring)."""

    name = "multiring"

    def unavailable(self, topology: Topology) -> str | None:
        return None

    def compile(self, topology: Topology, rank: int, count: int) -> Schedule:
        return Schedule(self.name, rank, count, tuple(multiring_steps(topology, rank, 0, count)))

