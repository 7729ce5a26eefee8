"""Which requests ranks agree on: descriptors, their digests, and pairing lists by name.

A request is described by a :class:`Descriptor` (kind, name, and what ranks must agree
on); ranks compare the :func:`digest` of their whole pending lists every cycle
(:mod:`ddl.engine.codec`), and when those differ, :func:`match` pairs the gathered
descriptor lists by name. All pure functions, tested at hundreds of ranks without MPI.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

#: Digests are 62-bit (they travel as int64 words, and a digest's negation must fit too).
MASK = (1 << 62) - 1


class Descriptor(NamedTuple):
    """What every rank must agree on for one request.

    ``fields``: the kind's own (an allreduce's shape, dtype and op; a broadcast's shape,
    dtype and root; a refusal's kind and message). ``algorithm`` and ``compression``:
    an allreduce's (empty for other kinds).
    """

    kind: str
    name: str
    fields: tuple[Any, ...] = ()
    algorithm: str = ""
    compression: str = ""


def digest(descriptor: Descriptor) -> int:
    """A stable 62-bit hash of ``descriptor``.

    The name and the rest are hashed apart and the rest is cached: an unnamed call has
    a new name every time, but its shape, dtype and op repeat.
    """
    kind, name, fields, algorithm, compression = descriptor
    return named_digest(body_digest(kind, fields, algorithm, compression), name)


def named_digest(body: int, name: str) -> int:
    """:func:`digest` of a descriptor whose :func:`body_digest` is ``body``, named ``name``
    (a call signature prepared once hashes only its name per call)."""
    return (body ^ name_digest(name)) & MASK


def body_digest(kind: str, fields: tuple[Any, ...], algorithm: str, compression: str) -> int:
    """The hash of everything in a descriptor but its name (cached: training repeats them)."""
    return _body_digest((kind, fields, algorithm, compression))


@functools.lru_cache(maxsize=4096)
def _body_digest(rest: tuple[Any, ...]) -> int:
    return int.from_bytes(hashlib.blake2b(repr(rest).encode(), digest_size=8, person=b"ddl-body").digest(), "little")


def name_digest(name: str) -> int:
    """The hash of a request's name. A name that ends in a count (``#12``, ``#loader.3``:
    every unnamed call's) hashes its stem once and mixes the count in arithmetically, so
    the lean path, which knows the count, never formats or hashes a string per call
    (:func:`counted_digest` gives the same value)."""
    stem = name.rstrip("0123456789")
    if stem and stem != name and (len(name) - len(stem) == 1 or name[len(stem)] != "0"):
        return counted_digest(stem, int(name[len(stem):]))
    return _string_digest(name)


def counted_digest(stem: str, count: int) -> int:
    """:func:`name_digest` of ``f"{stem}{count}"``, from its parts."""
    return stem_digest(stem) ^ count_word(count)


def count_word(count: int) -> int:
    """The count's part of :func:`counted_digest`."""
    # An odd multiplier is a bijection on 64-bit counts: distinct counts, distinct words.
    return (count * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF


@functools.lru_cache(maxsize=1024)
def stem_digest(stem: str) -> int:
    """The stem's part of :func:`counted_digest`."""
    return int.from_bytes(hashlib.blake2b(stem.encode(), digest_size=8, person=b"ddl-stem").digest(), "little")


def _string_digest(name: str) -> int:
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")


def combine(digests: Sequence[int]) -> int:
    """One 62-bit hash of an ordered list of request digests (0 for none)."""
    if not digests:
        return 0
    if len(digests) == 1:
        return digests[0]
    raw = hashlib.blake2b(np.array(digests, dtype=np.int64).tobytes(), digest_size=8).digest()
    return int.from_bytes(raw, "little") & MASK


@dataclasses.dataclass
class Matched:
    """The outcome of pairing every rank's request list by name.

    ``ready``: names every rank holds with equal descriptors, in one order shared by all
    ranks. ``failed``: name -> (ranks whose argument check failed, message); those ranks
    raise their own error, the others a RemoteError with the message (or a MismatchError
    when nothing failed but the descriptors differ). ``missing``: name -> ranks that
    hold it, for names some ranks have not submitted yet.
    """

    ready: list[str] = dataclasses.field(default_factory=list)
    failed: dict[str, tuple[tuple[int, ...], str]] = dataclasses.field(default_factory=dict)
    missing: dict[str, list[int]] = dataclasses.field(default_factory=dict)


def match(everyone: Sequence[Sequence[Descriptor]]) -> Matched:
    """Pair the gathered descriptor lists (one per rank) by name."""
    tables = [{d.name: d for d in lst} for lst in everyone]
    out = Matched()
    seen: set[str] = set()
    for lst in everyone:
        for d in lst:
            name = d.name
            if name in seen:
                continue
            seen.add(name)
            have = [r for r, t in enumerate(tables) if name in t]
            if len(have) < len(tables):
                out.missing[name] = have
                continue
            descs = [t[name] for t in tables]
            errors = tuple(r for r, x in enumerate(descs) if x.kind == "error")
            if errors:
                out.failed[name] = (errors, describe_failure(name, descs, errors))
            elif any(x != descs[0] for x in descs):
                out.failed[name] = ((), describe_mismatch(descs))
            else:
                out.ready.append(name)
    return out


def error_descriptor(name: str, kind: str, exc: BaseException) -> Descriptor:
    """The descriptor a rank submits in place of a call whose arguments it refused."""
    return Descriptor("error", name, (kind, f"{type(exc).__name__}: {exc}"))


def describe_failure(name: str, descs: Sequence[Descriptor], errors: Sequence[int]) -> str:
    """'rank 1 could not start allreduce '#3': TypeError: ...' for the failing ranks."""
    parts = [f"rank {r} could not start {descs[r].fields[0]} {name!r}: {descs[r].fields[1]}" for r in errors[:4]]
    more = f" (and {len(errors) - 4} more ranks)" if len(errors) > 4 else ""
    return "; ".join(parts) + more + " — so this collective was cancelled on every rank"


def describe_mismatch(descriptors: Sequence[Descriptor]) -> str:
    """'ranks 0,2: allreduce(...); rank 1: allreduce(...)' for the differing calls."""
    groups: dict[str, list[int]] = {}
    for rank, d in enumerate(descriptors):
        groups.setdefault(format_call(d), []).append(rank)
    parts = [f"rank{'s' if len(r) > 1 else ''} {_ranks(r)}: {call}" for call, r in groups.items()]
    return (
        "ranks called collectives that do not match — " + "; ".join(parts)
        + ". Every rank must make the same collective calls in the same order "
        "with the same name, shape, dtype and op."
    )


def format_call(d: Descriptor) -> str:
    """``allreduce(name, (3,), float32, SUM, auto, none)``: the call as ranks compare it."""
    parts = [d.name, *d.fields, *(x for x in (d.algorithm, d.compression) if x)]
    return f"{d.kind}(" + ", ".join(str(f) for f in parts) + ")"


def _ranks(ranks: list[int]) -> str:
    return ",".join(str(r) for r in ranks) if len(ranks) <= 8 else f"{ranks[0]}..{ranks[-1]} ({len(ranks)} ranks)"
