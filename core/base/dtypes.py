"""The element types ddl reduces, and checks that give clear errors for the rest.

bfloat16 comes from the optional ``ml_dtypes`` package, loaded on first need (it costs
most of ``import ddl`` otherwise): a bfloat16 array can only exist once something has
imported it.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ddl.base.ops import ReduceOp

# Horovod's reducible types: every integer width but 64-bit unsigned, and the floats.
_BASE = tuple(np.dtype(t) for t in (np.float16, np.float32, np.float64, np.int32, np.int64, np.uint8, np.int8,
                                    np.int16, np.uint16))
_BOOL = np.dtype(np.bool_)
_FLOAT32 = np.dtype(np.float32)
_UNSET: Any = object()
_bfloat16: np.dtype | None = _UNSET


def bfloat16() -> np.dtype | None:
    """numpy's bfloat16 dtype from ml_dtypes, or None where that package is missing."""
    global _bfloat16
    if _bfloat16 is _UNSET:
        try:
            import ml_dtypes

            _bfloat16 = np.dtype(ml_dtypes.bfloat16)
        except ImportError:  # pragma: no cover - depends on the environment
            _bfloat16 = None
    return _bfloat16


def supported() -> tuple[np.dtype, ...]:
    """Every dtype ddl reduces (bfloat16 where ml_dtypes is installed)."""
    bf16 = bfloat16()
    return _BASE + ((bf16,) if bf16 is not None else ())


def __getattr__(name: str) -> Any:
    # BFLOAT16 as a module constant, resolved (and ml_dtypes loaded) on first use.
    if name == "BFLOAT16":
        return bfloat16()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _is_bfloat16(dtype: np.dtype) -> bool:
    return dtype.name == "bfloat16" and dtype == bfloat16()


def is_floating(dtype: np.dtype) -> bool:
    """True for float16/32/64 and bfloat16."""
    return dtype.kind == "f" or _is_bfloat16(dtype)


def check_dtype(dtype: np.dtype, *, what: str = "array", moves_only: bool = False) -> np.dtype:
    """Return ``dtype`` if ddl can reduce it (``moves_only``: move it, which bool may too).

    Raises:
        TypeError: the dtype is not one of :func:`supported`.
    """
    dtype = np.dtype(dtype)
    if dtype in _BASE or _is_bfloat16(dtype) or (moves_only and dtype == _BOOL):
        return dtype
    names = ", ".join(str(d) for d in supported())
    hint = "" if bfloat16() is not None else " (bfloat16 needs the ml_dtypes package)"
    raise TypeError(f"{what} has dtype {dtype}, which ddl does not reduce; use one of {names}{hint}")


def check_op_for_dtype(op: ReduceOp, dtype: np.dtype) -> None:
    """Refuse ``Adasum`` on integers (its scaling factors are fractions).

    ``Average`` on integers divides and truncates toward zero, as Horovod does.

    Raises:
        TypeError: ``op`` is Adasum and ``dtype`` is an integer type.
    """
    if op is ReduceOp.ADASUM and not is_floating(dtype):
        raise TypeError(
            f"ddl.Adasum on an integer array ({dtype}) is not defined (it scales by fractions); "
            "cast to a float type first"
        )


def scale(buf: np.ndarray, factor: float) -> None:
    """Multiply ``buf`` in place by ``factor``; integers truncate toward zero (Horovod's rule)."""
    if factor == 1.0:
        return
    if is_floating(buf.dtype):
        np.multiply(buf, factor, out=buf, casting="unsafe")
    else:
        buf[...] = np.trunc(buf * np.float64(factor))


def divide(buf: np.ndarray, divisor: int) -> None:
    """Divide ``buf`` in place by ``divisor`` (an Average); integers truncate toward zero."""
    scale = float_division(buf.dtype, divisor)
    if scale is not None:
        scale[0](buf, scale[1], buf)
    elif is_floating(buf.dtype):
        np.divide(buf, divisor, out=buf)
    else:
        buf[...] = np.trunc(buf / np.float64(divisor))


@functools.lru_cache(maxsize=256)
def float_division(dtype: np.dtype, divisor: int) -> tuple[np.ufunc, np.generic] | None:
    """The one ufunc call (and its operand, already of ``dtype``) that divides a buffer of
    real floats by ``divisor``, bit for bit as ``np.divide`` does; None for other dtypes.

    For a power of two it multiplies by the reciprocal: ``x * 2**-k`` and ``x / 2**k`` are
    the same real number, rounded once either way, so the bits are equal, and a multiply
    is cheaper. A small Average pays this per call (at 4 KiB, numpy's divide by a Python
    int cost 0.7 us against 0.46 us for the typed multiply).
    """
    if dtype.kind != "f" or divisor <= 0:
        return None
    if divisor & (divisor - 1) == 0:
        return np.multiply, dtype.type(1.0 / divisor)
    return np.divide, dtype.type(divisor)


def accumulator(dtype: np.dtype) -> np.dtype:
    """The dtype a reduction of ``dtype`` accumulates in: float32 for the half types
    (float16, bfloat16), so sums neither lose bits with the tensor's size nor overflow
    before an Average divides; ``dtype`` itself otherwise."""
    return _FLOAT32 if dtype.itemsize == 2 and is_floating(dtype) else dtype
