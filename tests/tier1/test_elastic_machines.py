"""The elastic job's decisions, without processes or root: every transition of the host, world, job and agent machines.

Each machine is a pure function (state, event, timing) -> (state, actions); these tests
hand it made-up states and events and check the state and the actions, as torchrun's
rendezvous tests check its operations' decisions. Each test names the transitions it
covers (``@covers("W7")``); the last test fails when a transition of a machine's
``TRANSITIONS`` table is covered by none.
"""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from ddl.launcher.elastic import agent_machine as am
from ddl.launcher.elastic import discovery as dm
from ddl.launcher.elastic import host as hm
from ddl.launcher.elastic import job_machine as jm
from ddl.launcher.elastic import world as wm
from ddl.launcher.elastic.membership import WorldPlan
from ddl.launcher.elastic.timing import Timing
from ddl.launcher.hosts import HostSlots
from ddl.runtime.elastic.protocol import (
    AnnounceHosts,
    Beat,
    EndCause,
    HostsUpdated,
    Ping,
    Quit,
    RankBeat,
    RankEnded,
    RankProgress,
    RankReport,
    RankStarted,
    Reason,
    Step,
    StopWhy,
    StopWorld,
    StubExit,
    WorldLost,
)

T = Timing()  # beat 0.25 s, lost after 1.5 s, settle 1.75 s, ending 10 s, start timeout 120 s
F = TypeVar("F", bound=Callable[..., Any])


def covers(*ids: str) -> Callable[[F], F]:
    def mark(test: F) -> F:
        test.covers = ids  # type: ignore[attr-defined]
        return test
    return mark


def plan(*hosts: str, slots: int = 1) -> WorldPlan:
    return WorldPlan(tuple(HostSlots(h, slots) for h in hosts))


# -- the host machine ---------------------------------------------------------------------------

def host(phase: hm.HostPhase = hm.HostPhase.STARTING, **kw: Any) -> hm.HostState:
    base = {"name": "h1", "last_heard": 0.0, "connection": None if phase is hm.HostPhase.STARTING else 7}
    return hm.HostState(phase=phase, **{**base, **kw})


@covers("H1", "H4", "H5")
def test_a_host_connects_imports_and_becomes_ready() -> None:
    state, actions = hm.step(host(), hm.Connected(7, "/dev/shm/x/h1", at=2.0), T)
    assert (state.phase, state.connection, state.folder, state.last_heard, actions) == (
        hm.HostPhase.IMPORTING, 7, "/dev/shm/x/h1", 2.0, [])
    state, actions = hm.step(state, hm.Heard(at=5.0), T)
    assert state.last_heard == 5.0 and not actions
    state, _ = hm.step(state, hm.Heard(at=4.0), T)  # a late-processed older event never moves it back
    assert state.last_heard == 5.0
    state, actions = hm.step(state, hm.Warmed(3.5, ("numpy",), at=6.0), T)
    assert state.phase is hm.HostPhase.READY and state.ready and state.warm_seconds == 3.5
    assert actions == [hm.HostNote("agent on h1 ready (preloaded in 3.5 s); could not preload numpy")]


@covers("H2", "H3")
def test_a_second_hello_and_a_hello_for_a_lost_host_are_dropped() -> None:
    ready = host(hm.HostPhase.READY)
    assert hm.step(ready, hm.Connected(9, "f", at=1.0), T) == (ready, [hm.DropConnection(9)])
    lost = host(hm.HostPhase.LOST)
    assert hm.step(lost, hm.Connected(9, "f", at=1.0), T) == (lost, [hm.DropConnection(9)])


@covers("H6", "H14")
def test_late_or_repeated_reports_change_nothing() -> None:
    ready = host(hm.HostPhase.READY, last_heard=3.0)
    assert hm.step(ready, hm.Warmed(1.0, (), at=4.0), T) == (ready, [])
    lost = host(hm.HostPhase.LOST)
    for event in (hm.Heard(9.0), hm.Warmed(1.0, (), 9.0), hm.Closed(9.0), hm.ProcessEnded(1, 9.0), hm.HostTick(999.0)):
        assert hm.step(lost, event, T) == (lost, [])


@covers("H7", "H8")
def test_a_closed_connection_loses_a_connected_host_only() -> None:
    for phase in (hm.HostPhase.IMPORTING, hm.HostPhase.READY):
        state, actions = hm.step(host(phase), hm.Closed(at=1.0, why="its agent sent junk"), T)
        assert state.phase is hm.HostPhase.LOST and actions == [hm.DeclareLost("h1", "its agent sent junk")]
    starting = host()
    assert hm.step(starting, hm.Closed(at=1.0), T) == (starting, [])


@covers("H9", "H10")
def test_the_agents_mpiexec_ending_matters_only_before_it_connected() -> None:
    state, actions = hm.step(host(), hm.ProcessEnded(255, at=1.0), T)
    assert state.phase is hm.HostPhase.LOST
    assert actions == [hm.DeclareLost("h1", "its agent's mpiexec ended with status 255")]
    ready = host(hm.HostPhase.READY)
    assert hm.step(ready, hm.ProcessEnded(0, at=1.0), T) == (ready, [])


@covers("H11", "H13")
def test_a_ready_host_is_lost_after_six_missed_beats_and_not_before() -> None:
    ready = host(hm.HostPhase.READY, last_heard=10.0)
    assert T.lost_after == 1.5 <= 2.0  # the target: a silent host declared lost within 2 s by default
    assert hm.step(ready, hm.HostTick(10.0 + T.lost_after), T) == (ready, [])
    state, actions = hm.step(ready, hm.HostTick(10.0 + T.lost_after + 0.01), T)
    assert state.phase is hm.HostPhase.LOST and len(actions) == 1
    assert isinstance(actions[0], hm.DeclareLost) and "missed 6 heartbeats" in actions[0].why
    slow = Timing(elastic_timeout=10)  # the rate follows --elastic-timeout: 0.5 s beats, lost after 3 s
    assert hm.step(ready, hm.HostTick(12.9), slow) == (ready, [])
    assert hm.step(ready, hm.HostTick(13.1), slow)[0].phase is hm.HostPhase.LOST


