"""The shared-memory allreduce: schedules, group steps on the fake, window pieces, pricing, refusal."""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import pytest

from ddl.base.config import Config
from ddl.base.ops import ReduceOp
from ddl.base.topology import Topology, build_topology, parse_spec
from ddl.engine.context import Context
from ddl.reduction import calibration, cost
from ddl.reduction.algorithms import SCHEDULED, check_for
from ddl.reduction.algorithms.shm import why_not_shared
from ddl.reduction.executor import piece_elems, slot_bytes
from ddl.reduction.probes import DEFAULT_PLAN, ProbePlan, Samples
from ddl.reduction.scattered import Scattered
from ddl.reduction.schedule import GroupStep, Schedule, Step, chunks_of, partition
from ddl.testing import (
    FakeComm,
    ScheduleError,
    check_algorithm,
    check_schedules,
    run_engines,
    run_ranks,
)

SHM = SCHEDULED["shm"]


def _hosts_per_d0(spec: str) -> list[str]:
    """Host names that put every dim-0 ring of ``spec`` on its own host."""
    d0, size = parse_spec(spec).dims[0], parse_spec(spec).size
    return [f"h{r // d0}" for r in range(size)]


def _compile_all(topo: Topology, count: int) -> list[Schedule]:
    return [SHM.compile(dataclasses.replace(topo, rank=r), r, count) for r in range(topo.size)]


# -- schedules -------------------------------------------------------------------


@pytest.mark.parametrize("size", [*range(2, 10), 12, 16])
def test_checker_passes_one_host(size: int) -> None:
    topo = build_topology(0, ["h"] * size)
    for count in (0, 1, 7, 10_000):
        check_algorithm(SHM.compile, topo, count)
    steps = _compile_all(topo, 10)[0].steps
    assert [type(s) for s in steps] == [GroupStep, GroupStep]  # one host, one dim: only the two group steps


@pytest.mark.parametrize("spec", ["2x3", "3x3x2", "4x16", "3x5x7", "2x2x2", "4x1x3", "5x1"])
def test_checker_passes_hierarchical(spec: str) -> None:
    topo = build_topology(0, _hosts_per_d0(spec), spec)
    assert why_not_shared(topo) is None
    for count in (0, 1, 7, 10_000):
        check_algorithm(SHM.compile, topo, count)


def test_outer_steps_are_multiring_on_the_owned_slice() -> None:
    topo = build_topology(0, _hosts_per_d0("4x3"), "4x3")
    count = 1000
    for s in _compile_all(topo, count):
        first, *outer, last = s.steps
        assert isinstance(first, GroupStep) and first.reduce and isinstance(last, GroupStep) and not last.reduce
        assert first.members == tuple(topo.ring(0, s.rank)) and first.chunks == tuple(chunks_of(partition(0, count, 4)))
        lo, hi = first.chunks[first.members.index(s.rank)]
        assert len(outer) == 2 * (3 - 1)
        for st in outer:
            assert isinstance(st, Step) and st.dim == 1
            assert lo <= st.send[0] <= st.send[1] <= hi and lo <= st.recv[0] <= st.recv[1] <= hi


