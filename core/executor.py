"""Runs a :class:`~ddl.schedule.Schedule` over a :class:`~ddl.comm.Comm` on a flat buffer.

Each step is one ``Sendrecv``, cut into segments of at most ``segment_elems`` so the
scratch buffer stays small; a reducing step receives into scratch and combines with a
numpy ufunc (which releases the GIL), a copying step receives straight into place.
Both ends derive the number of segments from the same range, so messages always pair.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from ddl.comm import Comm
from ddl.ops import ReduceOp, ufunc
from ddl.schedule import Schedule


def run_schedule(
    comm: Comm, schedule: Schedule, buf: np.ndarray, op: ReduceOp, *, segment_elems: int,
    on_phase: Callable[[tuple[str, float, float]], None] | None = None,
) -> None:
    """Execute ``schedule`` in place on the 1-D contiguous ``buf``.

    ``on_phase`` receives ``(phase, start, end)`` for each run of steps of one phase.

    Raises:
        ValueError: ``buf`` does not match the schedule's element count.
    """
    if buf.ndim != 1 or buf.size != schedule.count or not buf.flags.c_contiguous:
        raise ValueError(f"schedule is for {schedule.count} contiguous elements, buffer has shape {buf.shape}")
    seg = max(1, segment_elems)
    combine = ufunc(op)
    largest = max((s.recv_count for s in schedule.steps if s.reduce), default=0)
    scratch = np.empty(min(seg, largest), dtype=buf.dtype)
    phase, phase_start = "", time.perf_counter()
    for step in schedule.steps:
        if on_phase is not None and step.phase != phase:
            now = time.perf_counter()
            if phase:
                on_phase((phase, phase_start, now))
            phase, phase_start = step.phase, now
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