@covers("H12", "H13")
def test_a_host_starting_or_importing_has_the_start_timeout() -> None:
    for phase, words in ((hm.HostPhase.STARTING, "did not connect"), (hm.HostPhase.IMPORTING, "silent while importing")):
        state = host(phase, last_heard=0.0)
        assert hm.step(state, hm.HostTick(100.0), T) == (state, [])  # importing torch may stall beats: no false alarm
        lost, actions = hm.step(state, hm.HostTick(120.5), T)
        assert lost.phase is hm.HostPhase.LOST and words in actions[0].why  # type: ignore[union-attr]


# -- the world machine ---------------------------------------------------------------------------

def world(*hosts: str, **kw: Any) -> wm.WorldState:
    return wm.WorldState(number=kw.pop("number", 2), plan=plan(*(hosts or ("h1", "h2", "h3"))),
                         started=kw.pop("started", 0.0), **kw)


def synced(state: wm.WorldState) -> wm.WorldState:
    for r in range(state.plan.np):
        state, _ = wm.step(state, wm.WorldRankStarted(r), T)
        state, _ = wm.step(state, wm.WorldRankProgress(r, Step.SYNCED, 10, at=1.0), T)
    return state


@covers("W1", "W2")
def test_a_world_runs_once_every_rank_started_and_synced() -> None:
    state = world()
    state, actions = wm.step(state, wm.WorldRankStarted(1), T)
    assert state.forked == {1} and not actions
    for r in (0, 1):
        state, actions = wm.step(state, wm.WorldRankProgress(r, Step.SYNCED, 10, at=1.0), T)
        assert state.phase is wm.WorldPhase.STARTING and not actions
    state, actions = wm.step(state, wm.WorldRankProgress(2, Step.SYNCED, 10, at=1.0), T)
    assert state.phase is wm.WorldPhase.RUNNING and actions == [wm.WorldNote("world 2: every rank synced, from commit 10")]


@covers("W3", "W5", "W6")
def test_progress_reports_are_logged_once_and_change_nothing_else() -> None:
    state = synced(world())
    state, actions = wm.step(state, wm.WorldRankProgress(1, Step.COMMIT, 11, at=2.0), T)
    assert not actions
    state, actions = wm.step(state, wm.WorldRankProgress(0, Step.COMMIT, 11, at=2.0), T)
    assert actions == [wm.WorldNote("world 2: first commit (11)")]
    assert wm.step(state, wm.WorldRankProgress(0, Step.COMMIT, 12, at=3.0), T) == (state, [])
    assert wm.step(state, wm.WorldRankProgress(0, Step.RESET, 15, at=4.0, reason=Reason.HOSTS_UPDATED), T) == (
        state, [wm.WorldNote("world 2: the ranks leave at commit 15 for the next world")])
    assert wm.step(state, wm.WorldRankProgress(2, Step.RESET, 15, at=4.0, reason=Reason.HOSTS_UPDATED), T) == (state, [])
    done, actions = wm.step(state, wm.WorldRankProgress(2, Step.DONE, 15, at=4.0), T)
    assert done.done == {2} and not actions and done.phase is state.phase


@covers("W4")
def test_a_rank_leaving_after_a_failed_collective_stops_the_others_at_once() -> None:
    state = synced(world())
    state, actions = wm.step(state, wm.WorldRankProgress(0, Step.RESET, 10, at=5.0, reason=Reason.COLLECTIVE_FAILED), T)
    assert (state.phase, state.ending, state.ending_since) == (wm.WorldPhase.ENDING, wm.Ending.RESET, 5.0)
    assert actions[-1] == wm.StopRanks(2, StopWhy.RESET) and "HorovodInternalError" in actions[0].text  # type: ignore[union-attr]
    assert wm.step(state, wm.WorldRankProgress(1, Step.RESET, 10, at=5.1, reason=Reason.COLLECTIVE_FAILED), T) == (state, [])


@covers("W4", "W22")
def test_a_failed_collective_after_a_rank_raised_is_that_error_not_a_reset() -> None:
    """Measured under load: rank 0 raised at step 7, its leave timed out, it aborted, and rank 1's
    collective failed; rank 1's report reached ddlrun before rank 0's end. The world must end as the
    program's error (no next world), not reset."""
    state = synced(world())
    state, _ = wm.step(state, wm.WorldRankProgress(0, Step.FAILED, 1, at=5.0, reason=Reason.EXCEPTION,
                                                   detail="ValueError: at step 7"), T)
    state, actions = wm.step(state, wm.WorldRankProgress(1, Step.RESET, 1, at=5.5, reason=Reason.COLLECTIVE_FAILED), T)
    assert (state.ending, state.status) == (wm.Ending.ERROR, 1)
    assert actions[-1] == wm.StopRanks(2, StopWhy.ERROR)
    assert "rank 0 raised ValueError: at step 7" in actions[0].text  # type: ignore[union-attr]
    assert "an error of the program, not a lost host; ending the job" in actions[0].text  # type: ignore[union-attr]