def test_checker_catches_broken_group_steps() -> None:
    topo = build_topology(0, ["h"] * 3)
    good = _compile_all(topo, 9)
    check_schedules(good)

    def with_rank1(*steps: GroupStep | Step) -> list[Schedule]:
        return [good[0], dataclasses.replace(good[1], steps=tuple(steps)), good[2]]

    rs, ag = good[1].steps
    assert isinstance(rs, GroupStep) and isinstance(ag, GroupStep)
    with pytest.raises(ScheduleError, match="group step mismatch"):  # other chunks on one member
        check_schedules(with_rank1(dataclasses.replace(rs, chunks=((0, 2), (2, 6), (6, 9))), ag))
    with pytest.raises(ScheduleError, match="group step mismatch"):  # copy where the others reduce
        check_schedules(with_rank1(dataclasses.replace(rs, reduce=False), ag))
    with pytest.raises(ScheduleError, match="deadlock"):  # a member never comes to the allgather
        check_schedules(with_rank1(rs))
    twice = [dataclasses.replace(s, steps=(s.steps[0], *s.steps)) for s in good]
    with pytest.raises(ScheduleError, match="count ranks twice"):
        check_schedules(twice)
    no_reduce = [dataclasses.replace(s, steps=s.steps[1:]) for s in good]
    with pytest.raises(ScheduleError, match="misses contributions"):
        check_schedules(no_reduce)
    with pytest.raises(ScheduleError, match="not a member"):
        check_schedules(with_rank1(dataclasses.replace(rs, members=(0, 2, 3)), ag))
    with pytest.raises(ScheduleError, match="3 chunks for 2 members"):
        check_schedules(with_rank1(dataclasses.replace(rs, members=(0, 1)), ag))


# -- applicability -----------------------------------------------------------------


@pytest.mark.parametrize(("hosts", "spec", "words"), [
    (["a"], None, "dims[0] = 1"),
    (["a", "b", "a", "b"], "1x4", "dims[0] = 1"),
    (["a", "b"], None, "spans hosts"),
    (["a", "a", "a", "b", "b", "b"], "2x3", "spans hosts"),
])
def test_not_applicable_is_a_clear_error(hosts: list[str], spec: str | None, words: str) -> None:
    topo = build_topology(0, hosts, spec)
    with pytest.raises(ValueError, match=re.escape(words)) as info:
        check_for("shm", topo)
    assert "multiring" in str(info.value) and "'shm'" in str(info.value)
    with pytest.raises(ValueError, match=re.escape(words)):
        SHM.compile(topo, 0, 10)
    model = cost.default_model(topo)
    assert cost.predict("shm", topo, 1 << 20, 4, model) == (math.inf if topo.size > 1 else 0.0)
    for n in (1, 1 << 12, 1 << 20, 1 << 26):
        assert cost.choose(topo, n, 4, dataclasses.replace(model, shm_alpha=0.0, shm_beta=0.0)) != "shm"


def test_explicit_shm_is_refused_in_the_caller_on_every_rank() -> None:
    def body(c):  # type: ignore[no-untyped-def]
        with pytest.raises(ValueError, match="spans hosts"):
            c.allreduce(np.ones(4), algorithm="shm")
        return float(c.allreduce(np.ones(4), op="sum", algorithm="multiring")[0])  # the runtime goes on

    assert run_engines(2, body, hostnames=["a", "b"]) == [2.0, 2.0]


def test_shm_as_the_configured_default_is_refused_at_context_creation() -> None:
    def body(comm: FakeComm) -> None:
        topo = build_topology(comm.rank, ["a", "b"])
        Context(comm, topo, Config(algorithm="shm"))

    with pytest.raises(ValueError, match="'shm' cannot run here"):
        run_ranks(2, body, hostnames=["a", "b"])


# -- execution on the fake ------------------------------------------------------------


def _contribution(rank: int, n: int, dtype: type) -> np.ndarray:
    rng = np.random.default_rng(7 + rank)
    if np.dtype(dtype).kind in "iu":
        return rng.integers(0, 5, n).astype(dtype)
    return rng.standard_normal(n).astype(dtype)


