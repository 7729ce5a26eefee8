"""The negotiation protocol: what every rank may run this cycle, as pure functions.

Up to :data:`COMPACT_FROM` - 1 ranks, each cycle every rank contributes one fixed-size
*record* to an Allgather: a header of int64 words (a hash of its pending list, the
list's length, a stop flag, the inline payload size, whether its stall check is due)
and up to :data:`INLINE_BYTES` of payload, so small allreduces ride along. From
:data:`COMPACT_FROM` ranks on, gathering p records would cost every rank O(p) bytes a
cycle, so the cycle is one MIN-Allreduce of :data:`COMPACT_WORDS` words instead (each
value and its negation give the minimum and maximum): O(1) bytes per rank, no inline
payloads. :func:`decide` / :func:`decide_compact` turn what was exchanged into one
verdict that is the same on every rank (they read only exchanged words and this rank's
own hash); :func:`match` pairs the full request lists by name when the hashes differ.
None of them touches MPI, so all are tested at hundreds of ranks without one.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

#: Payload bytes per rank carried by every cycle's record (an Allgather of 4 KiB costs
#: about a 3-int allreduce on shared memory: measured, see README).
INLINE_BYTES = 4096
HEADER_WORDS = 5  # digest, batch length, stop flag, inline payload bytes, stall check due
RECORD_BYTES = HEADER_WORDS * 8 + INLINE_BYTES
STRIDE = RECORD_BYTES // 8
#: From this many ranks on, cycles exchange :data:`COMPACT_WORDS` words (an allreduce),
#: not records (p x 4 KiB gathered by every rank: 64 KiB at 16 ranks, 1 MiB at 256).
COMPACT_FROM = 17
COMPACT_WORDS = 7  # digest, -digest, length, -length, stop, -stop, -(stall check due)
_MASK = (1 << 62) - 1


def digest(descriptor: tuple[Any, ...]) -> int:
    """A stable 62-bit hash of ``descriptor`` (``(kind, name, ...)``).

    The name and the rest are hashed apart and the rest is cached: an unnamed call has
    a new name every time, but its shape, dtype and op repeat.
    """
    name = descriptor[1]
    body = _body_digest(descriptor[:1] + descriptor[2:])
    raw = hashlib.blake2b(name.encode() if isinstance(name, str) else repr(name).encode(), digest_size=8).digest()
    return (body ^ int.from_bytes(raw, "little")) & _MASK


@functools.lru_cache(maxsize=4096)
def _body_digest(rest: tuple[Any, ...]) -> int:
    return int.from_bytes(hashlib.blake2b(repr(rest).encode(), digest_size=8, person=b"ddl-body").digest(), "little")


def combine(digests: Sequence[int]) -> int:
    """One 62-bit hash of an ordered list of request digests (0 for none)."""
    if not digests:
        return 0
    if len(digests) == 1:
        return digests[0]
    raw = hashlib.blake2b(np.array(digests, dtype=np.int64).tobytes(), digest_size=8).digest()
    return int.from_bytes(raw, "little") & _MASK


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """What a cycle does next; equal on every rank for equal gathered words.

    ``action``: ``"run"`` (every rank holds this very list: run it, from the payloads
    when ``inline``), ``"prefix"`` (all hold something: check whether the first
    ``prefix`` requests agree), ``"match"`` (gather the lists and pair them by name) or
    ``"idle"``. ``waiting_to_stop``: the ranks that have not asked to stop while some
    have (``"rank(s) [3, 7]"``, or ``"some ranks"`` where the exchange cannot say which).
    """

    action: str
    all_stop: bool
    inline: bool = False
    prefix: int = 0
    waiting_to_stop: str = ""


def decide(words: Sequence[int], size: int, my_digest: int, my_length: int) -> Verdict:
    """The verdict from the gathered header ``words`` (``size`` records of :data:`STRIDE`)."""
    same, all_stop, everyone_has, check = True, True, True, False
    shortest = my_length
    stopping: list[int] = []
    for q in range(size):
        base = q * STRIDE
        n = words[base + 1]
        same = same and words[base] == my_digest and n == my_length
        if words[base + 2]:
            stopping.append(q)
        else:
            all_stop = False
        everyone_has = everyone_has and n > 0
        check = check or words[base + 4] != 0
        shortest = min(shortest, n)
    waiting = ""
    if stopping and not all_stop:
        running = [q for q in range(size) if q not in stopping]
        waiting = f"rank(s) {running[:16]}" + (f" ({len(running)} ranks)" if len(running) > 16 else "")
    if same:
        return Verdict("run", all_stop, inline=my_length > 0 and words[3] > 0, waiting_to_stop=waiting)
    if everyone_has:
        return Verdict("prefix", all_stop, prefix=shortest, waiting_to_stop=waiting)
    # A rank with nothing pending (often just a cycle early) makes nothing ready: the
    # lists are gathered only now and then, to watch for stalls.
    return Verdict("match" if check else "idle", all_stop, waiting_to_stop=waiting)


def all_hold(words: Sequence[int], size: int, my_digest: int, my_length: int) -> bool:
    """Whether every gathered record holds this rank's very list (:func:`decide`'s ``"run"``),
    checked without building a verdict: the lean path's common case."""
    for base in range(0, size * STRIDE, STRIDE):
        if words[base] != my_digest or words[base + 1] != my_length:
            return False
    return True


