"""torch's vectorized casts and half-type sums, installed as the core's kernels (:mod:`ddl.base.kernels`).

They work on the core's numpy arrays through zero-copy tensor views and give numpy's
bits (IEEE round-to-nearest-even; a half sum is computed in float32 and rounded once),
at memory speed where numpy takes about 100 ns per subnormal float16. bfloat16 stays with
numpy's (ml_dtypes') kernels: torch writes another NaN bit pattern there.
``matmul`` is torch's, for hooks that multiply matrices (PowerSGD): it follows the
process's ``torch.set_num_threads`` as the model's own products do.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

import torch
from ddl.base import kernels

#: Elements divided per piece (1 MiB of float32).
_PIECE = 1 << 18
_BY_NAME = {"float16": torch.float16, "float32": torch.float32, "float64": torch.float64}


def _tensor(a: np.ndarray, *, read_only: bool = False) -> torch.Tensor | None:
    """``a`` as a tensor sharing its memory, or None where torch cannot view it (``read_only``:
    an input, which may be a read-only buffer, such as MPI hands a reduction op)."""
    if a.dtype.name not in _BY_NAME or any(st < 0 for st in a.strides):
        return None
    if a.flags.writeable:
        return torch.from_numpy(a)
    if not read_only:
        return None
    with warnings.catch_warnings():  # torch warns that it could write there; it only reads
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(a)


def _cast(dst: np.ndarray, src: np.ndarray) -> None:
    d, s = _tensor(dst), _tensor(src, read_only=True)
    if d is None or s is None or d.shape != s.shape:
        np.copyto(dst, src, casting="unsafe")
        return
    d.copy_(s)


def _divide(dst: np.ndarray, src: np.ndarray, divisor: int) -> None:
    d, s = _tensor(dst), _tensor(src, read_only=True)
    if d is None or s is None or d.shape != s.shape or s.dtype not in (torch.float32, torch.float64):
        np.divide(src, divisor, out=dst, casting="unsafe")
        return
    # In src's precision (a true division, as numpy's), rounded once into dst's type. In
    # pieces through a scratch that stays in cache: torch's mixed-dtype division is slower
    # than its division and its cast apart.
    step = min(s.numel(), _PIECE)
    scratch = torch.empty(step, dtype=s.dtype)
    for at in range(0, s.numel(), step):
        k = min(step, s.numel() - at)
        torch.div(s[at : at + k], divisor, out=scratch[:k])
        d[at : at + k].copy_(scratch[:k])


def _add(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    ta, tb, to = _tensor(a, read_only=True), _tensor(b, read_only=True), _tensor(out)
    if ta is None or tb is None or to is None:
        return np.add(a, b, out=out)  # type: ignore[no-any-return]
    torch.add(ta, tb, out=to)
    return out


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> Any:
    """``a @ b`` by torch (into ``out`` where given), for arrays of one float dtype."""
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)  # strided views (a transpose) as they are
    if out is None:
        return torch.matmul(ta, tb).numpy()
    torch.matmul(ta, tb, out=torch.from_numpy(out))
    return out


TORCH = kernels.Kernels("torch", _cast, _divide, _add)


def install() -> None:
    """Make the core cast and sum half types with torch."""
    kernels.install(TORCH)
