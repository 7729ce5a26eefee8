"""Symbolic checker: runs every rank's schedule in one process on sets of contributions.

Each buffer element holds a bitmask of the ranks whose contribution it contains. A
reduce must join disjoint masks (a contribution counted twice is an error), a copy
replaces, and at the end every element of every rank must hold every rank exactly
once. Steps advance under rendezvous semantics (a send completes only when the peer
has posted the matching receive), so a schedule that passes cannot deadlock in MPI.
A group step completes only when every member stands at the same group step (same
members, chunks and kind): its reduce joins chunk i over every member's copy (masks
must be disjoint) into member i, its allgather copies member i's chunk i to all.
"""

from __future__ import annotations

from collections.abc import Callable

from ddl.base.topology import Topology
from ddl.reduction.schedule import GroupStep, Schedule, Step


class ScheduleError(AssertionError):
    """A schedule double-counts, misses a contribution, mismatches, or deadlocks."""


def check_schedules(schedules: list[Schedule]) -> None:
    """Verify ``schedules`` (one per world rank, by rank) form a correct allreduce.

    Raises:
        ScheduleError: naming the rank, step and elements that went wrong.
    """
    size = len(schedules)
    count = schedules[0].count if schedules else 0
    full = (1 << size) - 1
    bufs = [[1 << r] * count for r in range(size)]
    pos = [0] * size
    sent = [False] * size  # current step's send half done
    got: list[list[int] | None] = [None] * size  # current step's received data
    for r, sch in enumerate(schedules):
        if sch.rank != r or sch.count != count:
            raise ScheduleError(f"schedule {r} is for rank {sch.rank} / count {sch.count}")
        for k, st in enumerate(sch.steps):
            if isinstance(st, GroupStep):
                _check_group_step(st, r, k, count, size)
                continue
            if st.send_peer is None and st.recv_peer is None:
                raise ScheduleError(f"rank {r} step {k} neither sends nor receives")
            if st.send_peer is not None and st.recv_peer is not None:
                (a, b), (c, d) = st.send, st.recv
                if a < d and c < b and a < b and c < d:
                    raise ScheduleError(f"rank {r} step {k}: send {st.send} overlaps receive {st.recv}")

    def current(r: int):  # type: ignore[no-untyped-def]
        steps = schedules[r].steps
        return steps[pos[r]] if pos[r] < len(steps) else None

    active = [r for r in range(size) if schedules[r].steps]
    while active:
        progressed = False
        for r in active:
            st = current(r)
            if isinstance(st, GroupStep) and st.members[0] == r and _run_group(st, [current(m) for m in st.members],
                                                                              bufs, pos):
                for m in st.members:
                    pos[m] += 1
                progressed = True
        for r in active:
            st = current(r)
            if isinstance(st, Step) and st.send_peer is not None and not sent[r]:
                d = st.send_peer
                dst = current(d)
                if isinstance(dst, Step) and dst.recv_peer == r and got[d] is None:
                    a, b = st.send
                    if dst.recv[1] - dst.recv[0] != b - a:
                        raise ScheduleError(
                            f"rank {r} step {pos[r]} sends {b - a} elements to rank {d}, "
                            f"whose step {pos[d]} expects {dst.recv[1] - dst.recv[0]}"
                        )
                    got[d] = bufs[r][a:b]
                    sent[r] = True
                    progressed = True
        still = []
        for r in active:
            st = current(r)
            if not isinstance(st, Step):
                if st is not None:
                    still.append(r)
                continue
            send_done = st.send_peer is None or sent[r]
            recv_done = st.recv_peer is None or got[r] is not None
            if send_done and recv_done:
                if st.recv_peer is not None:
                    _apply(bufs[r], st.recv, got[r], st.reduce, r, pos[r])  # type: ignore[arg-type]
                pos[r] += 1
                sent[r], got[r] = False, None
                progressed = True
            if current(r) is not None:
                still.append(r)
        active = still
        if not progressed:
            stuck = ", ".join(f"rank {r} at step {pos[r]} ({current(r)})" for r in active[:4])
            raise ScheduleError(f"deadlock: {stuck}")

    for r in range(size):
        for i, mask in enumerate(bufs[r]):
            if mask != full:
                missing = [q for q in range(size) if not mask >> q & 1]
                raise ScheduleError(f"rank {r} element {i} misses contributions of ranks {missing[:8]}")


def _check_group_step(st: GroupStep, rank: int, k: int, count: int, size: int) -> None:
    where = f"rank {rank} step {k} (group {st.members[:8]})"
    if rank not in st.members:
        raise ScheduleError(f"{where}: the rank is not a member of its own group step")
    if len(set(st.members)) != len(st.members) or not all(0 <= m < size for m in st.members):
        raise ScheduleError(f"{where}: members must be distinct ranks below {size}")
    if len(st.chunks) != len(st.members):
        raise ScheduleError(f"{where}: {len(st.chunks)} chunks for {len(st.members)} members")
    if any(not 0 <= lo <= hi <= count for lo, hi in st.chunks):
        raise ScheduleError(f"{where}: chunks {st.chunks[:8]} fall outside [0, {count})")


def _run_group(st: GroupStep, at: list[object], bufs: list[list[int]], pos: list[int]) -> bool:
    """Apply ``st`` for all its members if they all stand at it; False while some are elsewhere."""
    if any(not isinstance(other, GroupStep) for other in at):
        return False  # some member is still at a point-to-point step, or done (then: deadlock)
    for m, other in zip(st.members, at, strict=True):
        if other != st:
            raise ScheduleError(
                f"group step mismatch: rank {st.members[0]} step {pos[st.members[0]]} is {st}, "
                f"but member rank {m} step {pos[m]} is {other}"
            )
    before = {m: list(bufs[m]) for m in st.members}
    for i, (lo, hi) in enumerate(st.chunks):
        owner = st.members[i]
        if st.reduce:
            for e in range(lo, hi):
                acc = 0
                for m in st.members:
                    if acc & before[m][e]:
                        raise ScheduleError(
                            f"rank {owner} step {pos[owner]}: element {e} would count ranks twice "
                            f"in the group reduce of {st.members[:8]}"
                        )
                    acc |= before[m][e]
                bufs[owner][e] = acc
        else:
            for m in st.members:
                if m != owner:
                    bufs[m][lo:hi] = before[owner][lo:hi]
    return True


def _apply(buf: list[int], rng: tuple[int, int], data: list[int], reduce: bool, rank: int, step: int) -> None:
    lo, hi = rng
    if not reduce:
        buf[lo:hi] = data
        return
    for i, m in enumerate(data):
        if buf[lo + i] & m:
            raise ScheduleError(f"rank {rank} step {step}: element {lo + i} would count ranks twice")
        buf[lo + i] |= m


def check_algorithm(
    compile_fn: Callable[[Topology, int, int], Schedule], topology: Topology, count: int
) -> None:
    """Compile for every rank of ``topology`` and :func:`check_schedules` the result."""
    import dataclasses

    schedules = [compile_fn(dataclasses.replace(topology, rank=r), r, count) for r in range(topology.size)]
    check_schedules(schedules)