@covers("W7", "W23", "W24")
def test_a_rank_killed_by_a_signal_fails_its_host_after_the_settle_time_and_a_frozen_one_at_once() -> None:
    state, actions = wm.step(synced(world()), wm.WorldRankEnded(2, -9, EndCause.SIGNAL, at=4.0), T)
    assert state.ending is None and state.exits[2].code == -9 and not actions  # noted: judged after the settle
    assert wm.step(state, wm.WorldTick(4.0 + T.settle), T) == (state, [])
    state, actions = wm.step(state, wm.WorldTick(4.0 + T.settle + 0.01), T)
    assert state.ending is wm.Ending.LOST and state.lost_hosts == {"h3"}
    assert actions[0] == wm.FailHost("h3") and actions[-1] == wm.StopRanks(2, StopWhy.LOST, ("h3",))
    assert "lost host h3 (rank 2 was killed by signal 9)" in actions[1].text  # type: ignore[union-attr]
    state, actions = wm.step(synced(world()), wm.WorldRankEnded(1, -9, EndCause.FROZEN, at=4.0), T)
    assert state.ending is wm.Ending.LOST and actions[0] == wm.FailHost("h2")
    assert "sent no heartbeat for the rank bound (frozen" in actions[1].text  # type: ignore[union-attr]


@covers("W4", "W7", "W9", "W21")
def test_a_survivor_crashed_by_a_peers_exit_is_not_blamed() -> None:
    """Measured in the chaos run: rank 0 left with sys.exit(0) and MPI then killed rank 2 on another host
    by SIGSEGV. The rank that left is the lost one; the crashed survivor's host stays; a rank whose
    collective failed meanwhile (HorovodInternalError) has the ends judged at once."""
    state, _ = wm.step(synced(world()), wm.WorldRankEnded(0, 0, EndCause.EXIT, at=4.0), T)
    state, _ = wm.step(state, wm.WorldRankEnded(2, -11, EndCause.SIGNAL, at=4.1), T)
    judged, actions = wm.step(state, wm.WorldTick(4.0 + T.settle + 0.01), T)
    assert judged.lost_hosts == {"h1"} and [a for a in actions if isinstance(a, wm.FailHost)] == [wm.FailHost("h1")]
    # The SIGSEGV heard first (another agent's report may overtake): the same verdict.
    state, _ = wm.step(synced(world()), wm.WorldRankEnded(2, -11, EndCause.SIGNAL, at=4.0), T)
    state, _ = wm.step(state, wm.WorldRankEnded(0, 0, EndCause.EXIT, at=4.05), T)
    failed, actions = wm.step(state, wm.WorldRankProgress(1, Step.RESET, 10, at=4.2, reason=Reason.COLLECTIVE_FAILED), T)
    assert failed.ending is wm.Ending.LOST and failed.lost_hosts == {"h1"}
    assert [a for a in actions if isinstance(a, wm.FailHost)] == [wm.FailHost("h1")]


@covers("W7", "W23")
def test_a_rank_killed_from_outside_is_blamed_not_the_survivor_mpi_crashed() -> None:
    """Measured in the chaos run: one rank SIGKILLed alone, and MPI crashed a survivor on another host.
    The SIGKILLed rank's host fails, whatever order the reports come in; a crash alone still counts."""
    for order in ((2, -9, 0, -11), (0, -11, 2, -9)):
        state = synced(world())
        state, _ = wm.step(state, wm.WorldRankEnded(order[0], order[1], EndCause.SIGNAL, at=4.0), T)
        state, _ = wm.step(state, wm.WorldRankEnded(order[2], order[3], EndCause.SIGNAL, at=4.1), T)
        state, actions = wm.step(state, wm.WorldTick(4.0 + T.settle + 0.01), T)
        assert state.lost_hosts == {"h3"} and [a for a in actions if isinstance(a, wm.FailHost)] == [wm.FailHost("h3")]
    crashed, _ = wm.step(synced(world()), wm.WorldRankEnded(1, -11, EndCause.SIGNAL, at=4.0), T)
    crashed, actions = wm.step(crashed, wm.WorldTick(4.0 + T.settle + 0.01), T)
    assert crashed.lost_hosts == {"h2"} and "killed by signal 11" in actions[1].text  # type: ignore[union-attr]


@covers("W8", "W11")
def test_a_rank_leaving_at_a_commit_ends_the_world_without_stopping_the_others() -> None:
    state, actions = wm.step(synced(world()), wm.WorldRankEnded(0, 75, EndCause.EXIT, at=4.0), T)
    assert state.ending is wm.Ending.RESET and actions == []  # the others leave at the same commit by themselves
    state, actions = wm.step(state, wm.WorldRankEnded(1, 3, EndCause.EXIT, at=4.1), T)
    assert state.early == () and not actions  # while ending, a rank's status is only recorded
    state, actions = wm.step(state, wm.WorldRankEnded(2, -9, EndCause.STOP, at=4.2), T)
    assert state.lost_hosts == frozenset() and not actions


@covers("W9", "W14", "W22")
def test_an_exception_of_the_program_ends_the_job_once_no_lost_host_explains_it() -> None:
    state, actions = wm.step(synced(world()), wm.WorldRankProgress(1, Step.FAILED, 10, at=3.9, reason=Reason.EXCEPTION,
                                                              detail="ValueError: bad batch"), T)
    assert state.raised == {1: "ValueError: bad batch"} and not actions
    state, actions = wm.step(state, wm.WorldRankEnded(1, 3, EndCause.EXIT, at=4.0), T)
    assert state.early == (wm.EarlyEnd(rank=1, code=3, cause=EndCause.EXIT, at=4.0),) and state.ending is None
    assert not actions
    assert wm.step(state, wm.WorldTick(4.0 + T.settle), T) == (state, [])  # a lost host may still show up
    state, actions = wm.step(state, wm.WorldTick(4.0 + T.settle + 0.01), T)
    assert state.ending is wm.Ending.ERROR and state.status == 3 and actions[-1] == wm.StopRanks(2, StopWhy.ERROR)
    assert "rank 1 raised ValueError: bad batch and exited with status 3: an error of the program" in \
        actions[0].text  # type: ignore[union-attr]
    # A rank that returned from its training function (done), then failed: the job's error too.
    after, _ = wm.step(synced(world()), wm.WorldRankProgress(0, Step.DONE, 10, at=1.0), T)
    after, _ = wm.step(after, wm.WorldRankEnded(0, 2, EndCause.EXIT, at=2.0), T)
    after, actions = wm.step(after, wm.WorldTick(2.0 + T.settle + 0.01), T)
    assert after.ending is wm.Ending.ERROR and "after its training function returned" in actions[0].text  # type: ignore[union-attr]


