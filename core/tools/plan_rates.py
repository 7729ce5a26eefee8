"""The rates ``ddl plan --modes`` prices hooks' own work at, measured on this core at the model's real shapes.

A hook's work is a few kinds of operation, each with its own speed: PowerSGD's three
products per weight (M Q, Mᵀ P, P Qᵀ: thin, so bound by reading or writing M, and the
transposed one slower than the others), its error-feedback passes (the error added, the
approximation taken off), and a compressor's casts (divide and cast to the wire type,
cast back). One product shape or one cached element-wise pass stands for none of them
well: on the slow-links benchmark's model a 2048x2048 product through numpy's BLAS gave
17 GFLOP/s and a 16 MB ``np.add`` 29-75 GB/s (cache-resident), and the plan priced
PowerSGD's step 36 % short. So each rate here times the operations themselves, at the
sizes the hook will run them, through the same kernels (the adapter's ``matmul``, the
installed cast kernels :mod:`ddl.base.kernels`).

Example:
    >>> rate = product_rate(ddl.PowerSGD(rank=4), [(2048, 2048)], matmul=ddl.torch.kernels.matmul)  # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ddl.base import kernels
from ddl.engine.powersgd import PowerSGD
from ddl.reduction.probes import median_time

__all__ = ["cast_rate", "pass_rate", "product_flops", "product_rate"]


def _median(fn: Callable[[], Any], repeats: int) -> float:
    """Median seconds of ``fn`` after a first touch (pages, kernels' set-up), on this rank alone."""
    return median_time(fn, repeats, None, math.inf)


def product_flops(n: int, m: int, r: int) -> float:
    """Flops (2 per multiply-add) of PowerSGD's three products for an n x m weight at rank r."""
    return 6.0 * n * m * r


def product_rate(hook: PowerSGD, shapes: Sequence[tuple[int, ...]], *, matmul: Callable[..., Any] = np.matmul,
                 out_axis: int = 0, repeats: int = 5) -> float:
    """Flops per second of ``hook``'s products over every compressed weight of ``shapes``
    (M Q, Mᵀ P through a transposed view, P Qᵀ written over M, as the hook runs them).

    Raises:
        ValueError: no weight of ``shapes`` is compressed (nothing to time).
    """
    weights = hook.products(shapes, out_axis=out_axis)
    if not weights:
        raise ValueError(f"product_rate: no weight of {list(shapes)} is compressed by {hook!r}")
    rng = np.random.default_rng(0)
    mats = [(rng.standard_normal((n, m), np.float32), rng.standard_normal((m, r), np.float32),
             np.empty((n, r), np.float32), np.empty((n, m), np.float32)) for n, m, r in weights]

    def run() -> None:
        for a, q, p, approx in mats:
            matmul(a, q, out=p)
            matmul(a.T, p, out=q)
            matmul(p, q.T, out=approx)  # written over the bucket in the hook: a fresh n x m write

    return sum(product_flops(n, m, r) for n, m, r in weights) / _median(run, repeats)


def pass_rate(count: int, *, repeats: int = 5) -> float:
    """Bytes per second of the error-feedback passes over ``count`` float32 elements (the error
    added to the gradient, the approximation taken off: read two, write one, twice)."""
    count = max(1, count)
    e, g, m = (np.ones(count, np.float32) for _ in range(3))

    def run() -> None:
        np.add(e, g, out=m)
        np.subtract(m, g, out=m)

    return 6.0 * count * 4 / _median(run, repeats)


def cast_rate(count: int, wire: np.dtype | str = "float16", *, repeats: int = 5) -> float:
    """Bytes per second of a compressor's two casts over ``count`` float32 elements through
    the installed kernels (pack: divide and cast to ``wire``; unpack: cast back), counted as
    each reads and writes them."""
    count = max(1, count)
    src = (np.random.default_rng(0).standard_normal(count) * 1e-3).astype(np.float32)
    half = np.empty(count, np.dtype(wire))
    back = np.empty(count, np.float32)

    def run() -> None:
        kernels.divide_into(half, src, 2)
        kernels.cast_into(back, half)

    moved = 2.0 * count * (4 + half.itemsize)
    return moved / _median(run, repeats)


def model_elements(shapes: Sequence[tuple[int, ...]]) -> int:
    """Elements of every tensor of ``shapes``."""
    return sum(math.prod(s) for s in shapes)
