"""A flat input held as a bucket's tensors, read where they lie instead of packed first.

A bucket of many tensors used to be packed into its fused buffer (one memory pass of the
whole bucket) before the algorithm read it. ``shm``'s first step copies every chunk but
the rank's own into its shared slot anyway, so it can copy them straight from the
tensors; the pack was a pass more than one tensor of the same size costs (256 tensors of
16 KiB at 2 ranks: ~0.4 ms of a ~2 ms call). Each read is one ``np.concatenate`` over the
tensors the range covers, so the per-tensor cost stays in C.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence

import numpy as np

__all__ = ["Scattered", "Source", "fill", "read"]


class Scattered:
    """The flattened concatenation of ``arrays`` (one dtype, any shapes), not built."""

    __slots__ = ("arrays", "dtype", "size", "starts")

    def __init__(self, arrays: Sequence[np.ndarray]) -> None:
        if not arrays:
            raise ValueError("a scattered input needs at least one array")
        dtype = arrays[0].dtype
        if any(a.dtype != dtype for a in arrays):
            raise ValueError("a scattered input's arrays must share one dtype")
        self.arrays = list(arrays)
        self.dtype = dtype
        #: Element offset of each array in the flat input, then the total.
        self.starts = [0, *itertools.accumulate(a.size for a in self.arrays)]
        self.size = self.starts[-1]

    def read(self, lo: int, n: int, out: np.ndarray) -> None:
        """Copy elements ``[lo, lo + n)`` of the flat input into the 1-D ``out`` (``n`` long)."""
        if n <= 0:
            return
        hi = lo + n
        if lo < 0 or hi > self.size or out.shape != (n,):
            raise ValueError(f"range [{lo}, {hi}) into {out.shape} does not fit an input of {self.size} elements")
        starts, arrays = self.starts, self.arrays
        first = bisect.bisect_right(starts, lo) - 1
        last = bisect.bisect_left(starts, hi) - 1  # the array holding element hi - 1
        if first == last:
            out[...] = self._flat(first)[lo - starts[first] : hi - starts[first]]
            return
        # Only the two end arrays are cut; whole ones go in as they are (axis=None flattens them in C).
        head = arrays[first] if lo == starts[first] else self._flat(first)[lo - starts[first] :]
        tail = arrays[last] if hi == starts[last + 1] else self._flat(last)[: hi - starts[last]]
        np.concatenate([head, *arrays[first + 1 : last], tail], axis=None, out=out)

    def _flat(self, i: int) -> np.ndarray:
        """Array ``i`` as one flat view, for a read that cuts it. A strided one is copied once,
        the first time a read cuts it: its flat view would otherwise be a copy of the whole
        tensor at every read (checked here, not for all at construction: a bucket of
        hundreds of tensors pays for the two that each read cuts, not for every one)."""
        a = self.arrays[i]
        if not a.flags.c_contiguous:
            a = self.arrays[i] = np.ascontiguousarray(a)
        return a.reshape(-1)


#: An algorithm's input: one flat array, or a bucket's tensors as they lie.
Source = np.ndarray | Scattered


def read(src: Source, lo: int, n: int, out: np.ndarray) -> None:
    """Elements ``[lo, lo + n)`` of ``src`` into ``out``."""
    if isinstance(src, Scattered):
        src.read(lo, n, out)
    else:
        out[...] = src[lo : lo + n]


def fill(buf: np.ndarray, src: Source) -> None:
    """All of ``src`` into the 1-D ``buf`` (an algorithm that cannot read it where it lies)."""
    read(src, 0, buf.size, buf)
