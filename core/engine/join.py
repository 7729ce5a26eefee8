"""``join()`` for uneven inputs: ranks that ran out of data stand in with zeros.

A rank that calls ``join`` submits one request of kind ``"join"`` (every rank's has the
same name) and keeps cycling. While some ranks have joined, the gathered request lists
are paired with :func:`resolve`: an allreduce held by every rank that has not joined is
ready, and each joined rank runs it on zeros of the agreed shape and dtype
(:func:`stand_in`), so the others' allreduces go on. ``Average`` divides by every rank,
as Horovod does (its joined ranks' zeros count), or with ``DDL_JOIN_AVERAGE=contributors``
by the ranks that contributed, so that N ranks with uneven batches equal one process
over the same batches. Other collectives cannot
go on without the joined ranks' data: they end with an error on the ranks that called
them. The join itself completes once every rank has joined; it returns the last rank
to join (the highest of the last to arrive). Pure functions, tested without MPI.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ddl.base import dtypes
from ddl.base.ops import ReduceOp
from ddl.engine.negotiation import Descriptor, Matched, describe_mismatch

JOIN_KIND = "join"
JOIN_NAME = "ddl.join"
#: Descriptor kinds a joined rank can stand in for with zeros.
STANDS_IN = ("allreduce", "grouped_allreduce")


def join_descriptor() -> Descriptor:
    """The descriptor every rank's ``join`` request carries."""
    return Descriptor(JOIN_KIND, JOIN_NAME)


def joined_ranks(everyone: Sequence[Sequence[Descriptor]]) -> tuple[int, ...]:
    """The ranks whose gathered list holds a join request."""
    return tuple(r for r, lst in enumerate(everyone) if any(d.kind == JOIN_KIND for d in lst))


def resolve(everyone: Sequence[Sequence[Descriptor]], matched: Matched,
            joined: tuple[int, ...]) -> dict[str, Descriptor]:
    """Move the names that only joined ranks lack from ``matched.missing`` to ``ready``
    (or ``failed``); return the descriptors the joined ranks stand in for.

    The join itself, missing on ranks still working, is dropped from ``missing``: a rank
    may wait in ``join`` as long as the others train, which is no stall.
    """
    substitutes: dict[str, Descriptor] = {}
    if not joined:
        return substitutes
    joined_set = set(joined)
    for name, have in list(matched.missing.items()):
        if name == JOIN_NAME:
            del matched.missing[name]
            continue
        lacking = [r for r in range(len(everyone)) if r not in have]
        if not set(lacking) <= joined_set:
            continue  # some working rank has not submitted it yet: a plain wait
        del matched.missing[name]
        descs = [next(d for d in everyone[r] if d.name == name) for r in have]
        if any(d.kind == "error" for d in descs):
            matched.failed[name] = (tuple(r for r, d in zip(have, descs, strict=True) if d.kind == "error"),
                                    f"a rank refused {name!r}")
        elif any(d != descs[0] for d in descs):
            matched.failed[name] = ((), describe_mismatch(descs))
        elif descs[0].kind not in STANDS_IN:
            matched.failed[name] = ((), (
                f"{descs[0].kind} {name!r} cannot run while rank(s) {list(lacking)} have joined: only allreduces go "
                "on after join() (the joined ranks contribute zeros); call join() on every rank before it, "
                "or make the call before any rank joins"))
        else:
            matched.ready.append(name)
            substitutes[name] = descs[0]
    return substitutes


def stand_in(desc: Descriptor) -> np.ndarray:
    """The zeros a joined rank contributes for an agreed allreduce (flat for a group)."""
    shape, dtype_name = desc.fields[0], desc.fields[1]
    dtype = dtypes.bfloat16() if dtype_name == "bfloat16" else np.dtype(dtype_name)
    assert dtype is not None
    if desc.kind == "grouped_allreduce":
        count = sum(int(np.prod(s, dtype=np.int64)) for s in shape)
        return np.zeros(count, dtype)
    return np.zeros(shape, dtype)


def op_of(desc: Descriptor) -> ReduceOp:
    """The agreed op of an allreduce descriptor (its fields end with the op's name)."""
    return ReduceOp[desc.fields[2]]


def scales_of(desc: Descriptor) -> tuple[float, float]:
    """The agreed (prescale, postscale) of an allreduce descriptor (1.0, 1.0 unless given)."""
    return (float(desc.fields[3]), float(desc.fields[4])) if len(desc.fields) > 3 else (1.0, 1.0)


def last_to_join(size: int, joined_before: set[int]) -> int:
    """The rank that joined last: the highest of those not seen joined before the final cycle."""
    late = [r for r in range(size) if r not in joined_before]
    return max(late) if late else size - 1
