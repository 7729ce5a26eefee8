"""Schedules: what each rank sends, receives and reduces, step by step.

An algorithm compiles (topology, rank, element count) into a :class:`Schedule`. The
same schedule is executed over MPI (:mod:`ddl.reduction.executor`), checked symbolically
(:mod:`ddl.testing.symbolic`) and priced (:mod:`ddl.reduction.cost`). Ranges are element
offsets into one flat buffer; within a step the send and receive ranges never overlap,
so a step may be cut into segments without reading data it has already overwritten.
A :class:`Step` is a point-to-point exchange; a :class:`GroupStep` is a shared-memory
reduce-scatter or allgather that every member of one host's dim-0 ring runs at once.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class Step:
    """One exchange: send ``buf[send]`` to ``send_peer``, receive ``recv`` from ``recv_peer``.

    ``reduce`` combines what arrives with what is there (reduce-scatter); otherwise it
    replaces it (allgather). A peer of None means that half of the step is absent.
    ``dim`` is the topology dimension of the link, ``phase`` a label for traces.
    """

    send_peer: int | None
    send: tuple[int, int]
    recv_peer: int | None
    recv: tuple[int, int]
    reduce: bool
    dim: int = 0
    phase: str = ""

    @property
    def send_count(self) -> int:
        return self.send[1] - self.send[0] if self.send_peer is not None else 0

    @property
    def recv_count(self) -> int:
        return self.recv[1] - self.recv[0] if self.recv_peer is not None else 0


@dataclasses.dataclass(frozen=True)
class GroupStep:
    """A shared-memory step that every rank of ``members`` (one host) runs together.

    ``chunks[i]`` belongs to ``members[i]``. Reducing (a reduce-scatter): each member
    publishes its whole buffer over the chunks, and member i combines chunk i from
    every member's copy in member order, so the sum has the same bits wherever it is
    read. Copying (an allgather): member i publishes chunk i and every other member
    copies it. Every member's step is the same (members, chunks, reduce).
    """

    members: tuple[int, ...]
    chunks: tuple[tuple[int, int], ...]
    reduce: bool
    dim: int = 0
    phase: str = ""

    @property
    def longest(self) -> int:
        """Elements in the largest chunk."""
        return max((hi - lo for lo, hi in self.chunks), default=0)

    @property
    def span(self) -> int:
        """Elements covered by all chunks together."""
        return sum(hi - lo for lo, hi in self.chunks)


#: Any step of a schedule.
AnyStep = Step | GroupStep


@dataclasses.dataclass(frozen=True)
class Schedule:
    """The steps one rank runs, in order, for an allreduce of ``count`` elements."""

    algorithm: str
    rank: int
    count: int
    steps: tuple[AnyStep, ...]

    @functools.cached_property
    def largest_reduce(self) -> int:
        """Elements of the largest message a reduce step receives (it sizes the scratch
        buffer; asked on every run of a schedule that is compiled once)."""
        return max((s.recv_count for s in self.steps if isinstance(s, Step) and s.reduce), default=0)


NO_RANGE = (0, 0)


def partition(lo: int, hi: int, parts: int) -> list[int]:
    """Boundaries that cut ``[lo, hi)`` into ``parts`` near-equal pieces (``parts + 1`` values)."""
    n = hi - lo
    return [lo + (i * n) // parts for i in range(parts + 1)]


def chunks_of(bounds: Sequence[int]) -> list[tuple[int, int]]:
    """The ranges between consecutive boundaries."""
    return [(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]


def ring_reduce_scatter(
    members: Sequence[int], me: int, chunks: Sequence[tuple[int, int]], *, dim: int, phase: str
) -> list[Step]:
    """Ring reduce-scatter over ``chunks``; afterwards member ``i`` owns chunk ``i``.

    At step ``s`` member ``i`` sends chunk ``i-s-1`` to ``i+1`` and reduces chunk
    ``i-s-2`` from ``i-1`` (indices mod p), so each chunk's sum is built once, along
    the ring, and every rank ends with the same bits.
    """
    p = len(members)
    i = members.index(me)
    nxt, prv = members[(i + 1) % p], members[(i - 1) % p]
    steps = []
    for s in range(p - 1):
        send_chunk, recv_chunk = (i - s - 1) % p, (i - s - 2) % p
        steps.append(
            Step(
                nxt, chunks[send_chunk], prv, chunks[recv_chunk],
                reduce=True, dim=dim, phase=phase,
            )
        )
    return steps


def ring_allgather(
    members: Sequence[int], me: int, chunks: Sequence[tuple[int, int]], *, dim: int, phase: str
) -> list[Step]:
    """Ring allgather: member ``i`` starts owning chunk ``i`` and ends holding all."""
    p = len(members)
    i = members.index(me)
    nxt, prv = members[(i + 1) % p], members[(i - 1) % p]
    steps = []
    for s in range(p - 1):
        send_chunk, recv_chunk = (i - s) % p, (i - s - 1) % p
        steps.append(
            Step(
                nxt, chunks[send_chunk], prv, chunks[recv_chunk],
                reduce=False, dim=dim, phase=phase,
            )
        )
    return steps
