"""``ddl plan --modes`` prices what the hooks and the engine really do: casts, products at their shapes, negotiation."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from ddl.engine import codec
from ddl.engine import engine as engine_module
from ddl.engine.powersgd import PowerSGD
from ddl.reduction import cost
from ddl.tools import plan, plan_rates
from ddl.tools.plan_hooks import (
    IDLE_MAX,
    IDLE_MIN,
    cycle_port_bytes,
    cycle_seconds,
    idle_cycles,
    parse_mode,
    plan_mode,
)

MLP = [(2048, 64), (2048,), (2048, 2048), (2048,), (10, 2048), (10,)]  # the slow-links benchmark's model
TOPOLOGY = plan.plan_topology("1x4")
MODEL = cost.CostModel(links=(cost.Link(alpha=200e-6, beta=8 / 100e6),))  # 100 Mbit/s
STEP = 0.06
PARAMS = sum(math.prod(s) for s in MLP)


def test_a_compressors_casts_are_priced_on_the_steps_path() -> None:
    # fp16's step measured 1.30 s where the plan, pricing no cast, said 1.19 s; the casts run
    # in the engine's cycle, in line with the reductions.
    fast = plan_mode(parse_mode("fp16"), MLP, 4, TOPOLOGY, MODEL, step=STEP, cast_rate=1e15)
    slow = plan_mode(parse_mode("fp16"), MLP, 4, TOPOLOGY, MODEL, step=STEP, cast_rate=1e9)
    flags = 2 * len(MLP)
    casts = 2 * (PARAMS + flags) * (4 + 2) / 1e9  # pack and unpack, each reading and writing
    assert slow.hook_compute_s == pytest.approx(casts)
    assert slow.step_s == pytest.approx(fast.step_s + casts, rel=1e-6)
    assert plan_mode(parse_mode("sync"), MLP, 4, TOPOLOGY, MODEL, step=STEP, cast_rate=1e9).hook_compute_s == 0
    # DiLoCo's fp16 pseudo-gradients pay the same two casts once a round.
    plain = plan_mode(parse_mode("diloco:20"), MLP, 4, TOPOLOGY, MODEL, step=STEP, cast_rate=1e9)
    half = plan_mode(parse_mode("diloco:20:fp16"), MLP, 4, TOPOLOGY, MODEL, step=STEP, cast_rate=1e9)
    assert half.hook_compute_s - plain.hook_compute_s == pytest.approx(2 * PARAMS * 6 / 1e9 / 20)


def test_the_engines_records_are_counted_in_the_bytes_per_step() -> None:
    # PowerSGD's rounds are small, so each engine cycle's gathered 4 KiB records are a third
    # of what crosses the link: measured 0.347 MB a step against 0.222 MB of allreduces.
    p = plan_mode(parse_mode("powersgd:4"), MLP, 4, TOPOLOGY, MODEL, step=STEP, flop_rate=1e10, memory_rate=5e9)
    assert cycle_port_bytes(TOPOLOGY) == 3 * codec.RECORD_BYTES
    assert p.cycles >= 4  # two buckets, two rounds each, and idle cycles in the gaps
    assert p.negotiation_bytes == pytest.approx(p.cycles * 3 * codec.RECORD_BYTES)
    assert p.link_bytes == pytest.approx(1.5 * p.wire_bytes + p.negotiation_bytes)
    assert p.negotiation_bytes > 0.15 * p.link_bytes
    sync = plan_mode(parse_mode("sync"), MLP, 4, TOPOLOGY, MODEL, step=STEP)
    assert sync.negotiation_bytes < 0.01 * sync.link_bytes  # one cycle per 17 MB bucket: nothing
    assert cycle_port_bytes(plan.plan_topology("4x1")) == 0  # one host: no port
    assert cycle_port_bytes(plan.plan_topology("1x32")) == 31 * 128  # 17 to 64 ranks: 128-byte records
    assert cycle_port_bytes(plan.plan_topology("1x65")) < 128  # the compact exchange: a few words


def test_idle_cycles_follow_the_engines_back_off() -> None:
    assert (IDLE_MIN, IDLE_MAX) == (engine_module._IDLE_MIN, engine_module._IDLE_MAX)
    assert [idle_cycles(g) for g in (0.0, 0.019, 0.021, 0.061, 0.141, 0.301, 0.621, 0.941)] == [0, 0, 1, 2, 3, 4, 5, 6]


def test_powersgd_traffic_counts_the_passes_it_runs_besides_its_products() -> None:
    weight = PowerSGD(rank=4, start_iter=0)
    t = weight.traffic([(2048, 2048)], 4)
    assert t.memory_bytes == 6 * 2048 * 2048 * 4  # the error added, the approximation taken off
    assert PowerSGD(rank=4, error_feedback=False).traffic([(2048, 2048)], 4).memory_bytes == 0
    assert weight.products([(2048, 2048), (2048,), (10, 2048), (4, 4)]) == [(2048, 2048, 4), (10, 2048, 4)]


def test_product_rate_times_the_three_products_at_the_weights_shapes() -> None:
    calls: list[tuple[tuple[int, ...], tuple[int, ...], bool]] = []

    def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        calls.append((a.shape, b.shape, not a.flags.c_contiguous))
        return np.matmul(a, b, out=out)

    rate = plan_rates.product_rate(PowerSGD(rank=2), [(64, 32), (64,)], matmul=matmul, repeats=3)
    assert rate > 0
    assert calls[:3] == [((64, 32), (32, 2), False), ((32, 64), (64, 2), True), ((64, 2), (2, 32), False)]
    assert len(calls) == 3 * 4  # a first touch and three timed repeats
    with pytest.raises(ValueError, match="no weight"):
        plan_rates.product_rate(PowerSGD(rank=4), [(10,), (3, 3)])
    assert plan_rates.pass_rate(1000, repeats=2) > 0 and plan_rates.cast_rate(1000, repeats=2) > 0


def test_plan_command_takes_the_cast_rate_and_prints_the_cycles(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    argv = ["--topology", "1x4", "--link", "100mbit:200us", "--model", "2048x64,2048,2048x2048,2048,10x2048,10",
            "--step-ms", "60", "--modes", "sync,fp16", "--cast-rate", "1e9", "--json", str(out)]
    assert plan.main(argv) == 0
    text = capsys.readouterr().out
    assert "casts at 1 GB/s" in text and "cycles" in text
    sync, half = json.loads(out.read_text())["modes"]
    assert sync["hook_compute_s"] == 0 and half["hook_compute_s"] == pytest.approx(2 * (PARAMS + 12) * 6 / 1e9)
    assert half["cycles"] >= 2 and half["negotiation_bytes"] == pytest.approx(half["cycles"] * 3 * codec.RECORD_BYTES)


def test_each_engine_round_pays_its_negotiation_before_its_allreduce() -> None:
    # PowerSGD's two rounds a bucket run one after the other, each in its own engine cycle,
    # whose records (3 x 4136 B here) cross the 100 Mbit/s link before the allreduce starts.
    per = cycle_seconds(TOPOLOGY, MODEL)
    assert per == pytest.approx(200e-6 + 3 * codec.RECORD_BYTES * 8 / 100e6)
    none = plan_mode(parse_mode("powersgd:4"), MLP, 4, TOPOLOGY, MODEL, step=STEP, cycle_s=0.0)
    slow = plan_mode(parse_mode("powersgd:4"), MLP, 4, TOPOLOGY, MODEL, step=STEP, cycle_s=0.01)
    # The last bucket's two rounds are on the step's path; the first bucket's travel during backward.
    assert slow.step_s == pytest.approx(none.step_s + 2 * 0.01)
    assert slow.comm_s == pytest.approx(none.comm_s + 4 * 0.01)
    assert plan_mode(parse_mode("powersgd:4"), MLP, 4, TOPOLOGY, MODEL, step=STEP).step_s == \
        pytest.approx(none.step_s + 2 * per)
