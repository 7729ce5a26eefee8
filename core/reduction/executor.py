"""Runs a :class:`~ddl.reduction.schedule.Schedule` over a :class:`~ddl.wire.comm.Comm` on a flat buffer.

Each step is one ``Sendrecv``, cut into segments of at most ``segment_elems`` so the
scratch buffer stays small; a reducing step receives into scratch and combines with a
numpy ufunc (which releases the GIL), a copying step receives straight into place.
Both ends derive the number of segments from the same range, so messages always pair.
A group step goes through the group's shared slots (:func:`run_group_step`); a group
reduce-scatter directly followed by the allgather of the same chunks runs the two
interleaved, piece by piece (:func:`run_group_allreduce`). ``shm``'s schedule across hosts
runs pipelined, its in-host steps beside the ring (:mod:`ddl.reduction.pipelined`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from ddl.base import kernels
from ddl.base.config import DEFAULT_SHM_BYTES
from ddl.base.ops import ReduceOp
from ddl.reduction import pipelined
from ddl.reduction.scattered import Scattered, Source, fill, read
from ddl.reduction.schedule import AnyStep, GroupStep, Schedule
from ddl.wire.comm import Comm
from ddl.wire.shared_memory import SharedSlots

#: Slot halves and chunk strides start on this many bytes.
ALIGN = 64
#: The smallest slot a group step asks for (bytes per rank).
MIN_SLOT_BYTES = 64 << 10


def run_schedule(
    comm: Comm, schedule: Schedule, buf: np.ndarray, op: ReduceOp, *, segment_elems: int,
    shm_bytes: int = DEFAULT_SHM_BYTES, on_phase: Callable[[tuple[str, float, float]], None] | None = None,
    src: Source | None = None,
) -> None:
    """Execute ``schedule`` in place on the 1-D contiguous ``buf``.

    ``shm_bytes`` caps each rank's shared slot for group steps. ``on_phase`` receives
    ``(phase, start, end)`` for each run of steps of one phase. ``src`` (as ``buf``): the
    input, where the result goes to another array, or a bucket's tensors as they lie
    (:class:`~ddl.reduction.scattered.Scattered`). A schedule that starts with a group
    reduce-scatter reads it there instead of a copy in ``buf`` first (every element of
    ``buf`` is then written by the schedule); any other copies it into ``buf``.

    Raises:
        ValueError: ``buf`` does not match the schedule's element count.
    """
    if buf.ndim != 1 or buf.size != schedule.count or not buf.flags.c_contiguous:
        raise ValueError(f"schedule is for {schedule.count} contiguous elements, buffer has shape {buf.shape}")
    seg = max(1, segment_elems)
    combine = kernels.combiner(op, buf.dtype)  # half sums by the installed kernels (ddl.base.kernels)
    steps = schedule.steps
    if src is None:
        src = buf
    elif src is not buf and not (steps and isinstance(steps[0], GroupStep) and steps[0].reduce):
        fill(buf, src)
        src = buf
    pipe = pipelined.plan(schedule, buf.itemsize)
    if pipe is not None:
        pipelined.run(comm, pipe, buf, combine, _group_ranges(comm, buf, combine, shm_bytes, src), on_phase)
        return
    largest = schedule.largest_reduce
    scratch = np.empty(min(seg, largest), dtype=buf.dtype)
    phase, phase_start = "", time.perf_counter()
    at = 0
    while at < len(steps):
        step = steps[at]
        at += 1
        paired = _paired(step, steps[at] if at < len(steps) else None)
        if on_phase is not None and (label := "shm allreduce" if paired else step.phase) != phase:
            now = time.perf_counter()
            if phase:
                on_phase((phase, phase_start, now))
            phase, phase_start = label, now
        if isinstance(step, GroupStep):
            if paired is not None:
                run_group_allreduce(comm, step, paired, buf, combine, shm_bytes=shm_bytes, src=src if at == 1 else buf)
                at += 1
            else:
                run_group_step(comm, step, buf, combine, shm_bytes=shm_bytes, src=src if at == 1 else buf)
            continue
        n_send, n_recv = step.send_count, step.recv_count
        pieces = max(-(-n_send // seg), -(-n_recv // seg))
        for m in range(pieces):
            a = m * seg
            send = None
            if a < n_send:
                s0 = step.send[0] + a
                send = buf[s0 : s0 + min(seg, n_send - a)]
            if a < n_recv:
                r0 = step.recv[0] + a
                k = min(seg, n_recv - a)
                target = buf[r0 : r0 + k]
                if step.reduce:
                    comm.sendrecv(send, step.send_peer if send is not None else None, scratch[:k], step.recv_peer)
                    combine(target, scratch[:k], out=target)
                else:
                    comm.sendrecv(send, step.send_peer if send is not None else None, target, step.recv_peer)
            else:
                comm.sendrecv(send, step.send_peer, None, None)
    if on_phase is not None and phase:
        on_phase((phase, phase_start, time.perf_counter()))


def _paired(step: AnyStep, nxt: AnyStep | None) -> GroupStep | None:
    """The allgather that directly follows ``step``, a group reduce-scatter of the same chunks (one host, no outer dims)."""
    if (isinstance(step, GroupStep) and step.reduce and isinstance(nxt, GroupStep) and not nxt.reduce
            and nxt.members == step.members and nxt.chunks == step.chunks):
        return nxt
    return None


def slot_bytes(members: int, longest: int, itemsize: int, cap: int) -> int:
    """Bytes per member slot a group step asks for: two halves, each holding one piece of
    every chunk (``members x longest`` elements), as a power of two from 64 KiB, but at
    most ``cap`` (always room for one element per chunk per half). Every member computes
    the same size, so windows grow alike everywhere."""
    need = 2 * members * longest * itemsize
    want = max(MIN_SLOT_BYTES, 1 << max(0, need - 1).bit_length())
    least = 2 * -(-members * itemsize // ALIGN) * ALIGN
    return max(min(want, cap // (2 * ALIGN) * 2 * ALIGN), least)


def piece_elems(members: int, capacity: int, itemsize: int) -> int:
    """Elements of each chunk that one piece moves through slots of ``capacity`` bytes:
    half a slot holds one piece of every member's chunk (whole cache lines each where
    there is room). Reduce-scatter and allgather pieces are alike, so they can pair up."""
    half = capacity // 2 // ALIGN * ALIGN
    per = half // (members * itemsize)
    return max(1, per // ALIGN * ALIGN or per)


def _open(comm: Comm, step: GroupStep, buf: np.ndarray, shm_bytes: int) -> tuple[SharedSlots, int] | None:
    """The group's slots, sized for ``step``, and the piece length; None when there is nothing to move."""
    n_members, longest = len(step.members), step.longest
    if n_members < 2 or longest == 0:
        return None
    shared = comm.shared_slots(step.members, slot_bytes(n_members, longest, buf.itemsize, shm_bytes))
    return shared, piece_elems(n_members, shared.capacity, buf.itemsize)


