"""ddl plan: unit parsing, model sources, pricing against the multi-ring formula, step model."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

from ddl.base.config import Config
from ddl.engine.collectives import Collectives
from ddl.reduction import calibration, cost, step_plan
from ddl.reduction.buckets import BUCKET_BYTES, FIRST_BUCKET_BYTES, FusionItem, fuse
from ddl.reduction.probes import DEFAULT_PLAN, Samples
from ddl.tools import plan
from ddl.tools.plan_models import (
    ModelSpecError,
    gradient_sizes,
    onnx_sizes,
    parse_sizes,
    resnet50_sizes,
)


@pytest.mark.parametrize(("text", "rate"), [("1gbit", 125e6), ("100Gbit", 12.5e9), ("100Gb/s", 12.5e9),
                                            ("10gbps", 1.25e9), ("12.5GB/s", 12.5e9), ("800MB/s", 800e6),
                                            ("1.2e9", 1.2e9)])
def test_bandwidth_units(text: str, rate: float) -> None:
    assert plan.parse_bandwidth(text) == pytest.approx(rate)


@pytest.mark.parametrize(("text", "seconds"), [("3us", 3e-6), ("0.5ms", 5e-4), ("2e-6", 2e-6), ("1s", 1.0)])
def test_latency_units(text: str, seconds: float) -> None:
    assert plan.parse_latency(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["fast", "10 furlongs", "0gbit", "-1GB/s"])
def test_bad_bandwidth_says_what_to_write(bad: str) -> None:
    with pytest.raises(plan.PlanError, match="bandwidth"):
        plan.parse_bandwidth(bad)


def test_resnet50_has_its_published_parameter_count() -> None:
    sizes = resnet50_sizes()
    assert sum(sizes) == 25_557_032 and len(sizes) == 161  # torchvision's resnet50()


def test_sizes_inline_and_errors() -> None:
    assert parse_sizes("1000, 2048x1000 3x3x64x64") == [1000, 2_048_000, 36_864]
    for bad in ("", "abc", "0", "4x0"):
        with pytest.raises(ModelSpecError):
            parse_sizes(bad)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes | int) -> bytes:
    if isinstance(payload, int):
        return _varint(number << 3) + _varint(payload)
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _tensor(name: str, dims: list[int], dtype: int, *, packed: bool = False) -> bytes:
    body = _field(1, b"".join(_varint(d) for d in dims)) if packed else b"".join(_field(1, d) for d in dims)
    return body + _field(2, dtype) + _field(8, name.encode())


def test_onnx_initializers_are_read_without_the_onnx_package(tmp_path: Path) -> None:
    graph = (_field(1, b"node-bytes-skipped") +
             _field(5, _tensor("conv.weight", [64, 3, 7, 7], 1)) +
             _field(5, _tensor("bn.running_mean", [64], 1)) +        # a buffer, not a gradient
             _field(5, _tensor("shape", [2], 7)) +                    # int64: not trainable
             _field(5, _tensor("fc.weight", [10, 300], 10, packed=True)))  # float16, packed dims
    model = _field(1, 8) + _field(7, graph)  # ir_version, graph
    path = tmp_path / "m.onnx"
    path.write_bytes(model)
    assert onnx_sizes(path) == [64 * 3 * 49, 3000]
    assert gradient_sizes(str(path))[0] == [9408, 3000]
    with pytest.raises(ModelSpecError, match="no graph"):
        (tmp_path / "empty.onnx").write_bytes(_field(1, 8))
        onnx_sizes(tmp_path / "empty.onnx")


def test_multiring_price_is_the_design_formula() -> None:
    # T = sum_i 2(d_i-1) a_i + 2(d_i-1)/D_i N b_i x (ranks sharing the port: d0 on dim 1).
    topo = plan.plan_topology("4x16")
    links = (cost.Link(5e-6, 1 / 20e9), cost.Link(3e-6, 1 / 12.5e9))
    model = cost.CostModel(links=links, gamma=1e-20, segment_bytes=0)  # no reduce cost
    n = 4 * 16 * 4096 * 4
    want = (2 * 3 * 5e-6 + 2 * 3 / 4 * n / 20e9) + (2 * 15 * 3e-6 + 2 * 15 / 64 * n * 4 / 12.5e9)
    assert plan.price("multiring", topo, n // 4, 4, model) == pytest.approx(want, rel=1e-6)
    # The outer part equals the link bound: 2(H-1)/H x N through each host's port.
    outer = 2 * 15 / 64 * n * 4 / 12.5e9
    assert plan.link_bound(topo, n, model) == pytest.approx(outer)


def test_buckets_match_ddl_torch() -> None:
    """``ddl plan``'s buckets for a model are the buffers ddl.torch's DistributedOptimizer
    allocates for it (same members, same bytes: gradients and presence flags), with the
    same default caps, in the first step and after it re-plans in the observed order (world
    of one here; tests/tier2/test_plan_run.py compares a 2-rank run, algorithms included)."""
    torch = pytest.importorskip("torch")
    dt = pytest.importorskip("ddl.torch")
    dt.init()
    rng = random.Random(3)
    for trial in range(10):
        numels = [rng.choice([1, 100, 10_000, 1_000_000]) for _ in range(rng.randint(2, 40))]
        params = [torch.nn.Parameter(torch.zeros(n)) for n in numels]
        opt = dt.DistributedOptimizer(torch.optim.SGD(params, lr=0.1),
                                      named_parameters=[(f"p{i}", p) for i, p in enumerate(params)])
        order = None
        for step in range(2):
            built = opt._reducer.buckets
            runs = plan.step_schedule(numels, 4, plan.plan_topology("2"), cost.CostModel(links=(cost.SHARED_MEMORY,)),
                                      step=0.1, backward_fraction=0.5, first_cap=FIRST_BUCKET_BYTES,
                                      cap=BUCKET_BYTES, order=order)
            index = {p: i for i, p in enumerate(params)}
            assert [r.members for r in runs] == [tuple(index[p] for p in b.params) for b in built], (trial, step)
            assert [r.nbytes for r in runs] == [b.buffer.numel() * 4 for b in built]
            # The gradients land in an order of their own (not the parameters'): ddl.torch re-plans in it.
            landing = sorted(range(len(params)), key=lambda i: (i * 7919) % len(params))
            opt.zero_grad()
            for i in landing:
                params[i].grad = torch.ones(numels[i])
                opt._reducer._on_grad(params[i])  # what backward's post-accumulate hook calls
            opt.step()
            order = opt.gradient_order()
        assert order == landing


def args_for(*argv: str) -> object:
    return plan.parser().parse_args(list(argv))


def test_resnet50_on_ddls_cluster_plans_every_bucket(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    argv = ["--topology", "4x64", "--link", "20GB/s:5us", "--link", "100gbit:3us", "--reduce-rate", "50GB/s",
            "--model", "resnet50", "--step-ms", "200", "--json", str(out)]
    assert plan.main(argv) == 0
    text = capsys.readouterr().out
    assert "256 ranks, 64 hosts" in text and "25.56 M parameters" in text and "scaling efficiency" in text
    rec = json.loads(out.read_text())
    step = rec["step"]
    assert sum(b["tensors"] for b in step["buckets"]) == 161
    assert sum(b["nbytes"] for b in step["buckets"]) == (25_557_032 + 2 * 161) * 4  # with ddl.torch's flags
    assert step["buckets"][0]["nbytes"] <= (1 << 20) + 2 * 4
    ends = [b["end"] for b in step["buckets"]]
    assert ends == sorted(ends) and all(b["start"] >= b["ready"] for b in step["buckets"])
    assert step["step_s"] >= step["compute_s"] and 0.5 < step["efficiency"] <= 1.0
    assert step["efficiency_no_overlap"] <= step["efficiency"]
    # A slower network can only lower the efficiency.
    slow = plan.make_plan(args_for(*argv[:4], "--link", "10gbit:3us", *argv[6:-2]))[1]["step"]
    assert slow["efficiency"] < step["efficiency"]


def test_pricing_1024_ranks_is_fast() -> None:
    model = cost.CostModel(links=(cost.Link(5e-6, 1 / 20e9), cost.Link(3e-6, 1 / 12.5e9)), segment_bytes=1 << 20)
    for spec in ("1024", "4x256", "4x16x16"):
        topo = plan.plan_topology(spec)
        start = time.perf_counter()
        for alg in plan.ALGORITHMS:
            assert plan.price(alg, topo, 25_557_032 + len(spec), 4, model) > 0
        assert time.perf_counter() - start < 5, spec  # 26 s for the flat ring before pricing one rank


def test_calibration_file_feeds_the_plan(tmp_path: Path) -> None:
    topo = plan.plan_topology("2x3")
    measured = cost.CostModel(links=(cost.Link(20e-6, 1 / 3e9), cost.Link(100e-6, 1 / 0.12e9)), gamma=1e-10,
                              step_overhead=3e-5, native_points=((8, 1e-3), (1 << 20, 20e-3)))
    path = tmp_path / "cal.json"
    calibration.save(path, calibration.Calibration(measured, "measured"), calibration.identity(topo, ["a"] * 6))
    same, _ = plan.model_from_calibration(path, topo, segment_bytes=1 << 20)
    assert same.links == measured.links and same.native_points == measured.native_points
    other, notes = plan.model_from_calibration(path, plan.plan_topology("4x64"), segment_bytes=1 << 20)
    assert other.native_points == () and "dropped" in notes[-1]
    assert plan.price("mpi", topo, 1 << 18, 4, same) == pytest.approx(20e-3)


@pytest.mark.parametrize(("argv", "words"), [
    (["--topology", "4x0", "--link", "1gbit:1us"], "zero dimension"),
    (["--topology", "4x2"], "--link"),
    (["--topology", "4x2", "--link", "1gbit"], "BANDWIDTH:LATENCY"),
    (["--topology", "4x2", "--link", "1gbit:1us", "--calibration", "x.json"], "not both"),
    (["--topology", "4x2", "--calibration", "/nonexistent.json"], "cannot read calibration"),
    (["--topology", "4x2", "--link", "1gbit:1us", "--model", "12,x7"], "gradient size"),
    (["--topology", "4x2", "--link", "1gbit:1us", "--model", "no_such_mod:f"], "cannot load torch module"),
    (["--topology", "4x2", "--link", "1gbit:1us", "--step-ms", "100"], "--step-ms needs --model"),
])
def test_bad_input_is_a_clear_error(argv: list[str], words: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert plan.main(argv) == 2
    assert words in capsys.readouterr().err


@pytest.mark.parametrize(("option", "value", "words"), [
    ("--itemsize", "0", "at least 1, got 0"),  # was a ZeroDivisionError's traceback
    ("--segment-bytes", "0", "at least 1, got 0"),  # the rest gave a plan as if they meant something
    ("--backward-fraction", "2", "greater than 0 and at most 1, got 2"),
    ("--fusion-threshold", "-1", "at least 0, got -1"),
    ("--cycle-ms", "nan", "a finite number, got nan"),
    ("--step-ms", "-5", "greater than 0, got -5"),
    ("--bucket-mb", "0", "greater than 0, got 0"),
])
def test_a_number_out_of_range_is_refused_by_name(option: str, value: str, words: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--topology", "2", "--link", "10GB/s:5us", "--model", "1000,2048x100", "--step-ms", "50", option, value]
    with pytest.raises(SystemExit) as stop:
        plan.main(argv)
    assert stop.value.code == 2
    assert f"argument {option}: takes" in (err := capsys.readouterr().err) and words in err, err


def test_unmeasured_mpi_is_priced_as_rabenseifner_for_auto_too() -> None:
    topo = plan.plan_topology("4x8")
    bare = cost.CostModel(links=(cost.Link(5e-6, 1 / 20e9), cost.Link(3e-6, 1 / 12.5e9)), segment_bytes=0)
    model = plan.with_native_estimate(bare, topo)
    n = 1 << 22  # one of the points: exact, and what choose() sees
    assert cost.native_time(topo, n * 4, model) == pytest.approx(cost.predict("halving_doubling", topo, n, 4, bare))
    assert plan.price("auto", topo, n, 4, model) == min(plan.price(a, topo, n, 4, model) for a in plan.ALGORITHMS)


def test_calibration_fits_beta_on_the_messages_the_executor_sends() -> None:
    # 1 MiB messages at 0.15 GB/s, 4 MiB ones at 0.3 GB/s: with 1 MiB segments the
    # executor only ever sends the former, so that is the rate to price.
    rate = {8: 1e12, 64 << 10: 0.15e9, 1 << 20: 0.15e9, 4 << 20: 0.3e9}
    dim = tuple(2e-4 + n / rate[n] for n, _ in DEFAULT_PLAN.link)
    samples = Samples(links=(dim,), gamma=1e-10, step=3e-4, native=(1e-3,) * len(DEFAULT_PLAN.native))
    seg = calibration.fit(samples, segment_bytes=1 << 20)
    whole = calibration.fit(samples, segment_bytes=0)
    assert 1 / seg.links[0].beta == pytest.approx(0.15e9, rel=1e-3)
    assert 1 / whole.links[0].beta > 0.25e9  # the 4 MiB point pulls an unsegmented fit up


def test_calibration_off_prices_with_the_runtimes_fixed_model() -> None:
    """``ddl plan --calibration off`` builds the very model ``init`` uses under DDL_CALIBRATION=off:
    MPI's allreduce by its closed form, not the estimate a measured model extends to."""
    from ddl.testing import run_ranks

    topo = plan.plan_topology("2x2")
    runtime = run_ranks(4, lambda comm: calibration.calibrate(comm, plan.build_topology(comm.rank, ["a", "a", "b", "b"]),
                                                               ["a", "a", "b", "b"], "off", segment_bytes=1 << 20).model)
    off, notes = plan.build_cost_model(args_for("--topology", "2x2", "--calibration", "off"), topo)
    assert all(m == off for m in runtime) and off.native_points == () and "DDL_CALIBRATION=off" in notes[0]
    linked, _ = plan.build_cost_model(args_for("--topology", "2x2", "--link", "20GB/s:5us", "--link", "1gbit:30us"), topo)
    assert linked.native_points  # a measured-like model: MPI estimated where nobody measured it
    n = 1 << 16
    assert plan.price("mpi", topo, n, 4, off) == pytest.approx(cost.native_time(topo, n * 4, off))
    with pytest.raises(plan.PlanError, match="fixed constants"):
        plan.build_cost_model(args_for("--topology", "2x2", "--calibration", "off", "--reduce-rate", "1GB/s"), topo)


