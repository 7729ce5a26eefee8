"""Where the world stands in its data, for any world size: :class:`DataPosition`, the one type torch, Keras and Caffe keep.

An elastic job changes size in the middle of an epoch. What carries the data across is
how many samples the *world* has processed in the current epoch (not which ones each
rank read): the epoch's order is a fixed permutation (seed + epoch), dealing is round
robin, so after ``k`` whole steps of ``b`` samples per rank the processed samples are
exactly the first ``k * b * size`` of the order, whatever the sizes of the worlds before.
A new world deals what remains over its own ranks (:meth:`DataPosition.share`).
``ddl.torch.elastic.ElasticSampler``, ``ddl.tensorflow.keras.elastic.ElasticDataset``
and ``ddl-caffe train --elastic``'s LMDB readers (an endless stream: the position modulo
the records, :meth:`DataPosition.stream_offset`) each keep one.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass
class DataPosition:
    """The epoch and the samples of it the whole world has processed; committed with the state.

    Example:
        >>> position = DataPosition()
        >>> position.advance(per_rank=4, size=3)        # one step of 4 samples on each of 3 ranks
        >>> position.processed, position.share(10, rank=1, size=2, batch_size=2).tolist()
        (12, [])
        >>> DataPosition(processed=3).share(8, rank=0, size=2, batch_size=1, shuffle=False).tolist()
        [3, 5, 7]
    """

    epoch: int = 0
    processed: int = 0
    seed: int = 0

    def advance(self, *, per_rank: int, size: int, limit: int | None = None) -> None:
        """Count one step of ``per_rank`` samples on each of ``size`` ranks (at most ``limit`` in all)."""
        self.processed += per_rank * size
        if limit is not None:
            self.processed = min(limit, self.processed)

    def start_epoch(self, epoch: int) -> None:
        """Begin ``epoch``: nothing of it processed yet."""
        self.epoch, self.processed = int(epoch), 0

    def share(self, count: int, *, rank: int, size: int, batch_size: int | None,
              shuffle: bool = True) -> np.ndarray:
        """This rank's indices of what remains of the epoch's ``count`` samples (see :func:`deal`)."""
        order = epoch_order(count, epoch=self.epoch, seed=self.seed, shuffle=shuffle)
        return deal(order[self.processed:], rank=rank, size=size, batch_size=batch_size)

    def stream_offset(self, count: int) -> int:
        """Where an endless stream of ``count`` records stands (Caffe's readers wrap at the end)."""
        return self.processed % count if count else 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "processed_num": self.processed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Take a :meth:`state_dict` (the seed is the program's, not the state's)."""
        self.epoch, self.processed = int(state["epoch"]), int(state["processed_num"])


class Positioned:
    """What a framework's elastic sampler or dataset holding a :class:`DataPosition` in
    ``self.position`` shows of it: the epoch, the samples processed, a state to commit
    (loading one deals the rest of the epoch again, through the sampler's ``reset``)."""

    position: DataPosition

    def reset(self) -> None:
        raise NotImplementedError

    @property
    def epoch(self) -> int:
        return self.position.epoch

    @property
    def processed_num(self) -> int:
        """Samples of this epoch the whole world has processed."""
        return self.position.processed

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` (call it at the *end* of the previous one, so a reset does not repeat it)."""
        self.position.start_epoch(epoch)
        self.reset()

    def state_dict(self) -> dict[str, int]:
        return self.position.state_dict()

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        self.position.load_state_dict(state_dict)
        self.reset()


def epoch_order(count: int, *, epoch: int, seed: int, shuffle: bool) -> np.ndarray:
    """The order of an epoch's ``count`` samples: the same on every rank and in every world.

    Example:
        >>> epoch_order(5, epoch=0, seed=0, shuffle=False).tolist()
        [0, 1, 2, 3, 4]
    """
    order = np.arange(count, dtype=np.int64)
    if shuffle:
        np.random.default_rng([seed, epoch]).shuffle(order)
    return order


def deal(remaining: np.ndarray, *, rank: int, size: int, batch_size: int | None = None) -> np.ndarray:
    """This rank's samples of ``remaining``: every ``size``-th one from its rank on.

    Ranks get ``q`` or ``q + 1`` samples (``q = len // size``), no sample twice. That
    would give ranks different numbers of batches (one more, with one sample) exactly when
    ``q`` is a multiple of ``batch_size``: then, and only then (or always when
    ``batch_size`` is unknown), each rank with ``q`` takes one more sample from the last
    ``len % size`` ones, so every rank runs the same number of steps; those few samples
    are then seen by more than one rank in the epoch's last step.

    Example:
        >>> deal(np.arange(7), rank=2, size=3, batch_size=4).tolist()
        [2, 5]
        >>> deal(np.arange(7), rank=2, size=3, batch_size=2).tolist()   # q=2 is a multiple of 2
        [2, 5, 6]
    """
    mine = remaining[rank::size]
    q, extra = divmod(len(remaining), size)
    if extra and rank >= extra and (batch_size is None or q % batch_size == 0):
        mine = np.append(mine, remaining[q * size + rank % extra])
    return mine


def batches_per_rank(remaining: int, *, size: int, batch_size: int) -> int:
    """How many batches of ``batch_size`` each rank runs over ``remaining`` samples (the same on all)."""
    q, extra = divmod(remaining, size)
    return -(-(q + (1 if extra else 0)) // batch_size)
