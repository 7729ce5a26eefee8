"""How the engine's exchange waits for the other ranks (``ddl.wire.waits.polite_wait``).

A wait polls without pause for its first microseconds (one host: the collective is done
by then), then polls yielding the core between polls (across hosts a nonblocking
collective moves only inside MPI calls, and the kernel's network processing needs the
cores), then sleeps (another rank still computing keeps its core).
"""

from __future__ import annotations

import math
import time

import pytest

import ddl
from ddl.wire import waits as waits_module


class _Request:
    """Completes on its ``n``-th ``Test``, or once ``after`` seconds have passed."""

    def __init__(self, n: int = 10**9, after: float = 1e9) -> None:
        self.n, self.calls, self.until = n, 0, time.perf_counter() + after

    def Test(self) -> bool:  # noqa: N802 - mpi4py's name
        self.calls += 1
        return self.calls >= self.n or time.perf_counter() >= self.until


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    seen = {"yield": 0, "sleep": 0}
    real_sleep = time.sleep

    def yielded() -> None:
        seen["yield"] += 1

    def slept(seconds: float) -> None:
        seen["sleep"] += 1
        real_sleep(seconds)

    monkeypatch.setattr(waits_module.os, "sched_yield", yielded)
    monkeypatch.setattr(waits_module.time, "sleep", slept)
    return seen


def test_a_wait_done_within_the_busy_window_neither_yields_nor_sleeps(counted: dict[str, int]) -> None:
    waits_module.polite_wait(_Request(n=50), busy=1.0, spin=2.0)
    assert counted == {"yield": 0, "sleep": 0}


def test_a_wait_past_the_busy_window_yields_between_polls_then_sleeps(counted: dict[str, int]) -> None:
    waits_module.polite_wait(_Request(after=0.03), busy=0.0, spin=0.01)
    assert counted["yield"] > 10  # polled with yields for 10 ms
    assert counted["sleep"] >= 1  # then slept until done


def test_a_sleeping_wait_leaves_with_the_owners_interruption(counted: dict[str, int]) -> None:
    class Owner:
        interrupted: BaseException | None = ddl.HorovodInternalError("peer lost")
        stall_limit = math.inf

    with pytest.raises(ddl.HorovodInternalError, match="peer lost"):
        waits_module.polite_wait(_Request(), busy=0.0, spin=0.001, owner=Owner())
    assert counted["yield"] > 0


def test_an_exchange_across_hosts_polls_yielding_until_every_request_is_done(counted: dict[str, int]) -> None:
    class Pair:
        polls = 0

        @classmethod
        def Testall(cls, requests: list[object]) -> bool:  # noqa: N802 - mpi4py's name
            cls.polls += 1
            return cls.polls >= 5

    waits_module.yielding_waitall([Pair(), Pair()])
    assert (Pair.polls, counted["yield"], counted["sleep"]) == (5, 3, 0)  # a yield between polls
    waits_module.yielding_waitall([])  # nothing to wait for


class _Owner:
    """What a wait reads of its communicator: the interruption and the stall limit."""

    def __init__(self, limit: float) -> None:
        self.interrupted: BaseException | None = None
        self.stall_limit = limit
        self.rank = 3


@pytest.mark.parametrize("spin", [0.001, math.inf], ids=["sleeping", "yielding"])
def test_a_wait_nobody_answers_ends_at_the_stall_limit_naming_what_it_waited_for(spin: float) -> None:
    """A rank that stopped without leaving (SIGSTOP) never answers: the wait raises once
    it has lasted the stall limit, in its yielding part and in its sleeping part alike."""
    start = time.perf_counter()
    with pytest.raises(ddl.StalledWaitError, match=r"rank 3 waited 0 s for the records.*DDL_STALL_TIMEOUT=0.05"):
        waits_module.polite_wait(_Request(), busy=0.0, spin=spin, owner=_Owner(0.05), what="the records")
    assert 0.05 <= time.perf_counter() - start < 1.0


def test_a_wait_that_ends_within_the_limit_is_not_an_error() -> None:
    waits_module.polite_wait(_Request(after=0.02), busy=0.0, spin=0.005, owner=_Owner(1.0))
    waits_module.yielding_wait(_Request(after=0.02), 0.0, _Owner(1.0), "a barrier")


def test_a_message_from_another_host_that_never_comes_ends_at_the_stall_limit() -> None:
    class Never:
        @staticmethod
        def Testall(requests: list[object]) -> bool:  # noqa: N802 - mpi4py's name
            return False

    with pytest.raises(ddl.StalledWaitError, match="a message of rank 5"):
        waits_module.yielding_waitall([Never()], _Owner(0.05), "a message of rank 5")
