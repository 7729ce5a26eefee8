"""Sharded optimizers' partition and segment exchanges: balanced, deterministic, correct on any world."""

from __future__ import annotations

import random

import numpy as np
import pytest

from ddl.base.errors import MismatchError, RemoteError
from ddl.base.topology import build_topology
from ddl.reduction import cost
from ddl.reduction.partition import NOBODY, by_owner, partition_by_bytes, segment_bounds
from ddl.reduction.schedule import Schedule
from ddl.reduction.segments import (
    ALLREDUCE,
    REDUCE_SCATTER,
    check_bounds,
    choose_gradient_exchange,
    segment_schedule,
    sole_owner,
)
from ddl.testing.engines import run_engines
from ddl.testing.symbolic import check_schedules


# -- the partition ---------------------------------------------------------------------
@pytest.mark.parametrize("world", [1, 2, 3, 4, 7, 16])
def test_every_rank_owns_at_most_an_equal_share_plus_one_tensor(world: int) -> None:
    rng = random.Random(world)
    for _ in range(20):
        sizes = [rng.choice([4, 64, 4096, 1 << 20]) * rng.randint(1, 9) for _ in range(rng.randint(1, 60))]
        part = partition_by_bytes(sizes, world)
        assert sorted(i for r in range(world) for i in part.owned_by(r)) == list(range(len(sizes)))
        assert sum(part.loads) == sum(sizes)
        for r in range(world):
            assert part.loads[r] == sum(sizes[i] for i in part.owned_by(r))
        assert part.largest_load <= sum(sizes) / world + max(sizes)


def test_the_partition_depends_on_the_sizes_and_the_world_alone() -> None:
    sizes = [300, 100, 300, 200, 50, 50, 0]
    a, b = partition_by_bytes(sizes, 3), partition_by_bytes(list(sizes), 3)
    assert a == b
    assert a.owners == (0, 2, 1, 2, 0, 1, 2)  # largest first to the least loaded, ties to the lower rank
    assert partition_by_bytes(sizes, 2).owners != a.owners  # a new world derives its own


def test_frozen_tensors_belong_to_nobody() -> None:
    part = partition_by_bytes([8, 8, 8], 2, skip=[False, True, False])
    assert part.owners == (0, NOBODY, 1)
    assert part.owned_by(0) == [0] and part.owned_by(1) == [2]


def test_bad_partition_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="at least one rank"):
        partition_by_bytes([1], 0)
    with pytest.raises(ValueError, match="2 entries for 1 tensors"):
        partition_by_bytes([1], 2, skip=[False, True])
    with pytest.raises(ValueError, match="negative"):
        partition_by_bytes([-1], 2)


def test_a_bucket_is_laid_out_by_owner() -> None:
    owners = [1, 0, 1, 0, NOBODY]
    assert by_owner([0, 1, 2, 3, 4], owners) == [1, 3, 0, 2, 4]
    assert segment_bounds([3, 0, 2]) == (0, 3, 3, 5)


# -- the segment exchanges -------------------------------------------------------------
def _combined(topology_of, world: int, bounds: tuple[int, ...]) -> list[Schedule]:
    """Each rank's reduce-scatter followed by its allgather: together an allreduce."""
    out = []
    for r in range(world):
        topo = topology_of(r)
        rs = segment_schedule(topo, r, bounds, reduce=True)
        ag = segment_schedule(topo, r, bounds, reduce=False)
        out.append(Schedule("segments", r, bounds[-1], rs.steps + ag.steps))
    return out


@pytest.mark.parametrize("hosts", [["a"] * 2, ["a"] * 3, ["a"] * 5, ["a", "a", "b", "b"], ["a", "b", "c"],
                                   ["a"] * 3 + ["b"] * 3])
