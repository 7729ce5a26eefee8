"""ddl plan: unit parsing, model sources, pricing against the multi-ring formula, step model."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

from ddl.reduction import calibration, cost
from ddl.reduction.buckets import BUCKET_BYTES, FIRST_BUCKET_BYTES
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
    """``ddl plan``'s buckets for a model are the buckets ddl.torch's DistributedOptimizer
    builds for it (same members, same gradient bytes), with the same default caps."""
    torch = pytest.importorskip("torch")
    dt = pytest.importorskip("ddl.torch")
    dt.init()
    rng = random.Random(3)
    for _ in range(10):
        numels = [rng.choice([1, 100, 10_000, 1_000_000]) for _ in range(rng.randint(1, 40))]
        params = [torch.nn.Parameter(torch.zeros(n)) for n in numels]
        opt = dt.DistributedOptimizer(torch.optim.SGD(params, lr=0.1),
                                      named_parameters=[(f"p{i}", p) for i, p in enumerate(params)])
        built = [b.params for b in opt._reducer.buckets]
        runs = plan.step_schedule(numels, 4, plan.plan_topology("2"), cost.CostModel(links=(cost.SHARED_MEMORY,)),
                                  step=0.1, backward_fraction=0.5, first_cap=FIRST_BUCKET_BYTES,
                                  cap=BUCKET_BYTES)
        assert [r.tensors for r in runs] == [len(b) for b in built], (numels, [r.tensors for r in runs])
        assert [r.nbytes for r in runs] == [sum(p.numel() * 4 for p in b) for b in built]


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
    assert sum(b["nbytes"] for b in step["buckets"]) == 25_557_032 * 4
    assert step["buckets"][0]["nbytes"] <= 1 << 20
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
