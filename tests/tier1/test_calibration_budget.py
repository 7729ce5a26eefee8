"""Calibration's cost at many ranks: repeats cut to a budget, agreed by every rank."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest

from ddl.reduction import calibration, probes
from ddl.reduction.probes import ProbePlan
from ddl.testing import FakeComm, run_ranks


def test_ranks_agree_on_repeats_from_the_slowest_warm_up() -> None:
    """Rank 1's probe is slow: both ranks cut the repeats alike (a rank that ran one more
    collective probe than another would hang MPI)."""

    def fn(comm: FakeComm) -> int:
        calls = [0]

        def probe() -> None:
            calls[0] += 1
            time.sleep(0.02 if comm.rank == 1 else 0.0)

        probes.median_time(probe, 15, comm, 0.05)
        return calls[0]

    assert run_ranks(2, fn) == [1 + 2, 1 + 2]  # warm-up + int(0.05 / 0.02) repeats


def test_a_probe_over_budget_is_its_warm_up_alone() -> None:

    def fn(comm: FakeComm) -> tuple[int, float]:
        calls = [0]

        def probe() -> None:
            calls[0] += 1
            time.sleep(0.01)

        seconds = probes.median_time(probe, 15, comm, 0.001)
        return calls[0], seconds

    for calls, seconds in run_ranks(3, fn):
        assert calls == 1 and seconds >= 0.01


def test_a_link_probe_slow_only_in_its_warm_up_is_timed_once_more() -> None:
    """A pair's first large message pays the connection's ramp-up: a link probe whose warm-up
    is over budget but within ``link_warm_cap`` budgets is timed once after it, and that
    run is the sample; past the cap the warm-up is the sample, as before."""
    from ddl.base.topology import build_topology

    def fn(comm: FakeComm, warm: float) -> tuple[int, float]:
        real, seen = comm.sendrecv, [0]

        def ramp(*args: object) -> None:
            seen[0] += 1
            time.sleep(warm if seen[0] == 2 else 0.01)  # (call 1 connects)
            real(*args)  # type: ignore[arg-type]

        comm.sendrecv = ramp  # type: ignore[method-assign]
        topo = build_topology(comm.rank, ["a", "b"])
        [sample] = probes._link_samples(comm, topo, 0, ProbePlan(link=((1 << 20, 8),), budget=0.005))
        return seen[0], sample

    for calls, sample in run_ranks(2, lambda c: fn(c, 0.015)):  # 3 budgets: timed once more
        assert calls == 3 and 0.01 <= sample < 0.015, sample
    for calls, sample in run_ranks(2, lambda c: fn(c, 0.03)):  # 6 budgets: the warm-up is the sample
        assert calls == 2 and sample >= 0.03


def test_native_probes_predicted_too_slow_are_skipped_and_priced_from_the_links() -> None:
    sizes: list[list[int]] = [[], []]

    def fn(comm: FakeComm) -> list[float]:
        real = comm.allreduce_native

        def spy(buf: np.ndarray, op: object) -> None:
            if buf.dtype == np.float32:
                sizes[comm.rank].append(buf.nbytes)
            real(buf, op)  # type: ignore[arg-type]

        comm.allreduce_native = spy  # type: ignore[method-assign]
        plan = ProbePlan(native=((8, 3), (4096, 3), (1 << 20, 2), (1 << 22, 2)), skip_beyond=1e-9, budget=60.0)
        return probes._native_samples(comm, plan)

    results = run_ranks(2, fn)
    # Two sizes are always run (one point is a latency, not a rate); the rest are skipped,
    # not extrapolated from them: warm-up + 3 repeats of each of the first two.
    assert sizes == [[8] * 5 + [4096] * 4] * 2  # the first 8 bytes: a connecting call
    assert all(r[2:] == [probes.SKIPPED] * 2 and min(r[:2]) > 0 for r in results)
    assert results[0] == results[1]


def test_a_pairs_first_message_is_not_taken_for_its_latency() -> None:
    """MPI connects a pair at its first message (9 ms between emulated hosts): the link
    probes connect first, so the 8-byte latency is a warm message's."""
    from ddl.base.topology import build_topology

    def fn(comm: FakeComm) -> list[float]:
        real, seen = comm.sendrecv, [0]

        def first_one_slow(*args: object) -> None:
            seen[0] += 1
            if seen[0] == 1:
                time.sleep(0.05)  # over the probe budget: a warm-up this slow would be the sample
            real(*args)  # type: ignore[arg-type]

        comm.sendrecv = first_one_slow  # type: ignore[method-assign]
        topo = build_topology(comm.rank, ["a", "b"])
        return probes._link_samples(comm, topo, 0, ProbePlan(link=((8, 3), (4096, 2)), budget=0.03))

    for latency, _ in run_ranks(2, fn):
        assert latency < 0.02, latency