def test_reduce_scatter_then_allgather_over_uneven_segments_is_an_allreduce(hosts: list[str]) -> None:
    world = len(hosts)
    rng = random.Random(world)
    for counts in ([0] * (world - 1) + [7], [rng.randint(0, 5) for _ in range(world)], [1] * world):
        if not sum(counts):
            continue
        bounds = segment_bounds(counts)
        check_schedules(_combined(lambda r: build_topology(r, hosts), world, bounds))


def test_one_host_runs_each_exchange_as_one_shared_memory_step() -> None:
    topo = build_topology(0, ["a"] * 4)
    assert len(segment_schedule(topo, 0, (0, 1, 2, 3, 4), reduce=True).steps) == 1
    assert len(segment_schedule(build_topology(0, ["a", "b"]), 0, (0, 1, 2), reduce=True).steps) == 1  # a ring of 2


def test_the_cost_model_picks_an_allreduce_for_a_bucket_one_rank_owns() -> None:
    topo = build_topology(0, ["a"] * 4)
    model = cost.default_model(topo)
    even = (0, 1 << 20, 2 << 20, 3 << 20, 4 << 20)
    assert choose_gradient_exchange(topo, even, 4, model) == REDUCE_SCATTER
    assert choose_gradient_exchange(topo, (0, 4 << 20, 4 << 20, 4 << 20, 4 << 20), 4, model) == ALLREDUCE
    assert sole_owner((0, 4, 4, 4, 4)) == 0 and sole_owner(even) is None


def test_bounds_are_checked() -> None:
    assert check_bounds([0, 3, 3, 5], 3, 5) == (0, 3, 3, 5)
    for bad in ([0, 3, 5], [1, 3, 3, 5], [0, 4, 3, 5], [0, 3, 3, 6]):
        with pytest.raises(ValueError, match="segment bounds"):
            check_bounds(bad, 3, 5)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_segment_collectives_on_fake_ranks(world: int) -> None:
    counts = [5 + 3 * r if r != 1 else 0 for r in range(world)]  # rank 1 owns nothing
    bounds = segment_bounds(counts)

    def body(c) -> tuple[np.ndarray, np.ndarray]:
        r = c.topology.rank
        buf = np.arange(bounds[-1], dtype=np.float64) * (r + 1)
        c.reduce_segments_async(buf, bounds, op="average").wait()
        mine = buf[bounds[r] : bounds[r + 1]].copy()
        buf[: bounds[r]] = -1  # whatever the others' segments hold must be replaced
        buf[bounds[r + 1] :] = -1
        c.allgather_segments_async(buf, bounds).wait()
        return mine, buf

    results = run_engines(world, body)
    mean = np.arange(bounds[-1], dtype=np.float64) * (world + 1) / 2
    for r, (mine, everything) in enumerate(results):
        np.testing.assert_allclose(mine, mean[bounds[r] : bounds[r + 1]])
        np.testing.assert_array_equal(everything, results[0][1])
    np.testing.assert_allclose(results[0][1], mean)


def test_ranks_that_cut_a_buffer_differently_get_a_mismatch_error() -> None:
    def body(c) -> str:
        cut = (0, 2, 4) if c.topology.rank == 0 else (0, 3, 4)
        try:
            c.reduce_segments_async(np.ones(4), cut, name="b0").wait()
        except MismatchError as exc:
            assert "(0, 2, 4)" in str(exc) and "(0, 3, 4)" in str(exc), exc
            return "MismatchError"
        return "no error"

    assert run_engines(2, body) == ["MismatchError", "MismatchError"]


def test_bad_bounds_on_one_rank_fail_every_rank() -> None:
    def body(c) -> str:
        cut = (0, 2, 4) if c.topology.rank == 0 else (0, 2, 9)
        try:
            c.allgather_segments_async(np.ones(4), cut, name="p0").wait()
        except (ValueError, RemoteError) as exc:
            return type(exc).__name__
        return "no error"

    assert run_engines(2, body) == ["RemoteError", "ValueError"]
