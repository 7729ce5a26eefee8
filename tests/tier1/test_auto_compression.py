"""``compression="auto"``: the pure per-bucket decision, its spelling, and ``ddl plan``'s display of it."""

from __future__ import annotations

import numpy as np
import pytest

from ddl.engine.auto_compression import AutoCompression, as_hook_or_auto, decide, hook_seconds
from ddl.engine.compression import Compression
from ddl.engine.hooks import traffic
from ddl.engine.powersgd import PowerSGD
from ddl.reduction import cost
from ddl.tools import plan
from ddl.tools.plan_hooks import ModeError, auto_decisions, mode_lines, parse_mode, plan_mode

MLP = [(2048, 1024), (2048,), (1024, 2048), (1024,), (512, 1024), (512,), (10, 512), (10,)]  # ddl bench torch's
BIG = [(2048, 1024)]
SLOW = cost.CostModel(links=(cost.Link(alpha=200e-6, beta=8 / 100e6),))  # 100 Mbit/s everywhere
FAST = cost.CostModel(links=(cost.Link(alpha=2e-6, beta=1 / 50e9),))  # faster than any cast
# Shared memory priced as slow as that link: one host's rule must hold whatever the price says.
SLOW_SHM = cost.CostModel(links=(cost.Link(alpha=200e-6, beta=8 / 100e6),), shm_alpha=200e-6, shm_beta=8 / 100e6,
                          shm_beta_large=8 / 100e6)
HOOKS = [Compression.fp16, PowerSGD(rank=4, start_iter=0)]


@pytest.mark.parametrize("hook", HOOKS, ids=["fp16", "powersgd"])
def test_one_host_never_compresses_however_slow_its_link_is_priced(hook: object) -> None:
    for spec in ("2", "4", "8x1"):
        d = decide(hook, BIG, 4, plan.plan_topology(spec), SLOW_SHM)  # type: ignore[arg-type]
        assert not d.compress and "one host" in d.reason
        assert d.saved_s > d.cost_s  # priced, it would pay: one host is a rule, not a price
    assert not decide(hook, BIG, 4, plan.plan_topology("1"), SLOW).compress  # type: ignore[arg-type]


@pytest.mark.parametrize("hook", HOOKS, ids=["fp16", "powersgd"])
def test_across_hosts_it_compresses_where_the_link_time_saved_exceeds_the_work(hook: object) -> None:
    slow = decide(hook, BIG, 4, plan.plan_topology("1x4"), SLOW)  # type: ignore[arg-type]
    assert slow.compress and slow.saved_s > slow.cost_s > 0
    fast = decide(hook, BIG, 4, plan.plan_topology("1x4"), FAST)  # type: ignore[arg-type]
    assert not fast.compress and fast.saved_s < fast.cost_s
    assert "would save" in fast.reason


def test_the_hooks_work_is_priced_from_their_passes_and_products() -> None:
    n = 2048 * 1024
    fp16 = traffic(Compression.fp16, BIG, 4)
    assert hook_seconds(Compression.fp16, fp16, n, 4, memory_rate=1e9) == pytest.approx(2 * n * 6 / 1e9)
    assert hook_seconds(Compression.fp16, fp16, n, 2, memory_rate=1e9) == 0.0  # float16 already: nothing to cast
    psgd = PowerSGD(rank=4, start_iter=0)
    t = traffic(psgd, BIG, 4)
    assert hook_seconds(psgd, t, n, 4, flop_rate=1e9, memory_rate=2e9) == pytest.approx(t.flops / 1e9 + t.memory_bytes / 2e9)
    # A slower memory makes a bucket that paid stop paying.
    topo = plan.plan_topology("1x4")
    link = cost.CostModel(links=(cost.Link(alpha=20e-6, beta=1 / 1.2e9),))
    assert AutoCompression(Compression.fp16, memory_rate=50e9).decide(BIG, 4, topo, link).compress
    assert not AutoCompression(Compression.fp16, memory_rate=0.5e9).decide(BIG, 4, topo, link).compress