@pytest.mark.parametrize(("spec", "hosts"), [
    (None, ["h"] * 2), (None, ["h"] * 3), (None, ["h"] * 5), ("2x3", _hosts_per_d0("2x3")),
    ("3x2", ["b", "a", "a", "b", "a", "b"]),  # topology order differs from rank order
    ("2x2x2", _hosts_per_d0("2x2x2")),
])
@pytest.mark.parametrize("shm_bytes", [4096, 8 << 20], ids=["tiny-window", "default-window"])
def test_runs_on_the_fake_against_float64(spec: str | None, hosts: list[str], shm_bytes: int) -> None:
    p = len(hosts)
    counts = (0, 1, 7, 10_000)

    def body(comm: FakeComm) -> list[np.ndarray]:
        ctx = Context(comm, build_topology(comm.rank, hosts, spec), Config(segment_bytes=256, shm_bytes=shm_bytes))
        out = []
        for n in counts:
            for dtype in (np.float32, np.float64, np.int32):
                buf = _contribution(comm.rank, n, dtype)
                ctx.allreduce_flat(buf, ReduceOp.SUM, "shm")
                out.append(buf)
        return out

    results = run_ranks(p, body, hostnames=hosts)
    k = 0
    for n in counts:
        for dtype in (np.float32, np.float64, np.int32):
            ref = sum(_contribution(q, n, dtype).astype(np.float64) for q in range(p))
            got = [results[r][k] for r in range(p)]
            assert all(g.tobytes() == got[0].tobytes() for g in got), (n, dtype)  # bit-identical everywhere
            assert np.allclose(got[0], ref, rtol=1e-5, atol=1e-4), (n, dtype)
            k += 1


@pytest.mark.parametrize("op", [op for op in ReduceOp if op is not ReduceOp.ADASUM])  # Adasum: never a schedule
def test_every_op(op: ReduceOp) -> None:
    p, n = 4, 1001
    hosts = ["h"] * p

    def body(comm: FakeComm) -> np.ndarray:
        ctx = Context(comm, build_topology(comm.rank, hosts), Config(shm_bytes=4096))
        buf = np.arange(n, dtype=np.float64) % 7 + comm.rank + 1
        ctx.allreduce_flat(buf, op, "shm")
        return buf

    got = run_ranks(p, body, hostnames=hosts)
    parts = [np.arange(n, dtype=np.float64) % 7 + q + 1 for q in range(p)]
    want = {ReduceOp.SUM: sum(parts), ReduceOp.AVERAGE: sum(parts) / p, ReduceOp.MIN: parts[0],
            ReduceOp.MAX: parts[-1], ReduceOp.PRODUCT: np.prod(parts, axis=0)}[op]
    for g in got:
        assert np.allclose(g, want, rtol=1e-12)


