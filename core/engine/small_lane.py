"""The small synchronous allreduce, prepared once per call signature.

A training loop calls ``allreduce`` on the same few small shapes again and again
(SyncBatchNorm's statistics, a metric, a loss). Everything such a call needs besides
its data and its name is the same every time: the checks it passed, the hash of its
descriptor without the name, the typed views of the cycle record it rides in. A
:class:`Lane` holds them, so the engine's lean path (:meth:`ddl.engine.engine.Engine.run_lane`)
costs one exchange and one reduction, and builds a request only when the other ranks
hold something else.

A lane is built only where the result is bit for bit what the queued path gives: a
numpy array of a dtype that is its own accumulator, small enough to travel inline,
under ``auto``, with no compression and no scaling.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from ddl.base.dtypes import accumulator, float_division
from ddl.base.ops import ReduceOp, ufunc
from ddl.engine.codec import INLINE_BYTES
from ddl.engine.fusion import Request
from ddl.engine.negotiation import body_digest


@dataclasses.dataclass(slots=True, eq=False)
class Lane:
    """One call signature's prepared state (see the module docstring)."""

    #: The op as the caller passed it (the lane cache's key holds only its id).
    passed: Any
    op: ReduceOp
    #: ``op``'s ufunc, and whether it is Average (the reduction's order is :func:`ddl.engine.fusion.reduce_with`'s).
    combine: Callable[..., np.ndarray]
    average: bool
    #: An Average's division, prepared (:func:`ddl.base.dtypes.float_division`; None: not an Average of floats).
    scale: tuple[np.ufunc, np.generic] | None
    inplace: bool
    nbytes: int
    #: :func:`ddl.engine.negotiation.body_digest` of the request's descriptor.
    body: int
    #: This rank's outgoing payload and every rank's incoming one, typed and shaped.
    staged: np.ndarray
    parts: list[np.ndarray]
    #: Builds the full request (same descriptor, so the same digest) for the queue.
    request: Callable[[np.ndarray, str], Request]


def eligible(x: Any, compact: bool, default_algorithm: str) -> bool:
    """Whether ``x`` can take a lane at all (the rest of the checks are the request's)."""
    return (type(x) is np.ndarray and not compact and default_algorithm == "auto"
            and 0 < x.nbytes <= INLINE_BYTES and accumulator(x.dtype) == x.dtype)


def build(request: Request, passed: Any, views: tuple[np.ndarray, list[np.ndarray]],
          builder: Callable[[np.ndarray, str], Request]) -> Lane | None:
    """A lane from the request the queued path built for the first such call (None: this
    signature cannot take one)."""
    desc = request.descriptor
    if request.kind != "allreduce" or request.algorithm != "auto" or request.prescale != 1.0 \
            or request.postscale != 1.0 or request.compression.name != "none" or request.array is None:
        return None
    average = request.op is ReduceOp.AVERAGE
    return Lane(passed=passed, op=request.op, combine=ufunc(request.op), average=average,
                scale=float_division(request.array.dtype, len(views[1])) if average else None,
                inplace=request.inplace, nbytes=request.array.nbytes,
                body=body_digest(desc.kind, desc.fields, desc.algorithm, desc.compression),
                staged=views[0], parts=views[1], request=builder)