@covers("W9", "W21", "W13")
def test_a_rank_that_exits_before_it_finished_is_a_lost_rank_not_a_hang() -> None:
    """sys.exit(3) or exit status 0 mid-step, or an exit before init (never synced): once the settle
    time shows no lost host and no end of the others, its host fails and the world ends (lost),
    so the ranks waiting for it leave for the next world at once."""
    for code in (3, 0):
        for state in (synced(world()), world()):  # mid-step; before init (nothing synced)
            state, actions = wm.step(state, wm.WorldRankEnded(2, code, EndCause.EXIT, at=4.0), T)
            assert state.early and not actions
            state, actions = wm.step(state, wm.WorldTick(4.0 + T.settle + 0.01), T)
            assert state.ending is wm.Ending.LOST and state.lost_hosts == {"h3"}
            assert actions[0] == wm.FailHost("h3") and actions[-1] == wm.StopRanks(2, StopWhy.LOST, ("h3",))
            assert f"rank 2 exited with status {code} before it finished (a lost rank)" in actions[1].text  # type: ignore[union-attr]
    # Every rank leaving with 0 within the settle time (a program that ends without elastic.run): done.
    state = synced(world())
    for r in range(3):
        state, _ = wm.step(state, wm.WorldRankEnded(r, 0, EndCause.EXIT, at=4.0 + r * 0.1), T)
    state, actions = wm.step(state, wm.WorldTick(4.5), T)
    assert state.ending is wm.Ending.DONE and not actions


@covers("W10", "W12")
def test_a_stub_ended_by_mpiexec_is_an_error_unless_a_host_loss_explains_it() -> None:
    state, _ = wm.step(synced(world()), wm.WorldRankEnded(0, -9, EndCause.STUB, at=4.0), T)
    assert state.early == (wm.EarlyEnd(rank=0, code=-9, cause=EndCause.STUB, at=4.0),)
    aborted, actions = wm.step(state, wm.WorldTick(4.0 + T.settle + 0.01), T)
    assert aborted.ending is wm.Ending.ERROR and aborted.status == 0 and "MPI_Abort" in actions[0].text  # type: ignore[union-attr]
    state, actions = wm.step(state, wm.HostLost("h2", "its agent's connection closed", at=4.5), T)
    assert state.ending is wm.Ending.LOST and actions[-1] == wm.StopRanks(2, StopWhy.LOST, ("h2",))  # lost wins
    other = synced(world())
    assert wm.step(other, wm.HostLost("h9", "x", at=1.0), T) == (other, [])  # not a host of this world
    state, actions = wm.step(state, wm.HostLost("h3", "again", at=4.6), T)  # already ending for a loss: noted only
    assert state.lost_hosts == {"h2", "h3"} and len(actions) == 1 and isinstance(actions[0], wm.WorldNote)


@covers("W13", "W19")
def test_every_rank_done_closes_the_world_done() -> None:
    state = synced(world())
    for r in range(3):
        state, _ = wm.step(state, wm.WorldRankEnded(r, 0, EndCause.EXIT, at=5.0), T)
    state, actions = wm.step(state, wm.WorldTick(5.1), T)
    assert state.ending is wm.Ending.DONE and actions == []
    state, actions = wm.step(state, wm.WorldTick(5.2), T)
    assert state.phase is wm.WorldPhase.CLOSED and actions == [wm.Close(2, wm.Ending.DONE, 0)]
    assert wm.step(state, wm.WorldTick(6.0), T) == (state, [])  # closed is final


@covers("W15")
def test_mpiexec_ending_early_fails_the_hosts_whose_ranks_never_started_or_ends_the_job() -> None:
    state = world()
    for r in (0, 1):
        state, _ = wm.step(state, wm.WorldRankStarted(r), T)
    state, actions = wm.step(state, wm.WorldTick(3.0, mpiexec_code=1), T)
    assert state.mpiexec_ended_at == 3.0 and not actions  # reports may still be on their way
    state, actions = wm.step(state, wm.WorldTick(3.0 + T.mpiexec_grace + 0.1, mpiexec_code=1), T)
    assert wm.FailHost("h3") in actions and state.ending is wm.Ending.LOST
    nobody = world()  # no rank started anywhere: the problem is not one host's
    nobody, _ = wm.step(nobody, wm.WorldTick(3.0, mpiexec_code=7), T)
    nobody, actions = wm.step(nobody, wm.WorldTick(5.5, mpiexec_code=7), T)
    assert nobody.ending is wm.Ending.ERROR and nobody.status == 7
    assert "mpiexec ended with status 7 before every rank reported" in actions[0].text  # type: ignore[union-attr]


@covers("W16")
def test_ranks_not_synced_within_the_start_timeout() -> None:
    state = world()
    state, _ = wm.step(state, wm.WorldRankStarted(0), T)
    state, actions = wm.step(state, wm.WorldTick(T.start_timeout + 1), T)
    assert [a for a in actions if isinstance(a, wm.FailHost)] == [wm.FailHost("h2"), wm.FailHost("h3")]
    for r in (1, 2):
        state, _ = wm.step(state, wm.WorldRankStarted(r), T)
    everywhere = world()
    for r in range(3):
        everywhere, _ = wm.step(everywhere, wm.WorldRankStarted(r), T)
    everywhere, actions = wm.step(everywhere, wm.WorldTick(T.start_timeout + 1), T)
    assert everywhere.ending is wm.Ending.ERROR and "(--start-timeout)" in actions[0].text  # type: ignore[union-attr]


