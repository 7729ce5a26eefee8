"""Rabenseifner's allreduce: recursive-halving reduce-scatter, recursive-doubling allgather.

Correct for any world size: with p2 the largest power of two <= p and r = p - p2, the
first 2r ranks (in topology order) pair up; each even one hands its buffer to its odd
neighbour and waits, the remaining p2 ranks run the power-of-two algorithm, and the
odd ones hand the result back. Exchanges go nearest partner first (distance 1, 2, 4,
...), so the largest halves travel inside a host. Cost about 2 log2(p) a + 2 N b.
"""

from __future__ import annotations

from ddl.base.topology import Topology
from ddl.reduction.schedule import NO_RANGE, Schedule, Step


class HalvingDoubling:
    """Reduce-scatter by recursive halving, allgather by recursive doubling."""

    name = "halving_doubling"

    def unavailable(self, topology: Topology) -> str | None:
        return None

    def compile(self, topology: Topology, rank: int, count: int) -> Schedule:
        size, order = topology.size, topology.order
        me = topology.index_of(rank)
        p2 = 1 << (size.bit_length() - 1)
        extra = size - p2
        whole = (0, count)
        steps: list[Step] = []

        def world(new_rank: int) -> int:
            index = 2 * new_rank + 1 if new_rank < extra else new_rank + extra
            return order[index]

        def link(peer: int) -> int:
            return topology.link_dim(rank, peer)

        if me < 2 * extra and me % 2 == 0:
            # Folded out: give our data to the odd neighbour, then take the result back.
            peer = order[me + 1]
            steps.append(Step(peer, whole, None, NO_RANGE, reduce=True, dim=link(peer), phase="fold"))
            steps.append(Step(None, NO_RANGE, peer, whole, reduce=False, dim=link(peer), phase="unfold"))
            return Schedule(self.name, rank, count, tuple(steps))

        if me < 2 * extra:
            peer = order[me - 1]
            steps.append(Step(None, NO_RANGE, peer, whole, reduce=True, dim=link(peer), phase="fold"))
            new_rank = me // 2
        else:
            new_rank = me - extra

        lo, hi = whole
        levels: list[tuple[int, tuple[int, int], tuple[int, int]]] = []
        dist = 1
        while dist < p2:
            partner = world(new_rank ^ dist)
            mid = lo + (hi - lo) // 2
            keep, give = ((lo, mid), (mid, hi)) if new_rank & dist == 0 else ((mid, hi), (lo, mid))
            steps.append(Step(partner, give, partner, keep, reduce=True, dim=link(partner), phase="halving"))
            levels.append((partner, keep, give))
            lo, hi = keep
            dist <<= 1
        for partner, keep, give in reversed(levels):
            steps.append(Step(partner, keep, partner, give, reduce=False, dim=link(partner), phase="doubling"))

        if me < 2 * extra:
            peer = order[me - 1]
            steps.append(Step(peer, whole, None, NO_RANGE, reduce=False, dim=link(peer), phase="unfold"))
        return Schedule(self.name, rank, count, tuple(steps))
