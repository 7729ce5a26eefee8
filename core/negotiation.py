"""Agreement check before every collective: all ranks must call the same thing.

Each rank hashes a small descriptor of its call (kind, name, shape, dtype, op, ...),
and one 2-element MIN allreduce tells whether all hashes are equal. Only on a
disagreement are the full descriptors gathered, to raise a :class:`MismatchError` on
every rank that names the ranks and both values, instead of hanging or corrupting.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from ddl.comm import Comm
from ddl.errors import MismatchError
from ddl.ops import ReduceOp

_MASK = (1 << 62) - 1


def digest(descriptor: tuple[Any, ...]) -> int:
    """A stable 62-bit hash of ``descriptor``'s repr."""
    raw = hashlib.blake2b(repr(descriptor).encode(), digest_size=8).digest()
    return int.from_bytes(raw, "little") & _MASK


def agree(comm: Comm, descriptor: tuple[Any, ...]) -> None:
    """Return when every rank passed an equal ``descriptor``; else raise on every rank.

    Raises:
        MismatchError: ranks disagree; the message groups the ranks by what they called.
    """
    if comm.size == 1:
        return
    h = digest(descriptor)
    buf = np.array([h, -h], dtype=np.int64)
    comm.allreduce_native(buf, ReduceOp.MIN)
    if int(buf[0]) == -int(buf[1]):
        return
    everyone = comm.allgather_object(descriptor)
    raise MismatchError(describe_mismatch(everyone))


def describe_mismatch(descriptors: list[tuple[Any, ...]]) -> str:
    """'ranks 0,2: allreduce(...) | ranks 1: allreduce(...)' for the differing calls."""
    groups: dict[str, list[int]] = {}
    for rank, d in enumerate(descriptors):
        groups.setdefault(format_call(d), []).append(rank)
    parts = [f"rank{'s' if len(r) > 1 else ''} {_ranks(r)}: {call}" for call, r in groups.items()]
    return (
        "ranks called collectives that do not match — " + "; ".join(parts)
        + ". Every rank must make the same collective calls in the same order "
        "with the same name, shape, dtype and op."
    )


def format_call(d: tuple[Any, ...]) -> str:
    kind, *fields = d
    return f"{kind}(" + ", ".join(str(f) for f in fields) + ")"


def _ranks(ranks: list[int]) -> str:
    return ",".join(str(r) for r in ranks) if len(ranks) <= 8 else f"{ranks[0]}..{ranks[-1]} ({len(ranks)} ranks)"
