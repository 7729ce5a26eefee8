"""Reduction operators and their numpy kernels."""

from __future__ import annotations

import enum
from collections.abc import Callable

import numpy as np


class ReduceOp(enum.Enum):
    """A reduction operator; ``Average`` is a sum divided by the world size."""

    SUM = "sum"
    AVERAGE = "average"
    MIN = "min"
    MAX = "max"
    PRODUCT = "product"

    def __repr__(self) -> str:
        return f"ddl.{self.name.title()}"


Sum = ReduceOp.SUM
Average = ReduceOp.AVERAGE
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT

# Average reduces as a sum; the division happens once, after the reduction.
_UFUNCS: dict[ReduceOp, Callable[..., np.ndarray]] = {
    ReduceOp.SUM: np.add,
    ReduceOp.AVERAGE: np.add,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.PRODUCT: np.multiply,
}


def as_op(op: object) -> ReduceOp:
    """Return ``op`` as a :class:`ReduceOp`, accepting names such as ``"sum"``.

    Raises:
        ValueError: ``op`` names no operator.
    """
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, str):
        try:
            return ReduceOp(op.lower())
        except ValueError:
            pass
    names = ", ".join(f"ddl.{o.name.title()}" for o in ReduceOp)
    raise ValueError(f"unknown reduction op {op!r}; use one of {names}")


def ufunc(op: ReduceOp) -> Callable[..., np.ndarray]:
    """The numpy ufunc that combines two partial results of ``op`` (``out=`` capable)."""
    return _UFUNCS[op]
