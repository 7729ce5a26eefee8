"""auto's choice re-checked during training (ddl.reduction.trials): which contender runs,
how the ranks settle, and the engine agreeing on it in the same cycle on every path."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import pytest

import ddl
from ddl.engine.collectives import Collectives
from ddl.engine.context import Context
from ddl.reduction import cost, trials
from ddl.reduction.trials import Trials
from ddl.testing import run_engines

RANKED = (("shm", 1e-3), ("mpi", 1.5e-3), ("ring", 2e-3))
KEY = (80, 4)


def _picks(t: Trials, n: int) -> list[str]:
    return [t.pick(KEY, lambda: RANKED) for _ in range(n)]


K = len(RANKED)  # every contender of RANKED is priced within WORTH of the pick


def test_every_contender_within_worth_runs_in_turn_then_the_model_s_pick_until_settled() -> None:
    t = Trials()
    got = _picks(t, K * trials.TRIAL_RUNS + 2)
    assert got == ["shm"] * trials.TRIAL_RUNS + ["mpi"] * trials.TRIAL_RUNS + ["ring"] * trials.TRIAL_RUNS \
        + ["shm", "shm"]
    assert t.awaiting == [KEY]  # once, at the last trial run


def test_settling_keeps_the_fastest_contender_only_past_the_margin() -> None:
    t = Trials()
    _picks(t, K * trials.TRIAL_RUNS)
    t.settle([1.0, 0.7, 0.5])
    assert t.awaiting == [] and t.overridden == {KEY: "ring"}
    assert _picks(t, 3) == ["ring"] * 3
    u = Trials()
    _picks(u, K * trials.TRIAL_RUNS)
    u.settle([1.0, trials.MARGIN + 0.01, 1.5])  # faster, but within the noise margin
    assert u.overridden == {} and _picks(u, 2) == ["shm", "shm"]


def test_an_algorithm_mispriced_to_the_back_of_the_model_s_order_is_still_tried() -> None:
    """A noisy probe may price the fastest algorithm last (seen: shm at 3x its time, behind
    three others at 2 ranks): it is tried, and wins, all the same."""
    ranked = (("mpi", 1.0e-3), ("halving_doubling", 1.1e-3), ("ring", 1.2e-3), ("multiring", 1.2e-3),
              ("shm", 1.3e-3))
    t = Trials()
    order = [t.pick(KEY, lambda: ranked) for _ in range(5 * trials.TRIAL_RUNS)]
    assert order[-trials.TRIAL_RUNS:] == ["shm"] * trials.TRIAL_RUNS
    t.settle([1.0, 0.95, 0.97, 0.97, 0.6])
    assert t.overridden == {KEY: "shm"}


def test_each_rank_contributes_its_fastest_run_of_each_contender() -> None:
    t = Trials()
    for i, name in enumerate(_picks(t, K * trials.TRIAL_RUNS)):
        t.observe(KEY, name, 0.010 + 0.001 * i)
    assert t.agreement() == pytest.approx([0.010 + 0.001 * trials.TRIAL_RUNS * j for j in range(K)])


def test_an_algorithm_priced_far_above_the_pick_is_never_tried() -> None:
    t = Trials()
    far = (("shm", 1e-3), ("mpi", 1e-3 * trials.WORTH * 1.01))
    assert [t.pick(KEY, lambda: far) for _ in range(10)] == ["shm"] * 10
    assert t.awaiting == [] and t.agreement() == []
    assert [t.pick((1, 4), lambda: (("mpi", 1e-3),)) for _ in range(3)] == ["mpi"] * 3  # a lone candidate


def test_a_settled_class_is_tried_again_after_recheck_runs() -> None:
    t = Trials()
    _picks(t, K * trials.TRIAL_RUNS)
    t.settle([1.0, 0.5, 0.8])
    settled = _picks(t, trials.RECHECK_RUNS)
    assert set(settled) == {"mpi"}
    assert _picks(t, K * trials.TRIAL_RUNS) == ["shm"] * trials.TRIAL_RUNS + ["mpi"] * trials.TRIAL_RUNS \
        + ["ring"] * trials.TRIAL_RUNS
    assert t.awaiting == [KEY]
    t.settle([0.5, 1.0, 1.0])  # back to the model's pick; the next trial waits twice as long
    assert set(_picks(t, 2 * trials.RECHECK_RUNS)) == {"shm"}
    assert _picks(t, trials.TRIAL_RUNS) == ["shm"] * trials.TRIAL_RUNS and t.awaiting == []


def test_settle_refuses_a_vector_of_the_wrong_length() -> None:
    t = Trials()
    _picks(t, K * trials.TRIAL_RUNS)
    with pytest.raises(ValueError, match="1 awaiting size classes \\(3 contenders\\)"):
        t.settle([1.0, 2.0])


# -- on fake ranks: every rank settles alike, whichever path each cycle took here ----------


def test_ranks_settle_on_another_contender_when_the_model_s_pick_is_slow_on_one_rank(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 finds the model's pick slow (as after a noisy init): all ranks move to the
    same other contender together; rank 0 calls synchronously (the lean path), rank 1 waits on an
    async handle (the queued path), so the agreement must sit at the same point of both."""
    nbytes = 64 << 10
    ran: dict[int, list[str]] = {0: [], 1: []}
    real = Context.allreduce_flat

    def timed_flat(self: Context, buf: np.ndarray, op: Any, algorithm: str, **kw: Any) -> None:
        ran[self.topology.rank].append(algorithm)
        if self.topology.rank == 1 and algorithm == self.trials_slow:  # type: ignore[attr-defined]
            time.sleep(0.02)
        real(self, buf, op, algorithm, **kw)

    monkeypatch.setattr(Context, "allreduce_flat", timed_flat)

    def fn(c: Collectives) -> tuple[dict[Any, str], list[bool]]:
        ctx = c.engine.ctx
        ctx.trials = Trials()
        ranked = cost.ranked_class(ctx.topology, cost.size_class(nbytes), 4, ctx.model)
        ctx.trials_slow = ranked[0][0]  # type: ignore[attr-defined]
        contenders = sum(1 for _, price in ranked if price <= trials.WORTH * ranked[0][1])
        ok = []
        for step in range(contenders * trials.TRIAL_RUNS + 3):
            x = np.full(nbytes // 4, float(c.topology.rank + step), np.float32)
            if c.topology.rank == 0:
                got = c.allreduce(x, op=ddl.Sum, name="grad")
            else:
                got = c.allreduce_async(x, op=ddl.Sum, name="grad").wait()
            ok.append(bool(np.all(got == 2 * step + 1)))
        return dict(ctx.trials.overridden), ok

    results = run_engines(2, fn)
    (over0, ok0), (over1, ok1) = results
    assert all(ok0) and all(ok1)
    assert over0 == over1 and len(over0) == 1
    chosen = next(iter(over0.values()))
    # Both ranks ran the same sequence; after the trials, the settled contender every time.
    assert ran[0] == ran[1]
    assert ran[0][-3:] == [chosen] * 3 and ran[0][0] != chosen


def test_trials_are_off_without_a_measured_model() -> None:
    """DDL_CALIBRATION=off (tests, reproducible runs) keeps init's choice: no trials object."""
    from ddl.base.config import Config

    assert Config(calibration="off", auto_trials="on").auto_trials == "on"
    ctx_trials = run_engines(2, lambda c: c.engine.ctx.trials)
    assert ctx_trials == [None, None]  # hand-built contexts (and process sets) run without


def test_describe_names_each_class() -> None:
    t = Trials()
    _picks(t, K * trials.TRIAL_RUNS)
    t.observe(KEY, "shm", 0.001)
    line = t.describe()
    assert "shm vs mpi vs ring" in line and "1000us/-" in line and "trying" in line
    assert math.isinf(t.agreement()[1])


def test_a_class_is_settled_once_its_trial_is_agreed_and_not_before() -> None:
    t = Trials()
    key = (80, 4)
    assert not t.settled(key)  # never ran
    for _ in range(2 * trials.TRIAL_RUNS):
        t.pick(key, lambda: [("shm", 1.0), ("ring", 1.5)])
        assert not t.settled(key)
    t.settle([1.0, 2.0])
    assert t.settled(key)