def test_resolve_gives_the_inner_hook_or_none_and_leaves_integers_alone() -> None:
    auto, topo = AutoCompression(PowerSGD(rank=2)), plan.plan_topology("1x4")
    assert auto.resolve(BIG, np.dtype(np.float32), topo, SLOW) == PowerSGD(rank=2)
    assert auto.resolve(BIG, np.dtype(np.float32), plan.plan_topology("4"), SLOW) is Compression.none
    assert auto.resolve(BIG, np.dtype(np.int32), topo, SLOW) is Compression.none
    assert auto.new_state() is not None and AutoCompression().new_state() is None


def test_spellings_and_bad_ones() -> None:
    assert as_hook_or_auto("auto") == AutoCompression(Compression.fp16)
    assert as_hook_or_auto(AutoCompression(PowerSGD(rank=4))).hook == PowerSGD(rank=4)
    assert as_hook_or_auto("fp16") is Compression.fp16
    with pytest.raises(ValueError, match='"auto"'):
        as_hook_or_auto("fastest")
    with pytest.raises(ValueError, match="give the hook itself"):
        AutoCompression(AutoCompression())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rates must be > 0"):
        AutoCompression(memory_rate=0)
    assert parse_mode("auto").hook == AutoCompression(Compression.fp16)
    assert parse_mode("auto:powersgd:4").hook == AutoCompression(PowerSGD(rank=4, start_iter=0))
    for bad, words in [("auto:none", "auto takes a hook"), ("auto:auto", "auto takes a hook"),
                       ("diloco:4:auto", "give diloco its hook"), ("auto:topk", "unknown hook")]:
        with pytest.raises(ModeError, match=words):
            parse_mode(bad)


def test_plan_prices_auto_as_what_it_chose_and_prints_each_buckets_decision() -> None:
    one_host, hosts = plan.plan_topology("2"), plan.plan_topology("1x4")
    kw = {"step": 0.04}
    for topo, same in ((one_host, "sync"), (hosts, "fp16")):
        auto = plan_mode(parse_mode("auto"), MLP, 4, topo, SLOW, **kw)  # type: ignore[arg-type]
        assert auto.step_s == pytest.approx(plan_mode(parse_mode(same), MLP, 4, topo, SLOW, **kw).step_s)  # type: ignore[arg-type]
    found = auto_decisions(AutoCompression(), MLP, 4, one_host, SLOW)
    assert len(found) >= 2 and not any(d.compress for _, _, d in found)
    lines, rows = mode_lines(["sync", "auto", "auto:powersgd:4"], MLP, 4, one_host, SLOW, step=0.04,
                             backward_fraction=2 / 3, flop_rate=10e9, memory_rate=5e9, first_cap=1 << 20,
                             cap=25 << 20, fusion_threshold=64 << 20)
    text = "\n".join(lines)
    assert "auto: ddl.Compression.fp16 on 0 of" in text and "plain - one host" in text
    assert [r["label"] for r in rows] == ["sync", "auto", "auto:powersgd:4"]
    assert all(not b["compress"] for b in rows[1]["auto"]) and "auto" not in rows[0]
    _, rows = mode_lines(["auto:powersgd:4"], MLP, 4, hosts, SLOW, step=0.04, backward_fraction=2 / 3,
                         flop_rate=10e9, memory_rate=5e9, first_cap=1 << 20, cap=25 << 20, fusion_threshold=64 << 20)
    assert any(b["compress"] for b in rows[0]["auto"])


def test_a_mixed_choice_is_priced_bucket_by_bucket() -> None:
    # The small first bucket does not pay on a fast-latency link whose bandwidth is slow for the big one.
    hosts = plan.plan_topology("1x4")
    link = cost.CostModel(links=(cost.Link(alpha=5e-3, beta=8 / 1e9),))
    found = auto_decisions(AutoCompression(PowerSGD(rank=4, start_iter=0)), MLP, 4, hosts, link)
    assert {d.compress for _, _, d in found} == {True, False}
    mixed = plan_mode(parse_mode("auto:powersgd:4"), MLP, 4, hosts, link, step=0.04)
    every = plan_mode(parse_mode("powersgd:4"), MLP, 4, hosts, link, step=0.04)
    assert mixed.wire_bytes > every.wire_bytes  # the plain bucket sends more