@covers("W17")
def test_a_change_of_hosts_is_announced_once_every_rank_synced() -> None:
    bigger = plan("h1", "h2", "h3", "h4")
    starting = world()
    assert wm.step(starting, wm.WorldTick(1.0, desired=bigger), T) == (starting, [])  # not synced yet
    state = synced(world())
    assert wm.step(state, wm.WorldTick(1.0, desired=plan("h1", "h2", "h3")), T) == (state, [])  # the same hosts
    two = synced(wm.WorldState(number=2, plan=WorldPlan((HostSlots("h1", 2), HostSlots("h2", 1))), started=0.0))
    assert wm.step(two, wm.WorldTick(1.0, desired=plan("h1", "h2")), T) == (two, [])  # fewer slots, no host gone: stay
    state, actions = wm.step(state, wm.WorldTick(1.0, desired=bigger), T)
    assert state.announced and actions[-1] == wm.Announce(2)
    assert wm.step(state, wm.WorldTick(2.0, desired=bigger), T) == (state, [])  # once
    gone = synced(world())
    assert wm.step(gone, wm.WorldTick(1.0, desired=plan("h1", "h2", "h4")), T)[1][-1] == wm.Announce(2)


@covers("W18", "W19")
def test_ranks_that_do_not_leave_are_stopped_again_and_the_world_closes_at_last() -> None:
    state, _ = wm.step(synced(world()), wm.WorldRankEnded(0, 75, EndCause.EXIT, at=0.0), T)
    assert wm.step(state, wm.WorldTick(T.restop - 0.1), T) == (state, [])
    state, actions = wm.step(state, wm.WorldTick(T.restop + 0.1), T)
    assert actions == [wm.StopRanks(2, StopWhy.RESET)] and state.ending_since == T.restop + 0.1
    state, actions = wm.step(state, wm.WorldTick(T.restop + 0.1 + T.ending), T)
    assert actions == [wm.Close(2, wm.Ending.RESET, 0)]
    lost, _ = wm.step(synced(world()), wm.HostLost("h3", "x", at=0.0), T)
    for r in (0, 1):
        lost, _ = wm.step(lost, wm.WorldRankEnded(r, -9, EndCause.STOP, at=0.5), T)
    assert wm.step(lost, wm.WorldTick(0.6), T)[1] == [wm.Close(2, wm.Ending.LOST, 0)]  # h3's rank cannot report


@covers("W20", "W19")
def test_ddlrun_ending_stops_the_ranks() -> None:
    state, actions = wm.step(synced(world()), wm.Shutdown(at=3.0), T)
    assert state.ending is wm.Ending.DONE and actions == [wm.StopRanks(2, StopWhy.DONE)]
    error, _ = wm.step(synced(world()), wm.WorldRankProgress(1, Step.FAILED, 1, at=0.0, reason=Reason.EXCEPTION), T)
    error, _ = wm.step(error, wm.WorldRankEnded(1, 3, EndCause.EXIT, at=0.0), T)
    error, _ = wm.step(error, wm.WorldTick(T.settle + 1), T)
    error, actions = wm.step(error, wm.WorldTick(T.settle + 1 + T.ending), T)
    assert actions == [wm.Close(2, wm.Ending.ERROR, 3)]


# -- the job's decisions -------------------------------------------------------------------------

def decide(**kw: Any) -> jm.StartWorld | jm.Wait | jm.Finish:
    base = {"plan": plan("h1", "h2"), "first": True, "np": None, "max_np": 3, "min_np": 2, "listed_slots": 3,
            "hosts_starting": True, "elapsed": 1.0, "start_timeout": 120.0, "discovery": True}
    return jm.start_decision(**{**base, **kw})


@covers("J1", "J5")
def test_the_first_world_waits_for_every_listed_slot_or_np() -> None:
    assert decide() == jm.Wait()
    assert decide(plan=plan("h1", "h2", "h3")) == jm.StartWorld(plan("h1", "h2", "h3"))
    assert decide(np=2) == jm.StartWorld(plan("h1", "h2"))
    assert decide(hosts_starting=False) == jm.StartWorld(plan("h1", "h2"))  # nothing more is coming
    assert decide(first=False, plan=plan("h1", "h2")) == jm.StartWorld(plan("h1", "h2"))  # later: --min-np
    assert decide(first=False, plan=plan("h1"), hosts_starting=True) == jm.Wait()


@covers("J1", "J3", "J5")
def test_the_first_world_is_never_smaller_than_min_np_even_when_fewer_slots_are_listed() -> None:
    """--min-np 3 --max-np 3 with 2 slots listed: wait for a third (not a world of 2 that exits 0),
    and fail after --start-timeout; a host failing before any world (0 listed) starts nothing."""
    two = plan("h1", "h2")
    for starting in (True, False):
        assert decide(plan=two, min_np=3, max_np=3, listed_slots=2, hosts_starting=starting) == jm.Wait()
    finish = decide(plan=two, min_np=3, max_np=3, listed_slots=2, hosts_starting=False, elapsed=121)
    assert isinstance(finish, jm.Finish) and finish.status == 1 and "--min-np 3 needs more" in finish.message
    assert decide(plan=plan(), min_np=1, listed_slots=0, hosts_starting=False) == jm.Wait()
    assert decide(plan=plan("h1", "h2", "h3"), min_np=3, max_np=3, listed_slots=3) == jm.StartWorld(
        plan("h1", "h2", "h3"))