def run_group_step(
    comm: Comm, step: GroupStep, buf: np.ndarray, combine: Callable[..., np.ndarray], *, shm_bytes: int,
    src: Source | None = None,
) -> None:
    """Run one group step on ``buf`` through the group's shared slots, piece by piece.

    A piece covers the same sub-range ``[a, a + per)`` of every chunk, so chunk i stays
    member i's. Each piece is: write into this rank's slot, barrier, read the others'.
    Pieces alternate between the two halves of every slot (by ``turn``, which counts on
    across steps and calls). That makes one barrier per piece safe: a member writes a
    half at turn t only after the barrier of turn t-1, which no member passed before it
    finished reading turn t-2, the last use of that half.
    """
    opened = _open(comm, step, buf, shm_bytes)
    if opened is None:
        return
    shared, per = opened
    for a in range(0, step.longest, per):
        if step.reduce:
            _reduce_piece(shared, step, buf, combine, a, per, src=src)
        else:
            _gather_piece(shared, step, buf, a, per)


def run_group_allreduce(
    comm: Comm, scatter: GroupStep, gather: GroupStep, buf: np.ndarray, combine: Callable[..., np.ndarray],
    *, shm_bytes: int, src: Source | None = None,
) -> None:
    """A group reduce-scatter and the allgather of the same chunks, piece by piece: piece k
    is gathered right after it is reduced, while it is still in cache. The result is the
    two steps' (pieces are disjoint ranges), with the same pieces and barriers."""
    opened = _open(comm, scatter, buf, shm_bytes)
    if opened is None:
        return
    shared, per = opened
    for a in range(0, scatter.longest, per):
        _reduce_piece(shared, scatter, buf, combine, a, per, src=src)
        _gather_piece(shared, gather, buf, a, per)