def test_the_plan_fuses_small_buckets_ready_together_as_the_engine_does() -> None:
    """Buckets under 1 MiB that are ready when the engine is free share one buffer (up to the
    fusion threshold) and one algorithm choice; large ones run alone; no fusion at threshold 0."""
    topo = plan.plan_topology("4")
    model = cost.default_model(topo)
    numels = [300_000, 1000, 1000, 1000, 1000]  # last first: four tiny buckets, then one of 1.2 MB
    fused = step_plan.plan_step(numels, 4, topo, model, step=1e-6, backward_fraction=1.0, first_cap=4096, cap=4096)
    assert [b.members for b in fused.buckets] == [(4,), (3,), (2,), (1,), (0,)]
    # the first tiny bucket runs at once; the others land while it runs and share the next cycle
    assert [r.buckets for r in fused.reductions] == [(0,), (1, 2, 3), (4,)]
    assert fused.reductions[1].count == 3 * (1000 + 2)
    assert fused.reductions[1].algorithm == cost.choose(topo, 3 * 1002, 4, model)
    alone = step_plan.plan_step(numels, 4, topo, model, step=1e-6, backward_fraction=1.0, first_cap=4096, cap=4096,
                                fusion_threshold=0)
    assert [r.buckets for r in alone.reductions] == [(0,), (1,), (2,), (3,), (4,)]


