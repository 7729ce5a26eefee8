"""Which items of a data source each rank reads: one endless stream of epochs, dealt round-robin over the ranks.

Caffe's multi-GPU Data and HDF5Data layers deal a source this way (``Skip()`` keeps the record at running offset
``o`` on rank ``o % solver_count``), so the ranks together read each record once per epoch and a step of N ranks
at batch B reads what one process at batch N x B reads. Caffe's ImageData layer does not deal at all (every rank
reads the whole list, shuffled with its own seed) and its shuffled HDF5Data reshuffles on each rank alone, so ranks
read the same samples within an epoch. Here every source is dealt alike: the epochs' orders (shuffled or not) come
from one seed every rank shares, and rank ``r`` of ``n`` takes stream positions ``r, r + n, r + 2n, ...``; an
iteration that crosses an epoch's end takes the last items of one epoch and the first of the next, so no item is
read twice within any window of one epoch's length.
"""

from __future__ import annotations

import torch


class StreamDeal:
    """Item indices for one rank: stream position ``p`` is item ``order(p // count)[p % count]``.

    Args:
        count: items in the source (one epoch).
        rank, size: this rank among ``size`` (TEST-phase nets read the whole stream: rank 0 of 1).
        seed: the shuffle seed, the same on every rank; None keeps the source's order in every epoch.
        skip: stream positions the world skips before the first (Caffe's ``rand_skip``, drawn alike on every rank).

    Example:
        >>> deal = StreamDeal(5, rank=1, size=2)
        >>> [deal.next() for _ in range(4)]
        [1, 3, 0, 2]
    """

    def __init__(self, count: int, *, rank: int = 0, size: int = 1, seed: int | None = None, skip: int = 0) -> None:
        if count <= 0:
            raise ValueError(f"a data source needs at least one item, got {count}")
        if not 0 <= rank < size:
            raise ValueError(f"rank {rank} is not among {size} ranks")
        self.count, self.rank, self.size, self.seed = count, rank, size, seed
        self.position = skip + rank
        self._epoch = -1
        self._order: list[int] = []

    def order(self, epoch: int) -> list[int]:
        """The items of ``epoch`` in the order the world reads them."""
        if self.seed is None:
            return list(range(self.count))
        gen = torch.Generator().manual_seed((self.seed + 1_000_003 * epoch) % (1 << 63))
        return torch.randperm(self.count, generator=gen).tolist()

    def next(self) -> int:
        """This rank's next item."""
        epoch, at = divmod(self.position, self.count)
        if epoch != self._epoch:
            self._epoch, self._order = epoch, self.order(epoch)
        self.position += self.size
        return self._order[at]

    def advance(self, items: int) -> None:
        """Skip this rank's next ``items`` items (a resumed run going past what was read)."""
        self.position += items * self.size