def test_mpi_allreduce_past_the_last_measured_size_grows_as_the_link_model() -> None:
    from ddl.base.topology import build_topology
    from ddl.reduction import cost
    topo = build_topology(0, ["a", "a", "b", "b"])
    model = cost.CostModel(links=(cost.Link(1e-5, 1e-9), cost.Link(1e-4, 1 / 25e6)), native_points=((8, 0.04),
                                                                                                    (4096, 0.043)))
    extended = cost.extend_native(model, topo)
    assert extended.native_points[:2] == model.native_points  # measured points stay as measured
    hd = [cost.predict("halving_doubling", topo, n // 4, 4, model) for n in (4096, 16 << 20)]
    # Anchored at the last measured point, plus what the same algorithm's full price adds:
    # 16 MiB over a 25 MB/s port costs about a second more, not 16 MiB / 4 KiB x 43 ms.
    assert cost.native_time(topo, 16 << 20, extended) == pytest.approx(0.043 + hd[1] - hd[0])
    assert 0.5 < cost.native_time(topo, 16 << 20, extended) < 5
    assert extended.native_measured == 4096 and cost.extend_native(extended, topo) == extended
    # auto bets on MPI's own allreduce only where it was measured, however cheap the estimate.
    cheap = dataclasses.replace(extended, native_points=tuple((n, t / 1e6) for n, t in extended.native_points))
    assert cost.choose(topo, 1024, 4, cheap) == "mpi" and cost.choose(topo, 1 << 22, 4, cheap) != "mpi"
    assert cost.choose(topo, 1 << 22, 4, dataclasses.replace(cheap, native_measured=0)) == "mpi"
    assert cost.CostModel.from_json(extended.to_json(), segment_bytes=0).native_measured == 4096
    bare = cost.extend_native(dataclasses.replace(model, native_points=()), topo)  # nothing measured: the estimate
    assert cost.native_time(topo, 1 << 20, bare) == pytest.approx(cost.native_estimate(topo, 1 << 20, model))


# -- per-algorithm corrections from whole-schedule runs ------------------------------------


def test_correction_interpolates_in_log_size_holds_below_and_fades_above() -> None:
    from ddl.reduction import cost
    model = cost.CostModel(links=(cost.SHARED_MEMORY,), corrections=(("ring", ((1 << 10, 2.0), (1 << 20, 4.0))),))
    assert model.correction("ring", 1) == 2.0 and model.correction("ring", 1 << 20) == 4.0
    # Past the largest run it fades to 1 over 4 octaves: a latency-bound run says nothing of bandwidth.
    assert model.correction("ring", 1 << 22) == pytest.approx(2.5) and model.correction("ring", 1 << 30) == 1.0
    assert model.correction("ring", 1 << 15) == pytest.approx(3.0)  # halfway in log2
    assert model.correction("shm", 1 << 15) == 1.0
    plain = cost.CostModel(links=(cost.SHARED_MEMORY,))
    from ddl.base.topology import build_topology

    topo = build_topology(0, ["h"] * 4)
    assert cost.predict("ring", topo, 1 << 18, 4, model) == pytest.approx(4.0 * cost.predict("ring", topo, 1 << 18, 4, plain))


def test_every_rank_gets_the_same_corrections() -> None:
    from ddl.base.topology import build_topology

    # The fake is slow: run every probe.
    plan = ProbePlan(link=((8, 2), (4096, 2)), native=((8, 2), (4096, 2)), corrections=(4 << 10, 64 << 10),
                     correction_skip_beyond=10.0, correction_budget=100.0)  # load must not cut runs

    def body(comm: FakeComm) -> object:
        topo = build_topology(comm.rank, ["h"] * 3)
        return calibration.measure(comm, topo, segment_bytes=1 << 20, plan=plan).model

    models = run_ranks(3, body)
    assert all(m == models[0] for m in models)
    table = dict(models[0].corrections)  # type: ignore[attr-defined]
    assert set(table) == {"ring", "multiring", "halving_doubling", "shm"}
    assert table["multiring"] == table["ring"]  # one dim: the same schedule, run once
    assert all([n for n, _ in pts] == [4 << 10, 64 << 10] and all(0.2 <= f <= 5.0 for _, f in pts)
               for pts in table.values())


def test_corrections_survive_a_calibration_file(tmp_path: object) -> None:
    from pathlib import Path

    from ddl.reduction import cost
    model = cost.CostModel(links=(cost.SHARED_MEMORY,), corrections=(("shm", ((1 << 20, 0.5),)),))
    path = Path(str(tmp_path)) / "cal.json"
    who = {"world_size": 2, "dims": [2], "hosts": ["h", "h"]}
    calibration.save(path, calibration.Calibration(model, "measured"), who)
    loaded = calibration.load(path, who, segment_bytes=0)
    assert loaded is not None and loaded.model.corrections == model.corrections
