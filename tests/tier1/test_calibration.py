"""The measured cost model behind ``auto``: fit, interpolation, agreement across ranks, files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddl.base.topology import build_topology
from ddl.reduction import calibration, cost
from ddl.reduction.algorithms import SCHEDULED
from ddl.reduction.probes import DEFAULT_PLAN, ProbePlan, Samples
from ddl.testing import FakeComm, run_ranks

# Small probes keep the fake-comm runs fast; the code path is the one init uses.
PLAN = ProbePlan(link=((8, 3), (4096, 3), (65536, 2)), native=((8, 3), (4096, 3), (65536, 2)))


def test_fit_link_recovers_alpha_and_beta() -> None:
    alpha, beta = 20e-6, 1 / 3e9
    points = [(n, alpha + n * beta) for n in (8, 65536, 1 << 20)]
    link = calibration.fit_link(points)
    assert link.alpha == pytest.approx(alpha + 8 * beta)
    assert link.beta == pytest.approx(beta, rel=1e-9)


def test_fit_link_never_goes_negative() -> None:
    link = calibration.fit_link([(8, 5e-6), (65536, 4e-6), (1 << 20, 3e-6)])
    assert link.alpha > 0 and link.beta > 0


def test_fit_reads_the_named_samples() -> None:
    dim0 = tuple(1e-5 + n / 2e9 for n, _ in DEFAULT_PLAN.link)
    dim1 = tuple(5e-5 + n / 1e9 for n, _ in DEFAULT_PLAN.link)
    native = tuple(float(i + 1) * 1e-4 for i in range(len(DEFAULT_PLAN.native)))
    # The step probe's time per step includes alpha; the model keeps what is beyond it.
    per_step = dim0[0] + 3e-6
    samples = Samples(links=(dim0, dim1), gamma=2e-10, step=per_step, native=native)
    assert samples.from_vector(samples.vector()) == samples  # the one vector ranks MAX-reduce
    model = calibration.fit(samples, segment_bytes=4096, flows=4)
    assert len(model.links) == 2
    assert model.links[0].beta == pytest.approx(1 / 2e9)
    # The dim-1 probe ran with 4 flows through one port; the model stores one flow's share.
    assert model.links[1].beta == pytest.approx(1 / 1e9 / 4)
    assert model.gamma == 2e-10 and model.step_overhead == pytest.approx(3e-6) and model.segment_bytes == 4096
    assert [n for n, _ in model.native_points] == [n for n, _ in DEFAULT_PLAN.native]
    assert tuple(t for _, t in model.native_points) == native


def test_interpolate_between_and_beyond_points() -> None:
    pts = ((8, 10e-6), (4096, 20e-6), (1 << 20, 1e-3))
    assert cost.interpolate(pts, 1) == 10e-6
    assert cost.interpolate(pts, 2052) == pytest.approx(15e-6, rel=1e-3)
    slope = (1e-3 - 20e-6) / ((1 << 20) - 4096)
    assert cost.interpolate(pts, 1 << 22) == pytest.approx(1e-3 + slope * ((1 << 22) - (1 << 20)))
    sizes = [1, 100, 5000, 1 << 18, 1 << 24]
    times = [cost.interpolate(pts, n) for n in sizes]
    assert times == sorted(times)


def test_measured_native_cost_drives_the_choice() -> None:
    topo = build_topology(0, ["a"] * 4)
    link = cost.Link(alpha=50e-6, beta=1 / 2e9)
    # MPI's own allreduce: fast when small, slow per byte when large (as measured here).
    native = ((8, 10e-6), (4096, 12e-6), (1 << 20, 4e-3))
    model = cost.CostModel(links=(link,), gamma=1e-10, native_points=native)
    assert cost.choose(topo, 1024, 4, model) == "mpi"
    assert cost.choose(topo, 1 << 22, 4, model) in SCHEDULED
    slow_native = cost.CostModel(links=(link,), gamma=1e-10, native_points=((8, 1.0), (4096, 1.0)))
    assert cost.choose(topo, 1024, 4, slow_native) in SCHEDULED


def test_segments_and_step_overhead_are_priced() -> None:
    topo = build_topology(0, ["a"] * 4)
    base = cost.CostModel(links=(cost.Link(alpha=10e-6, beta=1e-9),), gamma=0.0)
    n = 1 << 20
    plain = cost.predict("ring", topo, n, 4, base)
    segmented = cost.predict("ring", topo, n, 4, cost.CostModel(links=base.links, gamma=0.0, segment_bytes=1 << 16))
    # ring: 6 steps of 1 MiB each, cut into 16 pieces: 15 extra alphas a step.
    assert segmented - plain == pytest.approx(6 * 15 * 10e-6)
    overhead = cost.predict("ring", topo, n, 4, cost.CostModel(links=base.links, gamma=0.0, step_overhead=5e-6))
    assert overhead - plain == pytest.approx(6 * 5e-6)


@pytest.mark.parametrize(("size", "spec"), [(2, None), (4, "2x2"), (3, None)])
def test_every_rank_gets_the_same_model_and_choices(size: int, spec: str | None) -> None:
    def body(comm: FakeComm) -> tuple[cost.CostModel, list[str]]:
        topo = build_topology(comm.rank, ["h"] * size, spec)
        cal = calibration.measure(comm, topo, segment_bytes=1 << 20, plan=PLAN)
        assert cal.source == "measured" and cal.seconds > 0
        picks = [cost.choose(topo, n, 4, cal.model) for n in (1, 1 << 10, 1 << 16, 1 << 22)]
        return cal.model, picks

    out = run_ranks(size, body)
    models = [m for m, _ in out]
    # Thread timings differ per rank; the MAX reduction makes the models identical.
    assert all(m == models[0] for m in models), models
    assert all(p == out[0][1] for _, p in out)
    assert len(models[0].links) == (2 if spec == "2x2" else 1)
    assert all(lk.alpha > 0 and lk.beta > 0 for lk in models[0].links)


def _calibrate_all(size: int, setting: str | None, hosts: list[str]) -> list[calibration.Calibration]:
    def body(comm: FakeComm) -> calibration.Calibration:
        topo = build_topology(comm.rank, hosts)
        return calibration.calibrate(comm, topo, hosts, setting, segment_bytes=1 << 20, plan=PLAN)

    return run_ranks(size, body)


def test_calibration_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "calib.json"
    first = _calibrate_all(2, str(path), ["h", "h"])
    assert all(c.source == "measured" for c in first)
    data = json.loads(path.read_text())
    assert data["world_size"] == 2 and data["hosts"] == ["h", "h"] and data["dims"] == [2]
    second = _calibrate_all(2, str(path), ["h", "h"])
    assert all(c.source.startswith("loaded from") for c in second)
    assert all(c.model == first[0].model for c in second)


def test_calibration_file_for_another_job_is_measured_again(tmp_path: Path) -> None:
    path = tmp_path / "calib.json"
    _calibrate_all(2, str(path), ["h", "h"])
    again = _calibrate_all(2, str(path), ["x", "y"])  # other hosts
    assert all(c.source == "measured" for c in again)
    assert json.loads(path.read_text())["hosts"] == ["x", "y"]
    assert all(c.source == "measured" for c in _calibrate_all(3, str(path), ["x", "y", "z"]))


def test_corrupt_calibration_file_is_replaced(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "calib.json"
    path.write_text("{not json")
    out = _calibrate_all(2, str(path), ["h", "h"])
    assert all(c.source == "measured" for c in out)
    assert "ignoring calibration file" in capsys.readouterr().err
    assert json.loads(path.read_text())["format"] == calibration.FORMAT


def test_calibration_off_and_single_rank_keep_the_fixed_model() -> None:
    out = _calibrate_all(2, "off", ["h", "h"])
    topo = build_topology(0, ["h", "h"])
    assert all(c.source == "fixed" and c.model.links == cost.default_model(topo).links for c in out)
    assert all(c.model.native_points == () for c in out)
    one = _calibrate_all(1, None, ["h"])
    assert one[0].source == "fixed"
