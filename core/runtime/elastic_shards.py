"""Which samples each rank takes from what is left of an epoch, for any world size (pure).

An elastic job changes size in the middle of an epoch; the samplers of the adapters
(``ddl.torch.elastic.ElasticSampler``, ``ddl.caffe``'s readers, the Keras example) deal
the epoch's *remaining* samples over the new world with these functions. The epoch's
order is a fixed permutation (seed + epoch); ``processed`` counts the samples of that
order already trained on, and dealing is round robin, so after ``k`` whole steps of
``b`` samples per rank the processed samples are exactly the first ``k * b * size`` of
the order, whatever the sizes of the worlds before.
"""

from __future__ import annotations

import numpy as np


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
        >>> deal(np.arange(7), rank=2, size=3, batch_size=2).tolist()
        [2, 5]
        >>> deal(np.arange(7), rank=2, size=3, batch_size=1).tolist()   # q=2 is a multiple of 1
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
