"""How a rank waits for the others: MPI requests (and requests that poll shared memory)
completed by polling, yielding the core, then sleeping, bounded by the owner's stall limit;
and a collective prepared once and run by calling it (:class:`PreparedCollective`).

Apart from :mod:`ddl.wire.comm` so each file keeps one concern: the communicator moves
bytes, this module decides how its callers wait for them.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from typing import Any

from ddl.base.errors import StalledWaitError


def polite_wait(request: Any, spin: float = 1e-3, longest: float = 200e-6,
                owner: Any = None, busy: float = 20e-6, what: str = "the other ranks' negotiation records") -> None:
    """Complete an MPI request: polling, then polling that yields the core, then sleeping
    in growing steps.

    - ``busy`` seconds of plain polling: all ranks arrive together and the collective
      takes microseconds (one host), so this costs what a blocking call would.
    - Up to ``spin`` seconds of polling with ``sched_yield`` between polls: a collective
      across hosts needs its waiters to keep polling (a nonblocking collective moves
      only inside MPI calls), while the kernel's network processing and the other ranks
      need the cores. On 2 emulated hosts x 2 ranks at 1 Gbit/s the engine's 4 KiB
      record allgather took 0.11 ms so, against 0.35 ms blocking and 1.1 ms sleeping.
    - Then sleeps: a long wait (another rank still in backward) leaves the core to that
      rank's compute. mpi4py drops the GIL inside ``Test``. While sleeping it raises
      ``owner.interrupted`` once that is set (an elastic world whose peer was lost: the
      request can never complete).

    With an ``owner`` whose ``stall_limit`` is finite, a wait that lasts longer raises
    :class:`~ddl.base.errors.StalledWaitError` naming ``what`` it waited for: a rank that
    stopped without leaving (SIGSTOP, a hung file system) would otherwise hold every other
    rank here for good.
    """
    if request.Test():
        return
    start = time.perf_counter()
    limit = math.inf if owner is None else owner.stall_limit
    while time.perf_counter() - start < busy:
        if request.Test():
            return
    while (waited := time.perf_counter() - start) < spin:
        if request.Test():
            return
        if waited > limit:
            raise stalled(owner, waited, what)
        os.sched_yield()
    pause = 20e-6
    while not request.Test():
        if owner is not None:
            if owner.interrupted is not None:
                raise owner.interrupted
            if (waited := time.perf_counter() - start) > limit:
                raise stalled(owner, waited, what)
        time.sleep(pause)
        pause = min(pause * 2, longest)


def yielding_wait(request: Any, busy: float = 0.0, owner: Any = None, what: str = "") -> None:
    """:func:`polite_wait` that never sleeps, for waits inside a collective (its ranks are
    all in it): at 4 ranks on 2 cores a shared-memory barrier waited so made a 1 MiB
    allreduce 1.9x faster than MPI's own (whose blocking barrier keeps a core the rank it
    waits for needs)."""
    polite_wait(request, spin=math.inf, busy=busy, owner=owner, what=what)


def yielding_waitall(requests: list[Any], owner: Any = None, what: str = "") -> None:
    """Complete ``requests``, polling with ``sched_yield`` between polls: a message across
    hosts moves only while its ranks poll, and the kernel's network processing and the
    other ranks need the cores MPI's own wait would keep busy. Bounded by
    ``owner.stall_limit`` as :func:`polite_wait` is."""
    if not requests:
        return
    testall = requests[0].Testall
    if testall(requests):
        return
    limit = math.inf if owner is None else owner.stall_limit
    start = time.perf_counter()
    while not testall(requests):
        if limit != math.inf and (waited := time.perf_counter() - start) > limit:
            raise stalled(owner, waited, what)
        os.sched_yield()


def stalled(owner: Any, waited: float, what: str) -> StalledWaitError:
    """The error of a wait past ``owner.stall_limit``."""
    return StalledWaitError(
        f"rank {owner.rank} waited {waited:.0f} s for {what or 'the other ranks'}, and nothing came: a rank stopped "
        "taking part without leaving (a stopped or frozen process, a hung file system, a host that cannot be "
        f"reached), so the job ends (DDL_STALL_TIMEOUT={owner.stall_limit:g}; raise it where a rank may "
        "legitimately keep the others waiting that long)")


class PreparedCollective:
    """A collective prepared once (its buffers fixed) and run by calling it.

    It refuses to run while an earlier run is unfinished: a wait left because the world
    lost a peer (:attr:`Comm.interrupted`) leaves the collective active, and MPI forbids
    starting an active persistent request again (it aborted the job, issue 39); no
    exchange may follow in that world anyway.
    """

    __slots__ = ("_start", "_test", "_wait", "active")

    def __init__(self, start: Callable[[], None], wait: Callable[[], None],
                 test: Callable[[], bool] | None = None) -> None:
        self._start = start
        #: Whether the run already completed (tried once before ``wait``: a small call's
        #: peers are usually there, and the wait's frames cost more than the exchange).
        self._test = test
        self._wait = wait
        #: Started and not yet completed (an interrupted run stays active for good).
        self.active = False

    def __call__(self) -> None:
        if self.active:
            raise RuntimeError("the engine's prepared exchange is still active from an interrupted run; this "
                               "world can run no collective any more")
        self._start()
        self.active = True
        if self._test is None or not self._test():
            self._wait()
        self.active = False
