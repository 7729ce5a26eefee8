"""The conformance data: fixed batches of scikit-learn's bundled 8x8 digits, sharded by rank."""

from __future__ import annotations

import functools

import numpy as np


@functools.lru_cache(maxsize=1)
def _digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled digits, pixels scaled to [0, 1] (read once per process)."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return (d.data / 16.0).astype(np.float32), d.target.astype(np.int64)


def digits_batches(steps: int, batch: int, *, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """``steps`` global batches (x float32 (batch, 64) in [0, 1], y int64), the same on every rank."""
    x, y = _digits()
    order = np.random.default_rng(seed).permutation(len(x))
    if steps * batch > len(x):
        raise ValueError(f"{steps} steps of {batch} need {steps * batch} samples; digits has {len(x)}")
    return [(x[order[s * batch:(s + 1) * batch]], y[order[s * batch:(s + 1) * batch]]) for s in range(steps)]


def test_inputs(n: int = 64) -> np.ndarray:
    """``n`` digits (a seeded choice) on which model outputs are compared."""
    x, _ = _digits()
    order = np.random.default_rng(12345).permutation(len(x))
    return x[order[-n:]]


def shard(batch: tuple[np.ndarray, np.ndarray], rank: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank ``rank``'s contiguous slice of a global batch (its length must divide by ``size``)."""
    x, y = batch
    if len(x) % size:
        raise ValueError(f"a global batch of {len(x)} does not split evenly over {size} ranks")
    n = len(x) // size
    return x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]
