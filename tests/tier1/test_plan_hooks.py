"""``ddl plan --modes``: each mode priced from what its hook sends, on the plain plan's cost model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ddl.engine.compression import Compression
from ddl.engine.powersgd import PowerSGD
from ddl.reduction import cost
from ddl.reduction.step_plan import plan_step
from ddl.tools import plan
from ddl.tools.plan_hooks import ModeError, ModePlan, cycle_seconds, parse_mode, plan_mode
from ddl.tools.plan_models import gradient_shapes, resnet50_shapes

MLP = [(2048, 64), (2048,), (2048, 2048), (2048,), (10, 2048), (10,)]  # the slow-links benchmark's model
TOPOLOGY = plan.plan_topology("1x4")
MODEL = cost.CostModel(links=(cost.Link(alpha=200e-6, beta=8 / 100e6),))  # 100 Mbit/s
STEP = 0.06


def test_modes_parse_and_bad_ones_say_what_to_write() -> None:
    assert parse_mode("sync").hook is Compression.none and parse_mode("fp16").hook is Compression.fp16
    assert parse_mode("powersgd:4").hook == PowerSGD(rank=4, start_iter=0)
    d = parse_mode("diloco:20:powersgd-2+overlap")
    assert (d.kind, d.period, d.overlap, d.hook) == ("diloco", 20, 20, PowerSGD(rank=2, start_iter=0))
    assert parse_mode("localsgd:8").hook is Compression.none
    for bad, words in [("diloco", "give the period"), ("diloco:0", "give the period"), ("sync+overlap", "overlap is for"),
                       ("diloco:4:topk", "unknown hook"), ("adasum", "unknown mode"), ("diloco:4+fast", "suffix")]:
        with pytest.raises(ModeError, match=words):
            parse_mode(bad)


def test_sync_is_the_plain_plan() -> None:
    got = plan_mode(parse_mode("sync"), MLP, 4, TOPOLOGY, MODEL, step=STEP)
    planned = plan_step([math.prod(s) for s in MLP], 4, TOPOLOGY, MODEL, step=STEP, backward_fraction=2 / 3,
                        first_cap=1 << 20, cap=25 << 20)
    # Each reduction's engine cycle negotiates first (its records cross the link).
    assert got.step_s == pytest.approx(max(STEP, planned.end + len(planned.reductions) * cycle_seconds(TOPOLOGY, MODEL)))
    assert got.step_s > 10 * STEP  # the benchmark's premise: the plain step is mostly communication
    half = plan_mode(parse_mode("fp16"), MLP, 4, TOPOLOGY, MODEL, step=STEP)
    assert half.link_bytes - half.negotiation_bytes == pytest.approx((got.link_bytes - got.negotiation_bytes) / 2)


def test_powersgd_sends_what_its_hook_says_and_adds_its_work_to_the_step() -> None:
    sync = plan_mode(parse_mode("sync"), MLP, 4, TOPOLOGY, MODEL, step=STEP)
    p = plan_mode(parse_mode("powersgd:4"), MLP, 4, TOPOLOGY, MODEL, step=STEP, flop_rate=1e10, memory_rate=5e9)
    # Per bucket: P (n x 4 per weight, and the vectors and flags as they are), then Q (m x 4).
    first = 10 * 4 + 10 + 2 * 2  # the last layer alone in the 1 MiB first bucket: 10x2048 -> 10x4, Q 2048x4
    rest = 2048 * 4 + 2048 + 2048 * 4 + 2048 + 2 * 4
    q = 2048 * 4 + 2048 * 4 + 64 * 4
    assert p.wire_bytes == 4 * (first + rest + q)
    assert p.link_bytes == pytest.approx(1.5 * p.wire_bytes + p.negotiation_bytes)  # 2(h-1)/h on 4 hosts
    assert p.link_bytes < sync.link_bytes / 20
    assert p.hook_compute_s > 0 and STEP + p.hook_compute_s <= p.step_s < sync.step_s / 5


def test_local_sgd_and_diloco_spread_one_round_over_the_period_and_overlap_hides_it() -> None:
    sync = plan_mode(parse_mode("sync"), MLP, 4, TOPOLOGY, MODEL, step=STEP)
    diloco = plan_mode(parse_mode("diloco:20"), MLP, 4, TOPOLOGY, MODEL, step=STEP)
    params = sum(math.prod(s) for s in MLP)
    assert diloco.wire_bytes == pytest.approx(4 * params / 20)
    def payload(p: ModePlan) -> float:
        return p.link_bytes - p.negotiation_bytes  # the allreduces' bytes, the engine's records aside

    assert payload(diloco) <= payload(sync) / 20
    assert payload(plan_mode(parse_mode("diloco:20:fp16"), MLP, 4, TOPOLOGY, MODEL, step=STEP)) == \
        pytest.approx(payload(diloco) / 2)
    hidden = plan_mode(parse_mode("diloco:20+overlap"), MLP, 4, TOPOLOGY, MODEL, step=STEP)
    assert hidden.comm_s == diloco.comm_s and hidden.step_s < diloco.step_s
    # The round (2.1 s at 100 Mbit/s) travels behind 20 steps of 60 ms: 1.2 s of it is hidden.
    round_s = 20 * diloco.comm_s
    assert hidden.step_s == pytest.approx(STEP + diloco.hook_compute_s + (round_s - 20 * STEP) / 20)
    local = plan_mode(parse_mode("localsgd:20"), MLP, 4, TOPOLOGY, MODEL, step=STEP)
    assert payload(local) == payload(diloco) and local.step_s < diloco.step_s  # no outer optimizer's passes


def test_plan_command_prints_the_modes_side_by_side(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    argv = ["--topology", "1x4", "--link", "100mbit:200us", "--model", "2048x64,2048,2048x2048,2048,10x2048,10",
            "--step-ms", "60", "--modes", "sync,powersgd:4,diloco:20:fp16+overlap", "--json", str(out)]
    assert plan.main(argv) == 0
    text = capsys.readouterr().out
    assert "modes (average step" in text and "diloco:20:fp16+overlap" in text
    rows = json.loads(out.read_text())["modes"]
    assert [r["label"] for r in rows] == ["sync", "powersgd:4", "diloco:20:fp16+overlap"]
    assert rows[0]["step_s"] > rows[1]["step_s"] > rows[2]["step_s"]
    assert plan.main(argv[:6] + ["--modes", "sync"]) == 2
    assert "--modes needs --model and --step-ms" in capsys.readouterr().err
    assert plan.main(argv[:-4] + ["--modes", "diloco:x"]) == 2
    assert "give the period" in capsys.readouterr().err


def test_model_shapes_for_the_hooks() -> None:
    assert gradient_shapes("2048x64,2048")[0] == [(2048, 64), (2048,)]
    assert sum(math.prod(s) for s in resnet50_shapes()) == 25_557_032
    assert gradient_shapes("resnet50")[0][0] == (64, 3, 7, 7)
