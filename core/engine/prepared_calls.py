"""A synchronous allreduce, prepared once per call signature.

A training loop calls ``allreduce`` on the same few shapes again and again (SyncBatchNorm's
statistics, a metric, a loss, a bucket). Everything such a call needs besides its data and
its name is the same every time: the checks it passed, the hash of its descriptor without
the name, and for a small one the typed views of the cycle record it rides in.

- A :class:`Lane` (small calls) holds all of that, so the engine's lean path
  (:meth:`ddl.engine.lean_path.LeanPath.run_lane`) costs one exchange and one reduction, and
  builds a request only when the other ranks hold something else. A lane is built only
  where the result is bit for bit what the queued path gives: a numpy array of a dtype
  that is its own accumulator, small enough to travel inline, under ``auto``, with no
  compression and no scaling.
- A :class:`Prepared` call (the larger ones) builds its request from the checks it passed
  the first time, and runs as any request does; an in-place one of a contiguous array
  builds none either when every rank holds it: after the exchange it is reduced where it
  lies (:func:`ddl.engine.fusion.reduce_in_place`, the bucket of one such tensor).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from ddl.base.dtypes import accumulator, float_division
from ddl.base.ops import ReduceOp, ufunc
from ddl.engine.compression import Compression
from ddl.engine.fusion import Request
from ddl.engine.handle import Handle
from ddl.engine.negotiation import Descriptor, body_digest, named_digest


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
    #: This rank's outgoing payload and every rank's incoming one, typed and shaped (a list,
    #: or one strided array of them all at many ranks: :func:`ddl.engine.fusion.reduce_with`).
    staged: np.ndarray
    parts: list[np.ndarray] | np.ndarray
    #: Builds the full request (same descriptor, so the same digest) for the queue.
    request: Callable[[np.ndarray, str], Request]


@dataclasses.dataclass(slots=True, eq=False)
class Prepared:
    """A plain allreduce too large for a lane: its checks passed once per call signature,
    so a call builds only its name, descriptor and request (a large call's Python runs
    after its reduction has streamed the buffer through the caches, at several times
    the cost of the same lines warm: 12-15 us of a 1 MiB call was building and checking
    the request)."""

    passed: Any
    op: ReduceOp
    #: The descriptor's fields, algorithm and compression, and their :func:`body_digest`.
    fields: tuple[Any, ...]
    algorithm: str
    compression: str
    body: int
    #: In place, of a dtype that is its own accumulator: a C-contiguous call is reduced
    #: where it lies, with no request built (:meth:`ddl.engine.lean_path.LeanPath.run_in_place`).
    in_place: bool = False

    def request(self, x: np.ndarray, name: str, inplace: bool) -> Request:
        """The request the checked path builds for ``x`` under ``name``, with its digest."""
        desc = Descriptor("allreduce", name, self.fields, self.algorithm, self.compression)
        return Request("allreduce", name, desc, Handle(name), None, x, self.op, self.algorithm, Compression.none,
                       inplace, 0.0, named_digest(self.body, name))


def prepare(request: Request, passed: Any) -> Prepared | None:
    """:class:`Prepared` from the request the checked path built for the first such call
    (None: it asks for more than a plain allreduce)."""
    if not _plain(request):
        return None
    desc = request.descriptor
    arr = request.array
    assert arr is not None
    return Prepared(passed=passed, op=request.op, fields=desc.fields, algorithm=desc.algorithm,
                    compression=desc.compression, body=body_digest(desc.kind, desc.fields, desc.algorithm,
                                                                   desc.compression),
                    in_place=request.inplace and accumulator(arr.dtype) == arr.dtype)


def _plain(request: Request) -> bool:
    """Whether the checked path built a plain allreduce: no compression, no scaling."""
    return (request.kind == "allreduce" and request.prescale == 1.0 and request.postscale == 1.0
            and request.compression.name == "none" and request.array is not None)


def eligible(x: Any, capacity: int, default_algorithm: str) -> bool:
    """Whether ``x`` can take a lane at all (the rest of the checks are the request's):
    ``capacity`` is the bytes the engine's records carry inline (0 in the compact exchange)."""
    return (type(x) is np.ndarray and default_algorithm == "auto"
            and 0 < x.nbytes <= capacity and accumulator(x.dtype) == x.dtype)


def build(request: Request, passed: Any, views: tuple[np.ndarray, list[np.ndarray] | np.ndarray],
          builder: Callable[[np.ndarray, str], Request]) -> Lane | None:
    """A lane from the request the queued path built for the first such call (None: this
    signature cannot take one)."""
    arr = request.array
    if not _plain(request) or request.algorithm != "auto" or arr is None:
        return None
    desc = request.descriptor
    average = request.op is ReduceOp.AVERAGE
    return Lane(passed=passed, op=request.op, combine=ufunc(request.op), average=average,
                scale=float_division(arr.dtype, len(views[1])) if average else None,
                inplace=request.inplace, nbytes=arr.nbytes,
                body=body_digest(desc.kind, desc.fields, desc.algorithm, desc.compression),
                staged=views[0], parts=views[1], request=builder)