@covers("J2", "J3")
def test_after_the_start_timeout_the_first_world_starts_with_what_is_ready_or_the_job_fails() -> None:
    assert decide(plan=plan("h1", "h2"), elapsed=121, hosts_starting=True, listed_slots=4, max_np=4) == \
        jm.StartWorld(plan("h1", "h2"))
    finish = decide(plan=plan("h1"), elapsed=121)
    assert isinstance(finish, jm.Finish) and finish.status == 1 and "--min-np 2 needs more" in finish.message
    assert isinstance(decide(plan=plan("h1"), hosts_starting=False, discovery=False), jm.Finish)


@covers("J4")
def test_a_later_world_with_too_few_ranks_ends_the_job() -> None:
    finish = decide(first=False, plan=plan("h1"), hosts_starting=False)
    assert isinstance(finish, jm.Finish) and "but --min-np is 2" in finish.message


@covers("J6", "J7")
def test_what_a_closed_world_means_for_the_job() -> None:
    assert jm.after_close(wm.Ending.DONE, status=0, mpiexec_status=0, resets=1, reset_limit=None) == (1, jm.Finish(0))
    assert jm.after_close(wm.Ending.ERROR, status=3, mpiexec_status=1, resets=0, reset_limit=None) == (0, jm.Finish(3))
    assert jm.after_close(wm.Ending.ERROR, status=0, mpiexec_status=None, resets=0, reset_limit=None) == (
        0, jm.Finish(1))
    assert jm.after_close(wm.Ending.LOST, status=0, mpiexec_status=-9, resets=0, reset_limit=1) == (1, None)
    resets, finish = jm.after_close(wm.Ending.RESET, status=0, mpiexec_status=0, resets=1, reset_limit=1)
    assert resets == 2 and finish is not None and "more than --reset-limit 1" in finish.message


# -- the agent's decisions -----------------------------------------------------------------------

def agent(*ranks: am.RankEntry, **kw: Any) -> am.AgentState:
    return am.AgentState(host="h1", last_heard=kw.pop("last_heard", 0.0), ranks={e.pid: e for e in ranks}, **kw)


def entry(pid: int, world: int = 2, rank: int = 0, **kw: Any) -> am.RankEntry:
    return am.RankEntry(pid=pid, world=world, rank=rank, **kw)


@covers("A1", "A14", "A15")
def test_the_agent_beats_hears_pings_and_fences_itself_after_the_timeout() -> None:
    state, actions = am.step(agent(), am.AgentTick(0.0), T)
    assert actions == [am.TellSupervisor(Beat(host="h1", seq=1))] and state.next_beat == T.beat
    state, actions = am.step(state, am.AgentTick(0.1), T)
    assert actions == []  # not due
    state, _ = am.step(state, am.FromSupervisor(Ping(seq=4), at=4.0), T)
    assert state.last_heard == 4.0
    assert not any(isinstance(a, am.EndAgent) for a in am.step(state, am.AgentTick(4.0 + T.fence_after), T)[1])
    actions = am.step(state, am.AgentTick(4.0 + T.fence_after + 0.01), T)[1]
    assert len(actions) == 1 and isinstance(actions[0], am.EndAgent) and "nothing from ddlrun for 5 s" in actions[0].why


@covers("A2", "A8")
def test_an_announcement_reaches_the_linked_ranks_of_that_world_and_later_links() -> None:
    state = agent(entry(10, world=2, linked=True), entry(11, world=2), entry(12, world=3, linked=True))
    state, actions = am.step(state, am.FromSupervisor(AnnounceHosts(world=2), at=1.0), T)
    assert actions == [am.TellRank(10, HostsUpdated())] and state.announced_world == 2
    state, actions = am.step(state, am.RankLinked(11, at=1.0), T)  # linked after the announcement: told at once
    assert state.ranks[11].linked and actions == [am.TellRank(11, HostsUpdated())]
    assert am.step(state, am.RankLinked(99, at=1.0), T) == (state, [])  # not a rank of this agent


@covers("A3", "A13")
def test_a_world_that_lost_a_host_raises_first_and_kills_after_the_grace() -> None:
    state = agent(entry(10, linked=True, heard=1.0), entry(11, rank=1))
    state, actions = am.step(state, am.FromSupervisor(StopWorld(world=2, why=StopWhy.LOST, lost=["h3"]), at=1.0), T)
    assert actions == [am.TellRank(10, WorldLost(world=2, lost=["h3"])), am.KillRank(11)]
    assert state.ranks[10].kill_at == 1.0 + T.lost_grace and state.ranks[11].killed_because is EndCause.STOP
    again, actions = am.step(state, am.FromSupervisor(StopWorld(world=2, why=StopWhy.LOST, lost=["h3"]), at=1.1), T)
    assert actions == []  # told already, its kill is due
    _, actions = am.step(state, am.AgentTick(1.0 + T.lost_grace - 0.01), T)
    assert am.KillRank(10) not in actions
    state, actions = am.step(state, am.AgentTick(1.0 + T.lost_grace), T)
    assert am.KillRank(10) in actions and state.ranks[10].killed_because is EndCause.STOP


@covers("A4")
def test_other_stops_kill_the_worlds_ranks_but_not_a_newer_worlds() -> None:
    state = agent(entry(10, world=2, linked=True), entry(20, world=3, rank=0))
    state, actions = am.step(state, am.FromSupervisor(StopWorld(world=2, why=StopWhy.ERROR, lost=[]), at=1.0), T)
    assert actions == [am.KillRank(10)] and state.ranks[20].killed_because is None


@covers("A18", "A4")
def test_a_rank_forked_for_a_stopped_world_is_killed_at_once() -> None:
    state, _ = am.step(agent(), am.FromSupervisor(StopWorld(world=3, why=StopWhy.LOST, lost=["h2"]), at=1.0), T)
    assert state.stopped_world == 3
    state, actions = am.step(state, am.RankForked(pid=10, world=3, rank=1), T)  # its stub came late
    assert actions == [am.TellSupervisor(RankStarted(host="h1", world=3, rank=1, pid=10)), am.KillRank(10)]
    assert state.ranks[10].killed_because is EndCause.STOP
    _, actions = am.step(state, am.RankForked(pid=11, world=4, rank=1), T)  # the next world's
    assert actions == [am.TellSupervisor(RankStarted(host="h1", world=4, rank=1, pid=11))]


