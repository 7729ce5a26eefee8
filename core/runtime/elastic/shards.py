"""Sharded state across elastic worlds: each host's commit holds one whole copy, each rank keeps its part.

A sharded optimizer (ZeRO-1) gives every rank the state of its own parameters only. A
commit must still survive the loss of any host, so each host's store (one writer per
host) receives every rank's part: one whole copy per host, never one per rank. The next
world's sync sends each rank exactly the entries it owns there, by the partition of that
world (:func:`ddl.reduction.partition.partition_by_bytes`, derived again for its size),
from the rank whose host holds the newest commit.

Entries travel as opaque bytes under string keys (``"optimizer/17"``); the adapters
decide what is in them and who owns each one.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable

import numpy as np

from ddl.runtime.api import alltoall

#: Marks a store payload that carries sharded entries beside the replicated state.
MAGIC = b"DDLSHARDED1\n"


def pack(replicated: bytes, entries: dict[str, bytes]) -> bytes:
    """One store payload: the replicated state's bytes and every rank's sharded entries.

    Example:
        >>> unpack(pack(b"weights", {"optimizer/0": b"m"}))
        (b'weights', {'optimizer/0': b'm'})
    """
    return MAGIC + pickle.dumps((replicated, entries), protocol=pickle.HIGHEST_PROTOCOL)


def unpack(payload: bytes) -> tuple[bytes, dict[str, bytes] | None]:
    """The replicated bytes and the entries of a payload (None: a payload without any).

    Example:
        >>> unpack(b"plain")
        (b'plain', None)
    """
    if not payload.startswith(MAGIC):
        return payload, None
    replicated, entries = pickle.loads(payload[len(MAGIC):])
    return replicated, entries


def route(entries: dict[str, bytes], owner: Callable[[str], int], size: int) -> list[dict[str, bytes]]:
    """``entries`` split by the rank of ``size`` that keeps each one.

    Raises:
        ValueError: an owner outside the world.

    Example:
        >>> route({"a": b"1", "b": b"2", "c": b"3"}, lambda k: {"a": 1, "b": 0, "c": 1}[k], 2)
        [{'b': b'2'}, {'a': b'1', 'c': b'3'}]
    """
    parts: list[dict[str, bytes]] = [{} for _ in range(size)]
    for key, blob in entries.items():
        rank = owner(key)
        if not 0 <= rank < size:
            raise ValueError(f"sharded entry {key!r} belongs to rank {rank}, outside this world of {size}")
        parts[rank][key] = blob
    return parts


def _exchange(parts: list[dict[str, bytes]] | None, size: int, name: str) -> list[dict[str, bytes]]:
    """Send ``parts[r]`` to rank r (None: send nothing); return what each rank sent here."""
    blobs = [pickle.dumps(p, protocol=pickle.HIGHEST_PROTOCOL) if p else b"" for p in (parts or [{}] * size)]
    data = np.frombuffer(b"".join(blobs), np.uint8) if any(blobs) else np.zeros(0, np.uint8)
    got, counts = alltoall(data, [len(b) for b in blobs], name=name)
    out, at = [], 0
    for n in counts:
        out.append(pickle.loads(got[at : at + n].tobytes()) if n else {})
        at += n
    return out


def gather_to_writers(entries: dict[str, bytes], writers: list[int], size: int) -> dict[str, bytes]:
    """Every rank's ``entries`` on each of ``writers`` (one whole copy each); ``{}`` elsewhere
    (a collective call)."""
    received = _exchange([entries if r in writers else {} for r in range(size)], size, "ddl.elastic.shards.gather")
    merged: dict[str, bytes] = {}
    for part in received:
        merged.update(part)
    return merged


def scatter_from(root: int, rank: int, entries: dict[str, bytes] | None, owner: Callable[[str], int],
                 size: int) -> dict[str, bytes]:
    """The entries this rank owns, sent by ``root`` from the whole set it holds (a collective
    call; ``entries`` matters on the root alone)."""
    parts = route(entries or {}, owner, size) if rank == root else None
    return _exchange(parts, size, "ddl.elastic.shards.scatter")[root]
