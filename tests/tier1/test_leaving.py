"""A leaving rank tells the others: what it holds is gone, so what they hold fails at once.

On fake ranks (threads): a rank that shuts down while another waits for it in a
collective makes that collective raise ``RankLeftError`` within a cycle, naming the
rank, its host and why it left; the verdict that decides it is a pure function of the
exchanged words, equal on every rank, at 2 to 1024 ranks in both exchange modes.
"""

from __future__ import annotations

import threading
import time
from typing import NoReturn

import numpy as np
import pytest

import ddl
from ddl.base.config import Config
from ddl.engine import codec, naming
from ddl.engine.collectives import Collectives
from ddl.engine.watchdog import StallWatch
from ddl.testing import run_engines


def words_for(headers: list[tuple[int, int, int, int, int]]) -> memoryview:
    """The gathered records of ``headers`` (digest, length, stop, inline, due), one per rank."""
    buf = np.zeros(len(headers) * codec.RECORD_BYTES, np.uint8)
    words = memoryview(buf.data).cast("q")
    for q, head in enumerate(headers):
        for i, v in enumerate(head):
            words[q * codec.STRIDE + i] = v
    return words


# -- the verdict ------------------------------------------------------------------------


@pytest.mark.parametrize("p", [2, 3, 256, 1024])
def test_a_rank_leaving_while_others_hold_requests_is_abandoned_alike_everywhere(p: int) -> None:
    heads = [(5, 2, 0, 0, 1)] * p  # every rank holds two requests, stall checks due
    heads[1] = (0, 0, codec.STOP_FAILED, 0, 0)  # rank 1: in shutdown after an exception, nothing pending
    words = words_for(heads)
    verdicts = {codec.decide(words, p, 5, 2), codec.decide(words, p, 0, 0)}
    assert len(verdicts) == 1, verdicts  # the rank that leaves and those that hold decide alike
    verdict = verdicts.pop()
    assert verdict.action == "abandon" and verdict.left == ((1, codec.STOP_FAILED),) and not verdict.all_stop
    # A rank in shutdown that still holds requests of its own is not leaving yet.
    heads[1] = (5, 2, codec.STOP_END, 0, 1)
    assert codec.decide(words_for(heads), p, 5, 2).action == "run"
    # Everyone stopping with nothing pending: the end, not an abandon.
    stopped = words_for([(0, 0, codec.STOP_END, 0, 0)] * p)
    verdict = codec.decide(stopped, p, 0, 0)
    assert verdict.action == "run" and verdict.all_stop


@pytest.mark.parametrize("p", [17, 300])
def test_the_compact_exchange_names_the_lowest_leaving_rank(p: int) -> None:
    vectors = [codec.compact_vector(5, 2, 0, True, rank=q) for q in range(p)]
    vectors[9] = codec.compact_vector(0, 0, codec.STOP_END, False, rank=9)
    vectors[12] = codec.compact_vector(0, 0, codec.STOP_FAILED, False, rank=12)
    v = np.minimum.reduce(np.array(vectors, np.int64)).tolist()
    for mine in ((5, 2), (0, 0)):
        verdict = codec.decide_compact(v, *mine)
        assert verdict.action == "abandon" and verdict.left == ((9, codec.STOP_END),)
    stops = np.minimum.reduce(np.array([codec.compact_vector(0, 0, 2, False, rank=q) for q in range(p)]))
    assert codec.decide_compact(stops.tolist(), 0, 0).all_stop


# -- on fake ranks ----------------------------------------------------------------------


def _leave_while_the_other_waits(failed: bool) -> list[object]:
    def fn(c: Collectives) -> object:
        c.allreduce(np.ones(2), name="warmup")
        if c.topology.rank == 1:
            time.sleep(0.3)  # rank 0 is waiting in 'grad' by now
            started = time.monotonic()
            assert c.engine.stop(failed=failed)  # returns once rank 0 has stopped too
            return time.monotonic() - started
        started = time.monotonic()
        with pytest.raises(ddl.RankLeftError) as info:
            c.allreduce(np.ones(3), name="grad")
        waited = time.monotonic() - started
        with pytest.raises(ddl.RankLeftError):  # and so does every later call
            c.allreduce(np.ones(3), name="later")
        time.sleep(0.5)  # rank 1 waits in its shutdown for this one
        c.engine.stop()
        return waited, info.value

    return run_engines(2, fn, hostnames=["alpha", "beta"], stop=False)