def compact(size: int) -> bool:
    """Whether a job of ``size`` ranks negotiates with the compact exchange."""
    return size >= COMPACT_FROM


def compact_vector(digest: int, length: int, stop: bool, due: bool) -> list[int]:
    """This rank's words for the compact exchange (reduced with MIN)."""
    return [digest, -digest, length, -length, int(stop), -int(stop), -int(due)]


def decide_compact(v: Sequence[int], my_digest: int, my_length: int) -> Verdict:
    """The verdict from the MIN-reduced :func:`compact_vector` of every rank."""
    all_stop, any_stop, due = v[4] == 1, -v[5] == 1, -v[6] == 1
    waiting = "some ranks" if any_stop and not all_stop else ""
    if v[0] == -v[1] == my_digest and v[2] == -v[3] == my_length:
        return Verdict("run", all_stop, waiting_to_stop=waiting)
    if v[2] > 0:
        return Verdict("prefix", all_stop, prefix=int(v[2]), waiting_to_stop=waiting)
    return Verdict("match" if due else "idle", all_stop, waiting_to_stop=waiting)


def compact_prefix_agreed(v: Sequence[int], my_digest: int, length: int) -> bool:
    """After a compact ``"prefix"`` round (:func:`compact_vector` of the prefix)."""
    return v[0] == -v[1] == my_digest and v[2] == -v[3] == length


def prefix_agreed(words: Sequence[int], size: int, my_digest: int, length: int) -> bool:
    """After a ``"prefix"`` round: every rank's first ``length`` requests hash alike."""
    return all(words[q * STRIDE] == my_digest and words[q * STRIDE + 1] == length for q in range(size))


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


def match(everyone: Sequence[Sequence[tuple[Any, ...]]]) -> Matched:
    """Pair the gathered descriptor lists (one per rank, ``(kind, name, ...)``) by name."""
    tables = [{d[1]: d for d in lst} for lst in everyone]
    out = Matched()
    seen: set[str] = set()
    for lst in everyone:
        for d in lst:
            name = d[1]
            if name in seen:
                continue
            seen.add(name)
            have = [r for r, t in enumerate(tables) if name in t]
            if len(have) < len(tables):
                out.missing[name] = have
                continue
            descs = [t[name] for t in tables]
            errors = tuple(r for r, x in enumerate(descs) if x[0] == "error")
            if errors:
                out.failed[name] = (errors, describe_failure(name, descs, errors))
            elif any(x != descs[0] for x in descs):
                out.failed[name] = ((), describe_mismatch(descs))
            else:
                out.ready.append(name)
    return out


def error_descriptor(name: str, kind: str, exc: BaseException) -> tuple[Any, ...]:
    """The descriptor a rank submits in place of a call whose arguments it refused."""
    return ("error", name, kind, f"{type(exc).__name__}: {exc}")


def describe_failure(name: str, descs: Sequence[tuple[Any, ...]], errors: Sequence[int]) -> str:
    """'rank 1 could not start allreduce '#3': TypeError: ...' for the failing ranks."""
    parts = [f"rank {r} could not start {descs[r][2]} {name!r}: {descs[r][3]}" for r in errors[:4]]
    more = f" (and {len(errors) - 4} more ranks)" if len(errors) > 4 else ""
    return "; ".join(parts) + more + " — so this collective was cancelled on every rank"


def describe_mismatch(descriptors: Sequence[tuple[Any, ...]]) -> str:
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


def format_call(d: tuple[Any, ...]) -> str:
    kind, *fields = d
    return f"{kind}(" + ", ".join(str(f) for f in fields) + ")"


def _ranks(ranks: list[int]) -> str:
    return ",".join(str(r) for r in ranks) if len(ranks) <= 8 else f"{ranks[0]}..{ranks[-1]} ({len(ranks)} ranks)"
