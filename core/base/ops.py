"""Reduction operators and their numpy kernels."""

from __future__ import annotations

import enum
from collections.abc import Callable

import numpy as np


class ReduceOp(enum.Enum):
    """A reduction operator; ``Average`` is a sum divided by the world size.

    ``Adasum`` is Horovod's adaptive summation (Maleki et al., 2020): each tensor is
    combined pairwise, rank by rank, by :func:`ddl.reduction.adasum.combine`, never
    fused with others.
    """

    SUM = "sum"
    AVERAGE = "average"
    MIN = "min"
    MAX = "max"
    PRODUCT = "product"
    ADASUM = "adasum"

    def __repr__(self) -> str:
        return f"ddl.{self.name.title()}"


Sum = ReduceOp.SUM
Average = ReduceOp.AVERAGE
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT
Adasum = ReduceOp.ADASUM

# Average reduces as a sum; the division happens once, after the reduction.
_UFUNCS: dict[ReduceOp, Callable[..., np.ndarray]] = {
    ReduceOp.SUM: np.add,
    ReduceOp.AVERAGE: np.add,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.PRODUCT: np.multiply,
    ReduceOp.ADASUM: np.add,  # only for a world of one, where Adasum is the identity
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


def op_from_average(op: object, average: bool | None) -> object:
    """Horovod's rule for its deprecated ``average=`` argument beside ``op=``.

    ``op`` wins when given (both given is an error); ``average=True``/``False`` means
    Average/Sum, with a DeprecationWarning; neither means Average.

    Raises:
        ValueError: both ``op`` and ``average`` were given.
    """
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of them.")
        return op
    if average is not None:
        import warnings

        warnings.warn("Parameter `average` has been replaced with `op` and will be removed in v1.0",
                      DeprecationWarning, stacklevel=3)
        return ReduceOp.AVERAGE if average else ReduceOp.SUM
    return ReduceOp.AVERAGE