@covers("W12", "W19")
def test_a_world_lost_while_it_starts_does_not_wait_for_ranks_never_forked() -> None:
    """A host lost while the next world's ranks start (the chaos run's 'fault while a new world syncs'):
    the world closes once its forked ranks are gone, not after the ending timeout."""
    state = world()
    for r in (0, 2):
        state, _ = wm.step(state, wm.WorldRankStarted(r), T)  # rank 1's stub (on h2) has not reached its agent
    state, _ = wm.step(state, wm.HostLost("h3", "its agent's connection closed", at=1.0), T)
    assert wm.step(state, wm.WorldTick(1.1), T)[1] == []  # rank 0 (forked, on h1) is still there
    state, _ = wm.step(state, wm.WorldRankEnded(0, -9, EndCause.STOP, at=1.2), T)
    assert wm.step(state, wm.WorldTick(1.3), T)[1] == [wm.Close(2, wm.Ending.LOST, 0)]


@covers("A5", "A6")
def test_quit_and_a_gone_supervisor_end_the_agent() -> None:
    assert isinstance(am.step(agent(), am.FromSupervisor(Quit(), at=1.0), T)[1][0], am.EndAgent)
    assert isinstance(am.step(agent(), am.SupervisorGone(at=1.0), T)[1][0], am.EndAgent)


@covers("A7", "A9", "A12")
def test_a_ranks_life_is_reported_to_ddlrun_and_its_stub() -> None:
    state, actions = am.step(agent(), am.RankForked(pid=10, world=2, rank=5), T)
    assert actions == [am.TellSupervisor(RankStarted(host="h1", world=2, rank=5, pid=10))]
    state, actions = am.step(state, am.RankSaid(10, RankReport(step=Step.FAILED, serial=4, reason=Reason.EXCEPTION,
                                                               detail="KeyError: 'x'"), at=1.0), T)
    assert actions == [am.TellSupervisor(RankProgress(host="h1", world=2, rank=5, step=Step.FAILED, serial=4,
                                                      reason=Reason.EXCEPTION, detail="KeyError: 'x'"))]
    done, actions = am.step(state, am.RankExited(10, 0), T)
    assert 10 not in done.ranks
    assert actions == [am.TellSupervisor(RankEnded(host="h1", world=2, rank=5, code=0, cause=EndCause.EXIT)),
                       am.TellStub(10, StubExit(code=0))]
    killed = am.step(state, am.RankExited(10, -9), T)[1][0]
    assert killed == am.TellSupervisor(RankEnded(host="h1", world=2, rank=5, code=-9, cause=EndCause.SIGNAL))


@covers("A10", "A11", "A12")
def test_a_stub_going_away_or_signalled_ends_its_rank() -> None:
    state, actions = am.step(agent(entry(10)), am.StubSignalled(10, int(signal.SIGTERM)), T)
    assert actions == [am.KillRank(10, signal.SIGTERM)] and state.ranks[10].killed_because is EndCause.STUB
    assert am.step(state, am.StubGone(10), T) == (state, [])  # dying already
    state, actions = am.step(agent(entry(11)), am.StubGone(11), T)
    assert actions == [am.KillRank(11)]
    _, actions = am.step(state, am.RankExited(11, -9), T)
    assert actions[0].message.cause is EndCause.STUB  # type: ignore[union-attr]  # who ended it, not the signal


@covers("A16", "A17")
def test_a_frozen_rank_is_killed_after_the_rank_bound_and_a_slow_one_never_is() -> None:
    """A rank's own beats (a thread of its link) keep it alive however slow its steps (a straggler);
    a linked rank silent for the rank bound (SIGSTOP, not scheduled) is killed, and ddlrun hears
    it ended frozen (W7: its host fails). Unlinked ranks (importing, before init) are not judged."""
    assert T.rank_silent_after == 2 * T.lost_after == 3.0  # the target: frozen within 2x the heartbeat bound
    state = agent(entry(10, linked=True, heard=0.0), entry(11, rank=1))
    now = 0.0
    while now < 60.0:  # a straggler: a beat every second, steps of any length
        now += 1.0
        state, _ = am.step(state, am.RankSaid(10, RankBeat(seq=int(now)), at=now), T)
        state, _ = am.step(state, am.FromSupervisor(Ping(seq=1), at=now), T)
        state, actions = am.step(state, am.AgentTick(now), T)
        assert not any(isinstance(a, am.KillRank) for a in actions), now
    assert state.ranks[10].heard == 60.0
    state, _ = am.step(state, am.FromSupervisor(Ping(seq=2), at=60.0 + T.rank_silent_after), T)  # ddlrun is there
    _, actions = am.step(state, am.AgentTick(60.0 + T.rank_silent_after), T)
    assert not any(isinstance(a, am.KillRank) for a in actions)
    state, actions = am.step(state, am.AgentTick(60.0 + T.rank_silent_after + 0.01), T)
    assert am.KillRank(10) in actions and am.KillRank(11) not in actions  # 11 never linked
    assert state.ranks[10].killed_because is EndCause.FROZEN
    assert any(isinstance(a, am.Log) and "sent nothing for 3.0 s (frozen" in a.text for a in actions)
    _, actions = am.step(state, am.RankExited(10, -9), T)
    assert actions[0] == am.TellSupervisor(RankEnded(host="h1", world=2, rank=0, code=-9, cause=EndCause.FROZEN))
    # A report counts as a word too.
    state, _ = am.step(agent(entry(10, linked=True, heard=0.0)), am.RankSaid(
        10, RankReport(step=Step.COMMIT, serial=1), at=9.0), T)
    assert state.ranks[10].heard == 9.0
    # Measured on the PyTorch example at load 14: a rank done with training went silent for more than
    # the bound while its interpreter exited (its beating thread ends first). Leaving ranks are not judged.
    for step in (Step.DONE, Step.RESET, Step.FAILED):
        state, _ = am.step(agent(entry(10, linked=True, heard=0.0)), am.RankSaid(
            10, RankReport(step=step, serial=1), at=1.0), T)
        state, _ = am.step(state, am.FromSupervisor(Ping(seq=1), at=30.0), T)
        _, actions = am.step(state, am.AgentTick(30.0), T)
        assert not any(isinstance(a, am.KillRank) for a in actions), step


