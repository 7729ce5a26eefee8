"""``shm`` across hosts, pipelined: the same bits as step after step, which schedules it
takes, and the offset arithmetic its in-host stages agree on."""

from __future__ import annotations

import numpy as np
import pytest

from ddl.base.config import Config
from ddl.base.ops import ReduceOp
from ddl.base.topology import build_topology, parse_spec
from ddl.engine.context import Context
from ddl.reduction import cost, pipelined
from ddl.reduction.algorithms import SCHEDULED
from ddl.reduction.scattered import Scattered
from ddl.reduction.schedule import GroupStep
from ddl.testing import FakeComm, run_ranks


def _hosts_per_d0(spec: str) -> list[str]:
    d0, size = parse_spec(spec).dims[0], parse_spec(spec).size
    return [f"h{r // d0}" for r in range(size)]


def _run(spec: str, hosts: list[str], counts: tuple[int, ...], shm_bytes: int, *, piped: bool,
         monkeypatch: pytest.MonkeyPatch) -> tuple[list[list[np.ndarray]], list[int]]:
    """Every rank's results of float32 sums of random data (order shows in the bits), and
    how many fractions each call ran in (0: step after step)."""
    real_plan = pipelined.plan
    used: list[int] = []

    def plan(schedule: object, itemsize: int) -> pipelined.Pipeline | None:
        got = real_plan(schedule, itemsize) if piped else None  # type: ignore[arg-type]
        used.append(got.fractions if got else 0)
        return got

    monkeypatch.setattr(pipelined, "plan", plan)
    monkeypatch.setattr(pipelined, "FRACTION_BYTES", 16)  # small buffers cut into many fractions
    monkeypatch.setattr(pipelined, "MIN_MESSAGE_BYTES", 4)
    monkeypatch.setattr(pipelined, "_planned", {})  # plans made with the real sizes stay out of it

    def body(comm: FakeComm) -> list[np.ndarray]:
        ctx = Context(comm, build_topology(comm.rank, hosts, spec), Config(segment_bytes=256, shm_bytes=shm_bytes))
        out = []
        for n in counts:
            buf = np.random.default_rng(n + 31 * comm.rank).standard_normal(n).astype(np.float32)
            result = np.full(n, np.nan, np.float32)
            ctx.allreduce_flat(result, ReduceOp.SUM, "shm", src=buf)  # out of place: read where it lies
            scattered = np.full(n, np.nan, np.float32)  # a bucket's tensors where they lie, cut unevenly
            ctx.allreduce_flat(scattered, ReduceOp.SUM, "shm", src=Scattered([buf[: n // 3], buf[n // 3 :].copy()]))
            ctx.allreduce_flat(buf, ReduceOp.SUM, "shm")
            assert result.tobytes() == buf.tobytes() == scattered.tobytes()
            out.append(buf)
        return out

    return run_ranks(len(hosts), body, hostnames=hosts), used


@pytest.mark.parametrize("spec", ["2x2", "2x3", "3x2", "4x2"])
@pytest.mark.parametrize("shm_bytes", [4096, 8 << 20], ids=["tiny-window", "default-window"])
def test_pipelined_gives_the_bits_of_step_after_step(spec: str, shm_bytes: int,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    hosts, counts = _hosts_per_d0(spec), (64, 1001, 4099, 20_000)
    piped, used = _run(spec, hosts, counts, shm_bytes, piped=True, monkeypatch=monkeypatch)
    assert min(used) >= 2, used  # every call here was cut into fractions
    plain, used = _run(spec, hosts, counts, shm_bytes, piped=False, monkeypatch=monkeypatch)
    assert set(used) == {0}
    for k, n in enumerate(counts):
        ref = sum(np.random.default_rng(n + 31 * r).standard_normal(n).astype(np.float32).astype(np.float64)
                  for r in range(len(hosts)))
        assert np.allclose(piped[0][k], ref, rtol=1e-5, atol=1e-4), (spec, n)
        for r in range(len(hosts)):
            assert piped[r][k].tobytes() == plain[0][k].tobytes(), (spec, n, r)


def _schedule(spec: str, hosts: list[str], rank: int, count: int) -> object:
    return SCHEDULED["shm"].compile(build_topology(rank, hosts, spec), rank, count)


def test_plan_takes_two_levels_only_and_large_enough_chunks() -> None:
    four_bytes = 4
    big = 4 << 20  # 16 MiB of float32: 8 MiB chunks on 2 ranks a host
    two = _schedule("2x2", _hosts_per_d0("2x2"), 1, big)
    got = pipelined.plan(two, four_bytes)  # type: ignore[arg-type]
    assert got is not None and got.fractions == 16 and len(got.ring) == 2
    # 8 hosts: the same chunks in 128 KiB messages make 8 fractions; 1 MiB makes none.
    eight = _hosts_per_d0("2x8")
    assert pipelined.plan(_schedule("2x8", eight, 5, big), four_bytes).fractions == 8  # type: ignore[union-attr,arg-type]
    assert pipelined.plan(_schedule("2x8", eight, 5, big // 16), four_bytes) is None  # type: ignore[arg-type]
    assert pipelined.plan(_schedule("2x2", _hosts_per_d0("2x2"), 1, 1 << 16), four_bytes) is None  # type: ignore[arg-type]
    assert pipelined.plan(_schedule("2x2x2", _hosts_per_d0("2x2x2"), 3, big), four_bytes) is None  # type: ignore[arg-type]
    one_host = SCHEDULED["shm"].compile(build_topology(0, ["h"] * 2, None), 0, big)
    assert pipelined.plan(one_host, four_bytes) is None
    # Every member of every host cuts alike, from the longest chunk.
    for spec in ("2x2", "3x2"):
        hosts = _hosts_per_d0(spec)
        cuts = {pipelined.plan(_schedule(spec, hosts, r, big + 1), four_bytes).fractions  # type: ignore[union-attr,arg-type]
                for r in range(len(hosts))}
        assert len(cuts) == 1, (spec, cuts)


def test_offset_arithmetic() -> None:
    assert pipelined.merge([(5, 7), (0, 2), (2, 3), (9, 9), (6, 8)]) == [(0, 3), (5, 8)]
    assert pipelined.subtract([(0, 10)], [(2, 4), (6, 7)]) == [(0, 2), (4, 6), (7, 10)]
    assert pipelined.subtract([(0, 3), (5, 8)], [(0, 6)]) == [(6, 8)]
    assert pipelined.common([[(0, 5), (7, 9)], [(3, 8)]]) == [(3, 5), (7, 8)]
    parts = [pipelined.fraction((10, 27), f, 4) for f in range(4)]
    assert parts[0][0] == 10 and parts[-1][1] == 27
    assert all(a[1] == b[0] for a, b in zip(parts, parts[1:], strict=False))


def test_price_counts_the_in_host_steps_beside_the_ring(monkeypatch: pytest.MonkeyPatch) -> None:
    hosts = _hosts_per_d0("2x2")
    topo = build_topology(0, hosts, "2x2")
    model = cost.default_model(topo)
    schedules = [SCHEDULED["shm"].compile(build_topology(r, hosts, "2x2"), r, 4 << 20) for r in (0, 1)]
    piped = cost.schedule_time(schedules, topo, 4, model)
    monkeypatch.setattr(pipelined, "plan", lambda schedule, itemsize: None)
    plain = cost.schedule_time(schedules, topo, 4, model)
    in_host = sum(cost.group_step_time(s, 4, model) for s in schedules[0].steps if isinstance(s, GroupStep))
    assert in_host > 0 and piped < plain
    # What stays outside the ring: the first and the last fraction's in-host work (16 fractions).
    assert piped >= plain - in_host + in_host / 16 - 1e-12
