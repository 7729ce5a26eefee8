"""Adasum, Horovod's adaptive summation (Maleki et al., 2020), as a pure function on numpy.

Two gradients ``a`` and ``b`` combine as ``(1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b``:
parallel components are averaged, orthogonal ones added. Ranks combine pairwise in a
binary tree in rank order ((0,1), (2,3), then the pairs' results, ...), as Horovod's
recursive vector-halving does for a power-of-two world; the dot products are taken in
float64. A world that is not a power of two carries its odd one out up a level (where
Horovod refuses). Every rank runs the same tree on the same inputs: identical bits.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The Adasum of two vectors of one shape and float dtype."""
    a64, b64 = a.astype(np.float64, copy=False).reshape(-1), b.astype(np.float64, copy=False).reshape(-1)
    dot = float(a64 @ b64)
    anorm, bnorm = float(a64 @ a64), float(b64 @ b64)
    acoeff = 1.0 - dot / (2.0 * anorm) if anorm > 0 else 1.0
    bcoeff = 1.0 - dot / (2.0 * bnorm) if bnorm > 0 else 1.0
    return (acoeff * a64 + bcoeff * b64).astype(a.dtype).reshape(a.shape)


def combine(parts: Sequence[np.ndarray]) -> np.ndarray:
    """The Adasum of every rank's part (rank order), by the pairwise tree.

    Example:
        >>> combine([np.array([1.0, 0.0]), np.array([1.0, 0.0])])  # parallel: averaged
        array([1., 0.])
        >>> combine([np.array([1.0, 0.0]), np.array([0.0, 1.0])])  # orthogonal: added
        array([1., 1.])
    """
    level = [np.asarray(p) for p in parts]
    if not level:
        raise ValueError("Adasum of no parts")
    while len(level) > 1:
        nxt = [pair(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return np.array(level[0], copy=True)
