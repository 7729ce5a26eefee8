"""The element-wise kernels the half types need, replaceable by an adapter with its framework's vectorized ones.

numpy converts float32 to float16 one element at a time, and where a result is
subnormal (most gradients below 6e-5 are) it raises the floating-point underflow flag
per element: about 100 ns each, so casting a 5 M-element bucket costs half a second.
Adding float16 arrays goes through the same conversions. The frameworks ddl serves
carry vectorized kernels for exactly these operations (a float16 cast at memory speed);
``ddl.torch`` installs torch's here at import (:func:`install`), and the core keeps
calling these functions, never a framework.

Every kernel gives the bits numpy's operation gives (IEEE round-to-nearest-even casts;
a half sum computed in float32 and rounded once, which numpy does too), so which
implementation is installed changes speed, never a result. ``tests`` check that on
subnormals, overflow, infinities and NaN.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from ddl.base.ops import ReduceOp, ufunc

__all__ = ["Kernels", "NUMPY", "cast_into", "combiner", "divide_into", "install", "installed"]


def _numpy_cast(dst: np.ndarray, src: np.ndarray) -> None:
    np.copyto(dst, src, casting="unsafe")


def _numpy_divide(dst: np.ndarray, src: np.ndarray, divisor: int) -> None:
    np.divide(src, divisor, out=dst, casting="unsafe")


def _numpy_add(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    return np.add(a, b, out=out)  # type: ignore[no-any-return]


@dataclasses.dataclass(frozen=True)
class Kernels:
    """One set of kernels, all on 1-D (or same-shape) arrays:

    - ``cast(dst, src)``: ``dst[...] = src`` converted to ``dst``'s dtype;
    - ``divide(dst, src, divisor)``: ``src / divisor`` in ``src``'s precision, then cast into ``dst``;
    - ``add(a, b, out)``: the sum of two arrays of one half type, into ``out`` (may be ``a``), returned.

    ``name`` says whose they are (``ddl plan``'s and the benchmarks' output).
    """

    name: str
    cast: Callable[[np.ndarray, np.ndarray], None]
    divide: Callable[[np.ndarray, np.ndarray, int], None]
    add: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


#: numpy's own operations: correct everywhere, slow on the half types.
NUMPY = Kernels("numpy", _numpy_cast, _numpy_divide, _numpy_add)

_installed = NUMPY


def install(kernels: Kernels) -> None:
    """Use ``kernels`` from now on (an adapter's, at its import). They must give numpy's bits."""
    global _installed
    _installed = kernels


def installed() -> Kernels:
    """The kernels in use."""
    return _installed


def _is_half(dtype: np.dtype) -> bool:
    return dtype.itemsize == 2 and (dtype.kind == "f" or dtype.name == "bfloat16")


def cast_into(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src``, converted (by the installed kernels where a half type is involved)."""
    if src.dtype == dst.dtype or not (_is_half(src.dtype) or _is_half(dst.dtype)):
        np.copyto(dst, src, casting="unsafe")
    else:
        _installed.cast(dst, src)


def divide_into(dst: np.ndarray, src: np.ndarray, divisor: int) -> None:
    """``dst[...] = src / divisor``, divided in ``src``'s precision and then converted."""
    if _is_half(dst.dtype) or _is_half(src.dtype):
        _installed.divide(dst, src, divisor)
    else:
        np.divide(src, divisor, out=dst, casting="unsafe")


def combiner(op: ReduceOp, dtype: np.dtype) -> Callable[..., np.ndarray]:
    """What reduces two arrays of ``dtype`` with ``op`` (``combine(a, b, out=...)``): the
    installed half add for a sum of a half type, numpy's ufunc otherwise."""
    if op in (ReduceOp.SUM, ReduceOp.AVERAGE) and _is_half(np.dtype(dtype)):
        add = _installed.add
        return lambda a, b, out: add(a, b, out)
    return ufunc(op)
