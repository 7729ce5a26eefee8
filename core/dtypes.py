"""The element types ddl reduces, and checks that give clear errors for the rest."""

from __future__ import annotations

import numpy as np

from ddl.ops import ReduceOp

try:  # bfloat16 is optional: numpy has none of its own.
    import ml_dtypes

    BFLOAT16: np.dtype | None = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the environment
    BFLOAT16 = None

_BASE = [np.float16, np.float32, np.float64, np.int32, np.int64, np.uint8]
SUPPORTED: tuple[np.dtype, ...] = tuple(np.dtype(t) for t in _BASE) + (
    (BFLOAT16,) if BFLOAT16 is not None else ()
)


def is_floating(dtype: np.dtype) -> bool:
    """True for float16/32/64 and bfloat16."""
    return dtype.kind == "f" or (BFLOAT16 is not None and dtype == BFLOAT16)


def check_dtype(dtype: np.dtype, *, what: str = "array") -> np.dtype:
    """Return ``dtype`` if ddl can reduce it.

    Raises:
        TypeError: the dtype is not one of :data:`SUPPORTED`.
    """
    dtype = np.dtype(dtype)
    if dtype not in SUPPORTED:
        names = ", ".join(str(d) for d in SUPPORTED)
        hint = "" if BFLOAT16 is not None else " (bfloat16 needs the ml_dtypes package)"
        raise TypeError(f"{what} has dtype {dtype}, which ddl does not reduce; use one of {names}{hint}")
    return dtype


def check_op_for_dtype(op: ReduceOp, dtype: np.dtype) -> None:
    """Refuse ``Average`` on integers, whose division would truncate silently.

    Raises:
        TypeError: ``op`` is Average and ``dtype`` is an integer type.
    """
    if op is ReduceOp.AVERAGE and not is_floating(dtype):
        raise TypeError(
            f"ddl.Average on an integer array ({dtype}) would truncate; "
            "use op=ddl.Sum and divide yourself, or cast to a float type first"
        )


_FLOAT32 = np.dtype(np.float32)


def accumulator(dtype: np.dtype) -> np.dtype:
    """The dtype a reduction of ``dtype`` accumulates in: float32 for the half types
    (float16, bfloat16), so sums neither lose bits with the tensor's size nor overflow
    before an Average divides; ``dtype`` itself otherwise."""
    return _FLOAT32 if dtype.itemsize == 2 and is_floating(dtype) else dtype