# -- the discovery's decisions ---------------------------------------------------------------------

def discovered(*names: str, at: float = 1.0, seconds: float = 0.1, skipped: tuple[str, ...] = ()) -> dm.Discovered:
    return dm.Discovered(tuple(HostSlots(n, 1) for n in names), skipped, seconds, at)


def discover(state: dm.DiscoveryState, event: dm.DiscoveryEvent) -> tuple[dm.DiscoveryState, list[dm.DiscoveryAction]]:
    return dm.step(state, event, slow_after=T.elastic_timeout, script="d.sh")


@covers("D1", "D2", "D5")
def test_discovery_lists_are_observed_garbage_named_once_and_a_failed_first_run_ends_the_job() -> None:
    state, actions = discover(dm.DiscoveryState(), discovered("h1", "h2"))
    assert state.known and actions == [dm.Observe((HostSlots("h1", 1), HostSlots("h2", 1)))]
    junk = ("d.sh line 3: '<html>'",)
    state, actions = discover(state, discovered("h1", skipped=junk))
    assert actions == [dm.DiscoveryNote("host discovery printed 1 line(s) that are not host[:slots], skipped: d.sh line 3: "
                               "'<html>'"), dm.Observe((HostSlots("h1", 1),))]
    _, actions = discover(state, discovered("h1", skipped=junk))
    assert actions == [dm.Observe((HostSlots("h1", 1),))]  # said once
    _, actions = discover(dm.DiscoveryState(), dm.DiscoveryFailed("d.sh exited with status 2 (no API)", 0.1, 1.0))
    assert len(actions) == 1 and isinstance(actions[0], dm.FailJob)
    assert "the first host discovery failed: d.sh exited with status 2 (no API)" in actions[0].message


@covers("D3", "D4", "D7")
def test_a_failing_discovery_keeps_the_last_list_and_says_so_once_per_reason() -> None:
    state, _ = discover(dm.DiscoveryState(), discovered("h1", "h2"))
    state, actions = discover(state, dm.DiscoveryFailed("d.sh exited with status 1 (boom)", 0.1, 5.0))
    assert actions == [dm.DiscoveryNote("host discovery failed: d.sh exited with status 1 (boom); keeping the last list "
                               "(1 failure(s) in a row)")]  # no Observe: the membership keeps its list
    state, actions = discover(state, dm.DiscoveryFailed("d.sh exited with status 1 (boom)", 0.1, 6.0))
    assert actions == [] and state.failures == 2
    state, actions = discover(state, dm.DiscoveryFailed("d.sh did not finish in 3 s (--discovery-timeout); killed",
                                                         3.0, 9.5))
    assert len(actions) == 1 and "did not finish in 3 s" in actions[0].text  # type: ignore[union-attr]
    state, actions = discover(state, discovered("h1", at=12.0))
    assert actions[0] == dm.DiscoveryNote("host discovery works again after 3 failure(s) over 7.1 s")  # from 4.9 (5.0 - 0.1)
    assert actions[-1] == dm.Observe((HostSlots("h1", 1),)) and state.failing_since is None


@covers("D6")
def test_a_slow_discovery_is_logged_once_per_slow_spell() -> None:
    state, _ = discover(dm.DiscoveryState(), discovered("h1"))
    state, actions = discover(state, discovered("h1", seconds=6.2))
    assert actions[0] == dm.DiscoveryNote("host discovery took 6.2 s (the job went on meanwhile; runs start one after "
                                 "another, so new hosts are seen that much later)")
    state, actions = discover(state, discovered("h1", seconds=30.0))
    assert actions == [dm.Observe((HostSlots("h1", 1),))]
    state, _ = discover(state, discovered("h1", seconds=0.1))
    _, actions = discover(state, discovered("h1", seconds=7.0))
    assert isinstance(actions[0], dm.DiscoveryNote)


# -- every transition is covered ---------------------------------------------------------------

def test_every_transition_of_every_machine_is_covered_by_a_test() -> None:
    covered = {i for test in globals().values() for i in getattr(test, "covers", ())}
    tables = {**hm.TRANSITIONS, **wm.TRANSITIONS, **jm.TRANSITIONS, **am.TRANSITIONS, **dm.TRANSITIONS}
    assert not set(tables) - covered, f"transitions no test covers: {sorted(set(tables) - covered)}"
    assert not covered - set(tables), f"tests name transitions no machine has: {sorted(covered - set(tables))}"


@pytest.mark.parametrize(("flags", "words"), [({"elastic_timeout": 0.5}, "--elastic-timeout 0.5: give at least 1"),
                                              ({"start_timeout": 0.0}, "--start-timeout 0: give the longest wait")])
def test_timeouts_out_of_range_are_refused_not_replaced(flags: dict[str, float], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        Timing(**flags)


def test_the_machines_states_are_values() -> None:
    """The machines return new states; the ones they were given are left as they were."""
    before = world()
    after, _ = wm.step(before, wm.WorldRankStarted(0), T)
    assert before.forked == frozenset() and after.forked == {0} and dataclasses.is_dataclass(after)