def _group_ranges(comm: Comm, buf: np.ndarray, combine: Callable[..., np.ndarray],
                  shm_bytes: int, src: Source) -> Callable[[GroupStep, list[tuple[int, int]]], None]:
    """Runs a group step on the given offsets of every member's chunk, piece by piece
    (:mod:`ddl.reduction.pipelined`'s in-host stages)."""
    def run(step: GroupStep, ranges: list[tuple[int, int]]) -> None:
        opened = _open(comm, step, buf, shm_bytes) if ranges else None
        if opened is None:
            return
        shared, per = opened
        for a, b in ranges:
            for at in range(a, b, per):
                if step.reduce:
                    _reduce_piece(shared, step, buf, combine, at, per, min(per, b - at), src=src)
                else:
                    _gather_piece(shared, step, buf, at, per, min(per, b - at))
    return run


def _half(shared: SharedSlots) -> int:
    """Byte offset of the slot half this turn uses, and advance the turn."""
    base = (shared.capacity // 2 // ALIGN * ALIGN) * (shared.turn % 2)
    shared.turn += 1
    return base


def _reduce_piece(
    shared: SharedSlots, step: GroupStep, buf: np.ndarray, combine: Callable[..., np.ndarray], a: int, per: int,
    count: int | None = None, *, src: Source | None = None,
) -> None:
    # Publish piece a of every chunk, then combine piece a of this member's chunk from
    # every member's copy, in member order: the same bits wherever it is read. Members
    # 0 and 1 take their own piece straight from ``buf`` (an input of the first combine,
    # which may write over it); later members need theirs after that, so publish it.
    # ``per`` is the slot's stride per chunk, ``count`` (at most ``per``) this piece's length;
    # the inputs are read from ``src`` (default ``buf``), the result written to ``buf``.
    # From a bucket's scattered tensors a member's own piece is first copied to where its
    # result goes: the combine then reads the same values in the same order (same bits).
    src = buf if src is None else src
    dtype, item, n_members = buf.dtype, buf.itemsize, len(step.members)
    me, slots, base = shared.index, shared.slots, _half(shared)
    count = per if count is None else count
    out = slots[me][base : base + n_members * per * item].view(dtype)
    for j, (lo, hi) in enumerate(step.chunks):
        n = min(count, hi - lo - a)
        if n > 0 and (j != me or me > 1):
            read(src, lo + a, n, out[j * per : j * per + n])
    shared.barrier()
    my_lo, my_hi = step.chunks[me]
    mine = min(count, my_hi - my_lo - a)
    if mine > 0:
        at = base + me * per * item
        target = buf[my_lo + a : my_lo + a + mine]
        if isinstance(src, Scattered):
            if me < 2:
                src.read(my_lo + a, mine, target)
            own = target
        else:
            own = src[my_lo + a : my_lo + a + mine]
        parts = [own if m == me and me < 2 else slots[m][at : at + mine * item].view(dtype)
                 for m in range(n_members)]
        combine(parts[0], parts[1], out=target)
        for part in parts[2:]:
            combine(target, part, out=target)


def _gather_piece(shared: SharedSlots, step: GroupStep, buf: np.ndarray, a: int, per: int,
                  count: int | None = None) -> None:
    # Publish piece a of this member's chunk, then copy piece a of every other chunk.
    dtype, item = buf.dtype, buf.itemsize
    me, slots, base = shared.index, shared.slots, _half(shared)
    count = per if count is None else count
    my_lo, my_hi = step.chunks[me]
    mine = min(count, my_hi - my_lo - a)
    if mine > 0:
        slots[me][base : base + mine * item].view(dtype)[...] = buf[my_lo + a : my_lo + a + mine]
    shared.barrier()
    for j, (lo, hi) in enumerate(step.chunks):
        n = min(count, hi - lo - a)
        if j != me and n > 0:
            buf[lo + a : lo + a + n] = slots[j][base : base + n * item].view(dtype)
