"""The shared window's barrier: a flag per member, and a wait that passes once every flag reached the count.

Over MPI the flags live in the ``Allocate_shared`` window (tier 2 runs that, with slots cut
into many pieces, under MPICH and Open MPI 5); here the same :class:`Arrivals` polls flags
that threads write, as members in other processes would.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from ddl.wire.shared_memory import Arrivals
from ddl.wire.waits import yielding_wait


def _flags(n: int) -> tuple[np.ndarray, list[memoryview]]:
    words = np.zeros(n * 8, np.int64)  # a cache line apart, as in the window
    return words, [memoryview(words[m * 8 : m * 8 + 1]).cast("B").cast("q") for m in range(n)]


def test_arrivals_pass_only_once_every_flag_reached_the_turn() -> None:
    words, flags = _flags(3)
    arrivals = Arrivals(flags)
    arrivals.start(1)
    assert not arrivals.Test()
    words[0] = words[16] = 1
    assert not arrivals.Test(), "member 1 has not arrived"
    words[8] = 1
    assert arrivals.Test()
    arrivals.start(2)  # the next barrier: nobody has reached it
    assert not arrivals.Test()
    words[0], words[8], words[16] = 2, 5, 2  # a member may already be further on
    assert arrivals.Test()


def test_a_member_that_raced_ahead_does_not_let_the_others_pass_early() -> None:
    words, flags = _flags(2)
    arrivals = Arrivals(flags)
    words[8] = 3  # member 1 is at its third barrier, member 0 (us) at its second
    arrivals.start(2)
    assert not arrivals.Test()
    words[0] = 2
    assert arrivals.Test()


def test_threads_as_members_never_read_a_piece_before_every_member_wrote_it() -> None:
    # Each round every member writes its slot, passes the barrier, reads every slot, and
    # passes a second barrier before the next round overwrites them: a barrier that let
    # one member through early shows as a stale value read.
    n, rounds = 4, 300
    words, flags = _flags(n)
    slots = np.zeros(n, np.int64)
    stale: list[tuple[int, int, int]] = []

    def member(me: int) -> None:
        arrivals, turn = Arrivals(list(flags)), 0

        def barrier() -> None:
            nonlocal turn
            turn += 1
            flags[me][0] = turn
            arrivals.start(turn)
            yielding_wait(arrivals)

        for k in range(1, rounds + 1):
            slots[me] = k
            barrier()
            seen = slots.copy()
            if (seen != k).any():
                stale.append((me, k, int(seen.min())))
            barrier()

    threads = [threading.Thread(target=member, args=(m,)) for m in range(n)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a member never passed a barrier"
    assert not stale, stale[:5]
    assert (words[::8] == 2 * rounds).all()
    assert time.perf_counter() - start < 60