def test_tiny_window_forces_pieces_and_halves_alternate() -> None:
    p, n, cap = 2, 10_000, 4096
    members = (0, 1)

    def body(comm: FakeComm) -> int:
        ctx = Context(comm, build_topology(comm.rank, ["h"] * p), Config(shm_bytes=cap))
        for _ in range(3):
            ctx.allreduce_flat(np.ones(n, np.float32), ReduceOp.SUM, "shm")
        return comm.shared_slots(members, 0).turn

    step = _compile_all(build_topology(0, ["h"] * p), n)[0].steps
    capacity = slot_bytes(p, n // p, 4, cap)
    assert capacity <= cap
    pieces = sum(-(-st.longest // piece_elems(p, capacity, 4)) for st in step if isinstance(st, GroupStep))
    assert pieces > 10
    assert run_ranks(p, body, hostnames=["h"] * p) == [3 * pieces] * p


def test_slots_grow_deterministically_and_respect_the_cap() -> None:
    assert slot_bytes(2, 1, 4, 8 << 20) == 64 << 10  # smallest slot
    assert slot_bytes(2, 1 << 20, 4, 8 << 20) == 8 << 20  # capped
    assert slot_bytes(4, 10_000, 4, 8 << 20) == 1 << 19  # 2 halves x 4 chunks x 40 KB, next power of two
    assert slot_bytes(300, 1 << 20, 8, 4096) >= 2 * 300 * 8  # one element per chunk always fits


# -- pricing -------------------------------------------------------------------------


def test_group_step_price_matches_its_formula() -> None:
    model = cost.CostModel(links=(cost.Link(1e-5, 1e-9),), gamma=2e-10, shm_alpha=5e-6, shm_beta=1e-10,
                           shm_bytes=8 << 20)
    n, p = 4000, 4
    topo = build_topology(0, ["h"] * p)
    item = 4
    want = 2 * 5e-6 + 2 * n * item * 1e-10 + (p - 1) * (n // p) * item * 2e-10
    assert cost.predict("shm", topo, n, item, model) == pytest.approx(want, rel=1e-12)
    # A 4 KiB slot: halves of 2 KiB hold 128 elements of each of 4 chunks, so each step
    # takes 8 pieces of the 1000-element chunks.
    small = dataclasses.replace(model, shm_bytes=4096)
    assert cost.predict("shm", topo, n, item, small) == pytest.approx(want + 14 * 5e-6, rel=1e-12)


def test_copies_past_the_caches_are_priced_at_the_memory_bound_rate() -> None:
    model = cost.CostModel(links=(cost.Link(1e-5, 1e-9),), shm_beta=1e-11, shm_beta_large=1e-10)
    assert model.copy_beta(4096) == model.copy_beta(cost.COPY_CACHED_BYTES) == 1e-11
    assert model.copy_beta(cost.COPY_MEMORY_BYTES) == model.copy_beta(1 << 30) == 1e-10
    middle = (cost.COPY_CACHED_BYTES + cost.COPY_MEMORY_BYTES) // 2
    assert model.copy_beta(middle) == pytest.approx(5.5e-11)
    assert dataclasses.replace(model, shm_beta_large=0.0).copy_beta(1 << 30) == 1e-11  # unmeasured: one rate
    topo = build_topology(0, ["h"] * 2)
    n = (64 << 20) // 4
    slow = cost.predict("shm", topo, n, 4, model)
    assert slow > cost.predict("shm", topo, n, 4, dataclasses.replace(model, shm_beta_large=1e-11)) + 2 * (64 << 20) * 8e-11


def test_hierarchical_price_adds_the_outer_rings() -> None:
    model = cost.CostModel(links=(cost.Link(1e-5, 1e-9), cost.Link(3e-5, 1e-8)), gamma=2e-10)
    topo = build_topology(0, _hosts_per_d0("4x2"), "4x2")
    n = 1 << 16
    inner = 2 * model.shm_alpha + 2 * n * 4 * model.shm_beta + 3 * (n // 4) * 4 * model.gamma
    # dim 1: one reduce-scatter and one allgather step of N/8 elements, 4 ranks per port.
    outer = 2 * (3e-5 + n / 8 * 4 * 1e-8 * 4) + n / 8 * 4 * 2e-10
    assert cost.predict("shm", topo, n, 4, model) == pytest.approx(inner + outer, rel=1e-9)


def test_auto_picks_shm_for_large_messages_when_it_is_cheapest() -> None:
    topo = build_topology(0, ["h"] * 2)
    # Figures like this machine's: MPI's allreduce at 165 us per MiB, shm ~100 us per MiB.
    model = cost.CostModel(links=(cost.Link(12e-6, 1 / 3.6e9),), gamma=1 / 27e9, step_overhead=5e-6,
                           native_points=((8, 8e-6), (1 << 20, 165e-6), (16 << 20, 3e-3)),
                           shm_alpha=12e-6, shm_beta=1 / 19e9)
    assert cost.choose(topo, 2, 4, model) == "mpi"
    assert cost.choose(topo, (1 << 20) // 4, 4, model) == "shm"
    assert cost.choose(topo, (64 << 20) // 4, 4, model) == "shm"


def test_calibration_measures_shm_on_the_fake_and_files_keep_it(tmp_path: object) -> None:
    hosts = ["h"] * 2
    plan = ProbePlan(link=((8, 3), (4096, 3)), native=((8, 3), (4096, 3)))

    def body(comm: FakeComm) -> cost.CostModel:
        topo = build_topology(comm.rank, hosts)
        return calibration.measure(comm, topo, segment_bytes=1 << 20, shm_bytes=1 << 16, plan=plan).model

    models = run_ranks(2, body, hostnames=hosts)
    assert models[0] == models[1] and models[0].shm_bytes == 1 << 16
    assert models[0].shm_alpha != cost.SHM_ALPHA and models[0].shm_beta != cost.SHM_BETA
    assert 0 < models[0].shm_alpha < 0.05 and 0 < models[0].shm_beta <= models[0].shm_beta_large < 1e-7
    path = f"{tmp_path}/cal.json"
    topo = build_topology(0, hosts)
    calibration.save(path, calibration.Calibration(models[0], "measured"), calibration.identity(topo, hosts))
    loaded = calibration.load(path, calibration.identity(topo, hosts), segment_bytes=1 << 20, shm_bytes=1 << 16)
    assert loaded is not None and loaded.model == models[0]


def test_fit_reads_the_shm_samples() -> None:
    native = (1e-4,) * len(DEFAULT_PLAN.native)
    samples = Samples(links=((1e-5,) * len(DEFAULT_PLAN.link),), gamma=2e-10, step=2e-5, native=native,
                      shm=(7e-6, 3e-11, 1e-10))
    assert samples.from_vector(samples.vector()) == samples
    model = calibration.fit(samples, segment_bytes=4096, shm_bytes=1 << 20)
    assert (model.shm_alpha, model.shm_beta, model.shm_beta_large, model.shm_bytes) == (7e-6, 3e-11, 1e-10, 1 << 20)
    assert tuple(t for _, t in model.native_points) == native
    plain = calibration.fit(dataclasses.replace(samples, shm=()), segment_bytes=4096)
    assert (plain.shm_alpha, plain.shm_beta) == (cost.SHM_ALPHA, cost.SHM_BETA)


@pytest.mark.parametrize(("spec", "hosts"), [
    (None, ["h"] * 3), ("2x2", _hosts_per_d0("2x2")), ("2x2x2", _hosts_per_d0("2x2x2")),
])
@pytest.mark.parametrize("algorithm", ["shm", "multiring", "mpi"])
def test_out_of_place_reads_the_input_and_gives_the_in_place_bits(spec: str | None, hosts: list[str],
                                                                   algorithm: str) -> None:
    """``src``: shm's first step reads the input where it lies (no copy into the result first),
    also a bucket's tensors (:class:`Scattered`); every element of the result is written,
    the input is left alone, the bits are in place's."""
    p = len(hosts)

    def body(comm: FakeComm) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        ctx = Context(comm, build_topology(comm.rank, hosts, spec), Config(segment_bytes=256, shm_bytes=4096))
        out = []
        for n in (5, 1001, 30_000):
            x = _contribution(comm.rank, n, np.float32)
            kept = x.copy()
            result = np.full(n, np.nan, np.float32)  # garbage the schedule must overwrite
            ctx.allreduce_flat(result, ReduceOp.AVERAGE, algorithm, src=x)
            inplace = kept.copy()
            ctx.allreduce_flat(inplace, ReduceOp.AVERAGE, algorithm)
            out.append((result, inplace, x - kept))
            # A bucket's tensors as they lie: cut at uneven places, one of them strided.
            cuts = sorted([0, min(n, 3), n // 3, n // 2, n])
            strided = np.zeros(2 * (cuts[3] - cuts[2]), np.float32)
            strided[::2] = x[cuts[2] : cuts[3]]
            parts = [x[cuts[0] : cuts[1]], x[cuts[1] : cuts[2]].copy(), strided[::2], x[cuts[3] :].copy()]
            scattered = np.full(n, np.nan, np.float32)
            ctx.allreduce_flat(scattered, ReduceOp.AVERAGE, algorithm, src=Scattered(parts))
            out.append((scattered, inplace, x - kept))
        return out

    for rank_out in run_ranks(p, body, hostnames=hosts):
        for result, inplace, moved in rank_out:
            assert result.tobytes() == inplace.tobytes()
            assert not np.any(moved)