def test_a_rank_that_shuts_down_fails_the_call_another_rank_waits_in_at_once() -> None:
    (waited, error), rank1_stop = _leave_while_the_other_waits(failed=False)
    assert waited < 0.3 + 1.0, waited  # within a cycle of rank 1's shutdown, not a stall timeout
    assert isinstance(error, ddl.HorovodInternalError) and error.ranks == (1,)
    text = str(error)
    assert "rank 1 (host beta) left: its program is ending" in text and "'grad'" in text, text
    assert rank1_stop >= 0.4  # it waited for rank 0's own shutdown, then both stopped


def test_a_rank_leaving_after_an_exception_says_so() -> None:
    (_, error), _ = _leave_while_the_other_waits(failed=True)
    assert "rank 1 (host beta) left after an uncaught exception" in str(error), error


def test_a_labelled_request_is_named_in_the_users_terms() -> None:
    naming.label("opt.b0", "gradients of fc.weight, fc.bias")

    def fn(c: Collectives) -> str:
        if c.topology.rank == 1:
            time.sleep(0.2)
            c.engine.stop()
            return ""
        try:
            c.allreduce(np.ones(3), name="opt.b0")
        except ddl.RankLeftError as exc:
            c.engine.stop()
            return str(exc)
        return "no error"

    text = run_engines(2, fn, stop=False)[0]
    assert "'opt.b0' (gradients of fc.weight, fc.bias)" in text, text


def test_a_bounded_stop_gives_up_when_the_others_never_come() -> None:
    def fn(c: Collectives) -> object:
        if c.topology.rank == 1:
            started = time.monotonic()
            done = c.engine.stop(timeout=0.5)
            return done, time.monotonic() - started
        time.sleep(1.5)  # busy outside ddl for longer than rank 1 waits
        return c.engine.stop(timeout=3.0), 0.0

    rank0, rank1 = run_engines(2, fn, config=Config(stall_timeout=10.0), stop=False)
    assert rank1[0] is False and rank1[1] < 1.2, rank1
    assert rank0[0] is True  # rank 1's engine still answers the cycles it never finished


# -- the stall report ---------------------------------------------------------------------


def test_a_stall_report_says_what_each_missing_rank_was_doing(capsys: pytest.CaptureFixture[str]) -> None:
    class Aborted(Exception):
        pass

    def abort(code: int) -> NoReturn:
        raise Aborted(code)

    naming.label("opt.b3", "gradients of head.weight")
    watch = StallWatch(rank=0, size=3, timeout=4.0, abort=abort)
    doing = {0: ["opt.b3"], 1: [], 2: ["eval.loss"]}
    watch.missing("opt.b3", [0], 0.0, doing)
    with pytest.raises(Aborted):
        watch.missing("opt.b3", [0], 5.0, doing, lambda q: f"rank {q} (host h{q})")
    err = capsys.readouterr().err
    assert "'opt.b3' (gradients of head.weight) was submitted by rank(s) [0] but not by rank(s) [1, 2]" in err
    assert "rank 1 (host h1) holds no collective: alive, but busy outside ddl" in err, err
    assert "rank 2 (host h2) waits in 'eval.loss' instead" in err, err
    assert "DDL_STALL_TIMEOUT=4" in err


def test_leaving_does_not_disturb_threads_that_finish_together() -> None:
    # Ranks that end at about the same time, each after its last collective: nothing fails.
    def fn(c: Collectives) -> bool:
        for step in range(20):
            c.allreduce(np.full(8, step, np.float32), name="g")
        if c.topology.rank == 2:
            time.sleep(0.2)
        threading.Event().wait(0.01 * c.topology.rank)
        return c.engine.stop()

    assert run_engines(3, fn, stop=False) == [True, True, True]