def test_the_engine_fuses_and_chooses_as_the_plans_rule_says(monkeypatch: pytest.MonkeyPatch) -> None:
    """One batch of allreduces, as a cycle finds them: the buffers the engine reduces, and the
    algorithm ``auto`` picks for each, are those :func:`fuse` and :func:`cost.choose` give."""
    import numpy as np

    import ddl
    from ddl.engine.context import Context
    from ddl.testing import run_engines

    sizes = [300, 70_000, 300_000, 50, 262_144, 20]  # elements, float32; 262144 x 4 B = 1 MiB: solo
    seen: list[tuple[int, int, str]] = []
    real = Context.allreduce_flat

    def spy(self: Context, buf: np.ndarray, op: object, algorithm: str, *args: object, **kwargs: object) -> None:
        seen.append((self.topology.rank, buf.size, algorithm))
        real(self, buf, op, algorithm, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Context, "allreduce_flat", spy)

    def fn(c: Collectives) -> cost.CostModel:
        arrays = [np.ones(n, np.float32) for n in sizes]
        with c.engine._baton:  # no cycle until all are queued: they arrive as one batch
            hs = [c.allreduce_async(a, op=ddl.Sum, inplace=True, name=f"t{i}") for i, a in enumerate(arrays)]
        for h in hs:
            h.wait()
        return c.engine.ctx.model

    models = run_engines(2, fn, config=Config(fusion_threshold=281_000, segment_bytes=1 << 20))
    groups = fuse([FusionItem("f32", n * 4, True) for n in sizes], 281_000)
    assert groups == [[0], [1, 3, 5], [2], [4]]  # t0 + t1 would pass the threshold; t2 and t4 are >= 1 MiB
    topo = plan.plan_topology("2")
    want = [(sum(sizes[i] for i in g), cost.choose(topo, sum(sizes[i] for i in g), 4, models[0])) for g in groups]
    assert sorted((n, a) for r, n, a in seen if r == 0) == sorted(want)
