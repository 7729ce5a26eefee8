"""The engine's exchange through the prepared (persistent) allgather, on the fake communicator.

Production runs (MPICH 4, Open MPI 5) gather every cycle's records with a persistent
MPI-4 allgather prepared at init; these tests run that same path in plain pytest,
including its teardown when an elastic world loses a peer mid-exchange.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import ddl
from ddl.engine.collectives import Collectives
from ddl.testing import FakeComm, run_engines, run_ranks
from ddl.wire.waits import PreparedCollective

POLL_S = 0.05  # the fake's prepared wait looks at `interrupted` this often
INTERRUPT_AFTER_S = 0.2


def _some_collectives(c: Collectives) -> tuple[list[np.ndarray], int, int]:
    r = c.topology.rank
    out = [c.allreduce(np.arange(7, dtype=np.float32) * (r + 1), op=ddl.Sum, name="a")]
    handles = [c.allreduce_async(np.full(5, r + i, np.float64), op=ddl.Average, name=f"b{i}") for i in range(4)]
    out += [h.wait() for h in handles]
    out.append(c.allgather(np.full((r + 1, 2), r, np.int32)))
    out.append(c.broadcast(np.full(3, r, np.int64), root_rank=2))
    comm = c.ctx.comm
    assert isinstance(comm, FakeComm)
    return out, comm.prepared_runs, c.engine.cycles


def test_the_engines_exchange_runs_the_prepared_allgather_and_gives_the_plain_ones_bits() -> None:
    prepared = run_engines(3, _some_collectives)
    plain = run_engines(3, _some_collectives, persistent=False)
    for (got, runs, cycles), (want, plain_runs, _) in zip(prepared, plain, strict=True):
        assert runs >= cycles > 0, (runs, cycles)  # every negotiation went through the prepared one
        assert plain_runs == 0
        for a, b in zip(got, want, strict=True):
            assert a.dtype == b.dtype and np.array_equal(a, b)


def test_the_engine_prepares_its_exchange_from_the_comm_protocol() -> None:
    def fn(c: Collectives) -> tuple[bool, bool]:
        gather = c.engine.exchange._gather
        return isinstance(gather, PreparedCollective), gather is None

    assert run_engines(2, fn) == [(True, False)] * 2
    assert run_engines(2, fn, persistent=False) == [(False, True)] * 2


def test_an_interrupted_prepared_run_is_left_and_never_started_again() -> None:
    """A peer lost mid-exchange: the waiting rank leaves with the given error within a
    poll, the run stays active, and a second start is refused (MPI aborted on it)."""
    lost = ddl.HorovodInternalError("peer lost")

    def fn(comm: FakeComm) -> str:
        send = np.full(4, comm.rank + 1, np.uint8)
        recv = np.zeros(4 * comm.size, np.uint8)
        run = comm.persistent_allgather(send, recv)
        assert isinstance(run, PreparedCollective)
        run()
        assert recv.tolist() == [1] * 4 + [2] * 4
        if comm.rank == 1:
            return "lost"  # never starts the second run
        timer = threading.Timer(INTERRUPT_AFTER_S, setattr, [comm, "interrupted", lost])
        timer.start()
        start = time.monotonic()
        with pytest.raises(ddl.HorovodInternalError, match="peer lost"):
            run()
        waited = time.monotonic() - start
        assert waited < INTERRUPT_AFTER_S + 20 * POLL_S, waited
        assert run.active and comm.prepared_runs == 1
        with pytest.raises(RuntimeError, match="still active from an interrupted run"):
            run()
        return "left"

    assert run_ranks(2, fn) == ["left", "lost"]


def test_an_engine_waiting_in_the_prepared_exchange_for_a_lost_peer_leaves_on_interrupt() -> None:
    """The engine's teardown (issue 39) on the fake: rank 1 is gone (interrupted, no more
    cycles); rank 0's exchange waits for it until interrupt() ends the wait, and the engine
    never starts the still-active exchange again."""
    lost = ddl.HorovodInternalError("peer lost")

    def fn(c: Collectives) -> str:
        if c.topology.rank == 1:
            c.engine.interrupt(ddl.HorovodInternalError("this rank is the lost one"))
            return "lost"
        time.sleep(0.1)  # rank 1 is gone before rank 0 submits
        handle = c.allreduce_async(np.ones(3), op=ddl.Sum, name="never-matched")
        threading.Timer(INTERRUPT_AFTER_S, c.engine.interrupt, [lost]).start()
        start = time.monotonic()
        with pytest.raises(ddl.HorovodInternalError, match="peer lost"):
            handle.wait()
        assert time.monotonic() - start < INTERRUPT_AFTER_S + 20 * POLL_S
        gather = c.engine.exchange._gather
        assert isinstance(gather, PreparedCollective)
        deadline = time.monotonic() + 20 * POLL_S
        while gather.active is False and time.monotonic() < deadline:
            time.sleep(POLL_S)  # the wait that the interrupt ended may be the engine thread's
        assert gather.active, "rank 0 never waited in the prepared exchange"
        thread = c.engine._thread
        assert thread is not None
        thread.join(20 * POLL_S)
        assert not thread.is_alive(), "the engine thread still waits in the exchange"
        with pytest.raises(ddl.HorovodInternalError):
            c.allreduce(np.ones(3), name="later")
        return "left"

    assert run_engines(2, fn, stop=False) == ["left", "lost"]


@pytest.mark.parametrize("size", [2, 3])
def test_a_lean_exchange_after_a_queued_one_sends_one_request_and_no_stop(size: int) -> None:
    """run_one writes the LENGTH and STOP words only when a run() wrote others: a stale
    header would read as a rank holding three requests, or leaving."""
    from ddl.engine import codec

    def fn(comm: FakeComm) -> list[tuple[bool, bool]]:
        ex = codec.Exchange(comm)
        seen = []
        for _ in range(2):
            ex.run(11, 3, stop=codec.STOP_END, due=True)
            seen.append((ex.all_hold(11, 3), ex.verdict(11, 3).all_stop))
            seen.append((ex.run_one(7, 0, False), ex.verdict(7, 1).all_stop))
            seen.append((ex.run_one(9, 0, True), ex.verdict(9, 1).action == "run"))
        return seen

    assert run_ranks(size, fn) == [[(True, True), (True, False), (True, True)] * 2] * size
