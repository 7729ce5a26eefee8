"""``shm`` across hosts with the in-host phases beside the link instead of before and after it.

``shm``'s schedule on several hosts is a shared-memory reduce-scatter inside each host, a
ring between the hosts on the chunk each rank owns, then a shared-memory allgather. Run
step after step, the link idles during both in-host phases (10-14 % of a 16-64 MiB
allreduce on 2 emulated hosts at 1 Gbit/s, measured by ``emulation.link_account``).

Here the ring runs in ``K`` fractions: fraction ``f`` is the ``f``-th ``1/K`` of every range
the ring moves, so each element meets the same partners in the same order as in the
schedule run step after step (the same bits). While fraction ``f``'s messages are on the
wire (nonblocking), the host reduces what fraction ``f + 1`` needs and copies out what
fraction ``f - 1`` finished. The in-host work still runs in the group's pieces, in the
same order on every member: which offsets a stage covers is computed from every
member's chunk, so the members agree without talking.

Only the two-level shape (hosts x ranks per host: one outer dim) is pipelined; deeper
topologies, and chunks too small to cut, run the schedule as it is.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable

import numpy as np

from ddl.reduction.schedule import GroupStep, Schedule, Step, chunks_of, partition
from ddl.wire.comm import Comm

#: Bytes of a rank's chunk per fraction: big enough that a fraction's messages keep the
#: link busy past their set-up, small enough that the first and last in-host stages
#: (the parts not beside the link) stay short.
FRACTION_BYTES = 256 << 10
#: At most this many fractions (each costs a few barriers and message set-ups).
MAX_FRACTIONS = 16
#: The least bytes of one message between hosts: with many hosts a fraction's messages are
#: small, and their set-up (each ring step's) grows with the fractions (8 hosts x 2 at
#: 200 Mbit/s, 1 MiB: 98.5 ms in 2 fractions of 32 KiB messages, 87-88 ms step after step).
MIN_MESSAGE_BYTES = 128 << 10

Ranges = list[tuple[int, int]]


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """How a schedule runs pipelined (see the module docstring)."""

    scatter: GroupStep
    gather: GroupStep
    ring: tuple[Step, ...]
    fractions: int
    #: Per member: the ring's sub-chunks of its chunk, as offsets into that chunk.
    sub_chunks: tuple[Ranges, ...]


#: Plans of the schedules run lately, by (id, itemsize); the entry keeps its schedule, so
#: an id reused by another object cannot match (the executor asks at every call).
_planned: dict[tuple[int, int], tuple[Schedule, Pipeline | None]] = {}


def plan(schedule: Schedule, itemsize: int) -> Pipeline | None:
    """The pipeline for ``schedule``, or None where it runs step after step: not ``shm``'s
    two-level shape, or a chunk too small for two fractions (of ``FRACTION_BYTES`` each,
    and ``MIN_MESSAGE_BYTES`` in each message between hosts)."""
    seen = _planned.get((id(schedule), itemsize))
    if seen is not None and seen[0] is schedule:
        return seen[1]
    if len(_planned) >= 64:
        _planned.clear()
    got = _planned[(id(schedule), itemsize)] = (schedule, _plan(schedule, itemsize))
    return got[1]


def _plan(schedule: Schedule, itemsize: int) -> Pipeline | None:
    steps = schedule.steps
    if len(steps) < 3:
        return None
    scatter, gather, ring = steps[0], steps[-1], steps[1:-1]
    if not (isinstance(scatter, GroupStep) and scatter.reduce and isinstance(gather, GroupStep)
            and not gather.reduce and gather.members == scatter.members and gather.chunks == scatter.chunks
            and schedule.rank in scatter.members):
        return None
    if not all(isinstance(s, Step) for s in ring) or len({s.dim for s in ring}) != 1 or len(ring) % 2:
        return None
    outer = len(ring) // 2 + 1  # a ring of d members: d-1 reduce-scatter steps, d-1 allgather steps
    lo, hi = scatter.chunks[scatter.members.index(schedule.rank)]
    mine = chunks_of(partition(lo, hi, outer))
    if any(r not in mine for s in ring for r in (s.send, s.recv) if r[1] > r[0]):  # type: ignore[union-attr]
        return None  # not multiring's ring on this rank's chunk: leave it as compiled
    # From the longest chunk, the same on every member of every host: all cut alike.
    chunk = scatter.longest * itemsize
    fractions = min(MAX_FRACTIONS, chunk // FRACTION_BYTES, chunk // (outer * MIN_MESSAGE_BYTES))
    if fractions < 2:
        return None
    subs = tuple(chunks_of(partition(0, b - a, outer)) for a, b in scatter.chunks)
    return Pipeline(scatter, gather, tuple(ring), fractions, subs)  # type: ignore[arg-type]


def fraction(r: tuple[int, int], f: int, k: int) -> tuple[int, int]:
    """The ``f``-th of ``k`` near-equal parts of range ``r``."""
    n = r[1] - r[0]
    return r[0] + n * f // k, r[0] + n * (f + 1) // k


def run(comm: Comm, pipe: Pipeline, buf: np.ndarray, combine: Callable[..., np.ndarray],
        group_pieces: Callable[[GroupStep, Ranges], None],
        on_phase: Callable[[tuple[str, float, float]], None] | None = None) -> None:
    """Run ``pipe`` on ``buf``. ``group_pieces(step, ranges)`` runs a group step on those
    offsets of every member's chunk (the executor's pieces and barriers)."""
    k, subs = pipe.fractions, pipe.sub_chunks
    every = [(0, pipe.scatter.longest)]
    scattered: Ranges = []
    gathered: Ranges = []

    def upto(member: int, f: int) -> Ranges:  # member's offsets the ring has moved in fractions 0..f
        return merge([(r[0], fraction(r, f, k)[1]) for r in subs[member]])

    def scatter(f: int) -> None:  # reduce what fraction f needs on any member, once
        nonlocal scattered
        need = every if f == k - 1 else merge([r for m in range(len(subs)) for r in upto(m, f)])
        todo = subtract(need, scattered)
        group_pieces(pipe.scatter, todo)
        scattered = merge(scattered + todo)

    def gather(f: int) -> None:  # copy out what fraction f finished on every member
        nonlocal gathered
        done = every if f == k - 1 else common([upto(m, f) for m in range(len(subs))])
        todo = subtract(done, gathered)
        group_pieces(pipe.gather, todo)
        gathered = merge(gathered + todo)

    longest = max(fraction(s.recv, 0, k)[1] - fraction(s.recv, 0, k)[0] + 1 for s in pipe.ring)
    scratch = np.empty(longest, dtype=buf.dtype)
    t0 = time.perf_counter()
    scatter(0)
    t1 = time.perf_counter()
    for f in range(k):
        beside: list[Callable[[], None]] = [functools.partial(scatter, f + 1)] if f + 1 < k else []
        if f > 0:
            beside.append(functools.partial(gather, f - 1))
        for step in pipe.ring:
            s0, s1 = fraction(step.send, f, k)
            r0, r1 = fraction(step.recv, f, k)
            send = buf[s0:s1] if step.send_peer is not None else None
            target = buf[r0:r1]
            into = scratch[: r1 - r0] if step.reduce else target
            wait = comm.isendrecv(send, step.send_peer, into if step.recv_peer is not None else None,
                                  step.recv_peer)
            if beside:
                beside.pop(0)()
            wait()
            if step.reduce and step.recv_peer is not None:
                combine(target, into, out=target)
        for work in beside:
            work()
    t2 = time.perf_counter()
    gather(k - 1)
    if on_phase is not None:
        on_phase(("shm reduce-scatter", t0, t1))
        on_phase(("pipelined ring, shm beside it", t1, t2))
        on_phase(("shm allgather", t2, time.perf_counter()))


def merge(ranges: Ranges) -> Ranges:
    """Sorted, disjoint, non-empty ranges covering the same offsets."""
    out: Ranges = []
    for a, b in sorted(r for r in ranges if r[1] > r[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def subtract(ranges: Ranges, minus: Ranges) -> Ranges:
    """The offsets of ``ranges`` not in ``minus`` (both merged)."""
    out: Ranges = []
    for a, b in ranges:
        for c, d in minus:
            if d <= a or c >= b:
                continue
            if c > a:
                out.append((a, c))
            a = max(a, d)
        if b > a:
            out.append((a, b))
    return out


def common(sets: list[Ranges]) -> Ranges:
    """The offsets in every one of ``sets`` (each merged)."""
    out = sets[0]
    for other in sets[1:]:
        out = merge([(max(a, c), min(b, d)) for a, b in out for c, d in other])
    return out
