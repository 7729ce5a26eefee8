"""Which rank owns each tensor of a sharded optimizer: balanced by bytes, a pure function of the manifest.

ZeRO stage 1 (Rajbhandari et al. 2019) gives every rank the optimizer state of a part
of the parameters only. ddl assigns whole tensors, so any per-tensor optimizer (SGD,
Adam, Adagrad, Adafactor, Muon, Keras's slots) runs unchanged on its part, and a
checkpoint names each tensor's state by the tensor's name. The assignment is the
longest-processing-time rule: tensors from the largest down (ties by their place in the
manifest), each to the rank with the fewest bytes so far (ties to the lower rank). It
depends on the sizes and the world size alone, so every rank derives the same one, a new
world (elastic, or a checkpoint loaded elsewhere) derives its own, and no rank carries
more than ``total / world + largest tensor`` bytes.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Sequence

#: The owner of a tensor that nobody updates (a frozen one).
NOBODY = -1


@dataclasses.dataclass(frozen=True)
class Partition:
    """The owner of each tensor, by its index in the manifest.

    Attributes:
        world_size: the ranks the tensors are shared among.
        owners: one entry per tensor: its owning rank, or :data:`NOBODY`.
        loads: bytes owned per rank.
    """

    world_size: int
    owners: tuple[int, ...]
    loads: tuple[int, ...]

    def owned_by(self, rank: int) -> list[int]:
        """The indices of the tensors ``rank`` owns, in manifest order.

        Example:
            >>> partition_by_bytes([8, 4, 4], 2).owned_by(1)
            [1, 2]
        """
        return [i for i, r in enumerate(self.owners) if r == rank]

    @property
    def largest_load(self) -> int:
        """The bytes of the most loaded rank."""
        return max(self.loads, default=0)


def partition_by_bytes(nbytes: Sequence[int], world_size: int, *, skip: Sequence[bool] | None = None) -> Partition:
    """Assign each tensor to one rank so that the ranks own about equal bytes.

    Args:
        nbytes: each tensor's size in bytes, in manifest order.
        world_size: the number of ranks.
        skip: True for tensors nobody updates (frozen ones): they get :data:`NOBODY`.

    Returns:
        The :class:`Partition`; the same for the same arguments on every rank and run.

    Raises:
        ValueError: ``world_size`` below 1, a negative size, or ``skip`` of another length.

    Example:
        >>> partition_by_bytes([400, 100, 300, 200], 2).owners
        (0, 0, 1, 1)
    """
    if world_size < 1:
        raise ValueError(f"a partition needs a world of at least one rank, got world_size={world_size}")
    if skip is not None and len(skip) != len(nbytes):
        raise ValueError(f"skip has {len(skip)} entries for {len(nbytes)} tensors")
    if any(n < 0 for n in nbytes):
        raise ValueError(f"tensor sizes must not be negative, got {min(nbytes)}")
    owners = [NOBODY] * len(nbytes)
    loads = [0] * world_size
    heap = [(0, r) for r in range(world_size)]
    for i in sorted(range(len(nbytes)), key=lambda i: (-nbytes[i], i)):
        if skip is not None and skip[i]:
            continue
        load, rank = heapq.heappop(heap)
        owners[i] = rank
        loads[rank] = load + nbytes[i]
        heapq.heappush(heap, (loads[rank], rank))
    return Partition(world_size, tuple(owners), tuple(loads))


def by_owner(indices: Sequence[int], owners: Sequence[int]) -> list[int]:
    """``indices`` reordered so each owner's tensors are adjacent, owners in rank order
    (stable within an owner; :data:`NOBODY`'s last): the layout of a sharded bucket, whose
    rank-r segment is what rank r updates.

    Example:
        >>> by_owner([5, 6, 7, 8], [0, 0, 0, 0, 0, 1, 0, 1, -1])
        [6, 5, 7, 8]
    """
    return sorted(indices, key=lambda i: (owners[i] if owners[i] != NOBODY else len(owners) + 1))


def segment_bounds(counts: Sequence[int]) -> tuple[int, ...]:
    """Boundaries of consecutive segments of ``counts`` elements (``len(counts) + 1`` values).

    Example:
        >>> segment_bounds([3, 0, 2])
        (0, 3, 3, 5)
    """
    out = [0]
    for c in counts:
        out.append(out[-1] + c)
    return tuple(out)
