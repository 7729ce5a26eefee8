"""How two results are compared: the largest difference relative to the reference tensor's scale."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


def rel_diff(a: np.ndarray, b: np.ndarray) -> float:
    """max|a - b| / max|b| (0 when both are zero); shapes must match.

    Relative to the tensor's largest entry rather than entry by entry, so a weight that
    stayed near zero does not turn a rounding difference into a large ratio.
    """
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        raise ValueError(f"cannot compare shapes {a.shape} and {b.shape}")
    scale = float(np.max(np.abs(b))) if b.size else 0.0
    diff = float(np.max(np.abs(a - b))) if a.size else 0.0
    return diff / scale if scale else diff


def max_rel_diff(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> float:
    """The largest :func:`rel_diff` over the weights of two models (the same names)."""
    if set(a) != set(b):
        raise ValueError(f"the two weight sets differ: {sorted(set(a) ^ set(b))}")
    return max((rel_diff(a[k], b[k]) for k in a), default=0.0)
