"""Schedules: the symbolic checker on every algorithm, and the checker itself on broken ones."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest

from ddl.base.topology import Topology, build_topology, parse_spec
from ddl.reduction.algorithms import NAMES, SCHEDULED, check_name
from ddl.reduction.schedule import NO_RANGE, Schedule, Step, chunks_of, partition
from ddl.testing import ScheduleError, check_algorithm, check_schedules

ALGORITHMS = sorted(SCHEDULED)


def _topo(spec: str | None, size: int | None = None, hostnames: list[str] | None = None) -> Topology:
    if hostnames is None:
        n = parse_spec(spec).size if spec is not None else size
        assert n is not None
        hostnames = ["h"] * n
    return build_topology(0, hostnames, spec)


def _skip_unavailable(name: str, topo: Topology) -> None:
    reason = SCHEDULED[name].unavailable(topo)
    if reason is not None:
        assert name == "shm", reason  # only shm needs a topology of its kind (tests/tier1/test_shm.py)
        pytest.skip(reason)


def _compile_all(name: str, topo: Topology, count: int) -> list[Schedule]:
    alg = SCHEDULED[name]
    return [alg.compile(dataclasses.replace(topo, rank=r), r, count) for r in range(topo.size)]


def test_registry() -> None:
    assert set(SCHEDULED) == {"ring", "multiring", "halving_doubling", "shm"}
    assert set(NAMES) == {"auto", "mpi", *SCHEDULED}
    for name, alg in SCHEDULED.items():
        assert alg.name == name
        assert check_name(name) == name
    with pytest.raises(ValueError, match="unknown allreduce algorithm 'tree'") as info:
        check_name("tree")
    for name in NAMES:
        assert name in str(info.value)


# -- every algorithm, every world size -----------------------------------------


@pytest.mark.parametrize("name", ALGORITHMS)
@pytest.mark.parametrize("size", range(1, 65))
def test_checker_passes_flat_sizes(name: str, size: int) -> None:
    topo = _topo(None, size)
    _skip_unavailable(name, topo)
    for count in (0, 1, 7, 3 * size + 1):
        check_algorithm(SCHEDULED[name].compile, topo, count)


SHAPES = ["3x5x7", "1x8", "8x1", "2x3", "3x3x2", "2x2x2", "1x1", "4x1x3"]


@pytest.mark.parametrize("name", ALGORITHMS)
@pytest.mark.parametrize("spec", SHAPES)
def test_checker_passes_shapes(name: str, spec: str) -> None:
    topo = _topo(spec)
    _skip_unavailable(name, topo)
    for count in (0, 1, topo.size + 7):
        check_algorithm(SCHEDULED[name].compile, topo, count)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_checker_passes_1024_ranks(name: str) -> None:
    topo = _topo("4x16x16")
    assert topo.size == 1024
    check_algorithm(SCHEDULED[name].compile, topo, topo.size + 7)


@pytest.mark.parametrize("name", ALGORITHMS)
@pytest.mark.parametrize(
    ("spec", "hostnames"),
    [
        ("4x3", [f"h{(r * 5) % 3}" for r in range(12)]),  # topology order != rank order
        ("2x3", ["b", "a", "c", "a", "b", "c"]),
        (None, ["a", "b"] * 4),  # discovered 4x2, round robin
        (None, ["x", "y", "y", "x", "x"]),  # unequal hosts: flat
    ],
)
def test_checker_passes_permuted_order(name: str, spec: str | None, hostnames: list[str]) -> None:
    topo = build_topology(0, hostnames, spec)
    assert topo.order != tuple(range(topo.size)) or spec is None
    _skip_unavailable(name, topo)
    for count in (1, 7, 2 * topo.size + 3):
        check_algorithm(SCHEDULED[name].compile, topo, count)


# -- structure: step counts and message sizes -----------------------------------


@pytest.mark.parametrize("size", [2, 3, 5, 8, 13])
def test_ring_steps(size: int) -> None:
    topo = _topo(None, size)
    p = size
    for s in _compile_all("ring", topo, 4 * p + 1):
        assert len(s.steps) == 2 * (p - 1)
        assert s.algorithm == "ring"
        assert [st.reduce for st in s.steps] == [True] * (p - 1) + [False] * (p - 1)


def test_ring_ignores_dims_and_follows_topology_order() -> None:
    names = ["a", "b"] * 4
    topo = build_topology(0, names, "4x2")
    order = topo.order
    for s in _compile_all("ring", topo, 40):
        assert len(s.steps) == 14
        i = order.index(s.rank)
        for st in s.steps:
            assert st.send_peer == order[(i + 1) % 8]
            assert st.recv_peer == order[(i - 1) % 8]


def test_ring_size_one_has_no_steps() -> None:
    for name in ALGORITHMS:
        if name == "shm":
            assert SCHEDULED[name].unavailable(_topo(None, 1)) is not None
            continue
        assert _compile_all(name, _topo(None, 1), 10)[0].steps == ()


@pytest.mark.parametrize("spec", ["2x3", "4x4", "3x5", "8x2", "1x6", "5x1"])
def test_multiring_step_count(spec: str) -> None:
    d0, d1 = parse_spec(spec).dims
    topo = _topo(spec)
    for s in _compile_all("multiring", topo, 5 * topo.size + 3):
        assert len(s.steps) == 2 * (d0 - 1) + 2 * (d1 - 1)


@pytest.mark.parametrize("spec", ["4x4", "3x5", "4x3x2", "2x3x5", "4x16x4"])
@pytest.mark.parametrize("count", [1, 7, 100, 1001])
def test_multiring_outer_dims_move_a_slice(spec: str, count: int) -> None:
    dims = parse_spec(spec).dims
    topo = _topo(spec)
    for s in _compile_all("multiring", topo, count):
        for st in s.steps:
            # Steps really cross the dimension they are labelled with.
            peer = st.send_peer if st.send_peer is not None else st.recv_peer
            assert topo.link_dim(s.rank, peer) == st.dim
            limit = count if st.dim == 0 else math.ceil(count / math.prod(dims[: st.dim]))
            assert st.send_count <= limit and st.recv_count <= limit, (st, limit)
            if st.dim > 0:
                assert st.send_count <= math.ceil(count / dims[0])


def test_multiring_single_dim_is_ring() -> None:
    topo = _topo(None, 6)
    ring = _compile_all("ring", topo, 31)
    multi = _compile_all("multiring", topo, 31)
    assert [s.steps for s in ring] == [s.steps for s in multi]


@pytest.mark.parametrize("size", [2, 4, 8, 16, 32, 64])
def test_halving_doubling_power_of_two_steps(size: int) -> None:
    topo = _topo(None, size)
    log = size.bit_length() - 1
    for s in _compile_all("halving_doubling", topo, 3 * size + 1):
        assert len(s.steps) == 2 * log
        assert [st.phase for st in s.steps] == ["halving"] * log + ["doubling"] * log
        # Each halving step sends half of what remains.
        n = s.count
        for st in s.steps[:log]:
            assert st.send_count in (n // 2, n - n // 2)
            n -= st.send_count


@pytest.mark.parametrize("size", [3, 5, 6, 7, 12])
def test_halving_doubling_non_power_of_two_folds(size: int) -> None:
    topo = _topo(None, size)
    p2 = 1 << (size.bit_length() - 1)
    extra = size - p2
    log = p2.bit_length() - 1
    for s in _compile_all("halving_doubling", topo, 50):
        i = topo.index_of(s.rank)
        if i < 2 * extra and i % 2 == 0:
            assert [st.phase for st in s.steps] == ["fold", "unfold"]
        elif i < 2 * extra:
            assert len(s.steps) == 2 * log + 2
            assert s.steps[0].phase == "fold" and s.steps[-1].phase == "unfold"
        else:
            assert len(s.steps) == 2 * log


def test_partition_and_chunks() -> None:
    assert partition(0, 10, 3) == [0, 3, 6, 10]
    assert partition(5, 5, 2) == [5, 5, 5]
    assert chunks_of([0, 3, 6, 10]) == [(0, 3), (3, 6), (6, 10)]
    for n in range(0, 40):
        for parts in range(1, 9):
            sizes = [b - a for a, b in chunks_of(partition(0, n, parts))]
            assert sum(sizes) == n and max(sizes) - min(sizes) <= 1


# -- the checker catches broken schedules -----------------------------------------


def _sched(rank: int, count: int, *steps: Step) -> Schedule:
    return Schedule("hand", rank, count, tuple(steps))


def _rs(r: int) -> Step:
    """Reduce-scatter half of a 2-rank allreduce of 2 elements: rank r keeps element r."""
    return Step(1 - r, (1 - r, 2 - r), 1 - r, (r, r + 1), reduce=True)


def _ag(r: int) -> Step:
    """Allgather half: rank r sends its element r, receives the other one."""
    return Step(1 - r, (r, r + 1), 1 - r, (1 - r, 2 - r), reduce=False)


def _pair() -> list[Schedule]:
    return [_sched(r, 2, _rs(r), _ag(r)) for r in range(2)]


def test_checker_accepts_hand_built_schedules() -> None:
    # Sanity checks for the negative tests below: correct hand-built schedules pass.
    check_schedules(_pair())
    # Fold rank 2 into rank 0, pair-reduce, unfold.
    fold = [
        _sched(0, 2, Step(None, NO_RANGE, 2, (0, 2), True), _rs(0), _ag(0), Step(2, (0, 2), None, NO_RANGE, False)),
        _sched(1, 2, _rs(1), _ag(1)),
        _sched(2, 2, Step(0, (0, 2), None, NO_RANGE, True), Step(None, NO_RANGE, 0, (0, 2), False)),
    ]
    check_schedules(fold)
    check_schedules([_sched(0, 5)])  # a world of one needs no steps
    check_schedules([_sched(0, 0), _sched(1, 0)])  # nothing to reduce


def test_checker_catches_double_count() -> None:
    twice = [_sched(r, 2, _rs(r), _rs(r), _ag(r)) for r in range(2)]
    with pytest.raises(ScheduleError, match="rank 0 step 1: element 0 would count ranks twice"):
        check_schedules(twice)


def test_checker_catches_double_count_via_third_rank() -> None:
    fold_twice = [
        _sched(0, 2, Step(None, NO_RANGE, 2, (0, 2), True), Step(None, NO_RANGE, 2, (0, 2), True), _rs(0), _ag(0)),
        _sched(1, 2, _rs(1), _ag(1)),
        _sched(2, 2, Step(0, (0, 2), None, NO_RANGE, False), Step(0, (0, 2), None, NO_RANGE, False)),
    ]
    with pytest.raises(ScheduleError, match="twice"):
        check_schedules(fold_twice)


def test_checker_catches_copy_instead_of_reduce() -> None:
    copied = [_sched(r, 2, dataclasses.replace(_rs(r), reduce=False), _ag(r)) for r in range(2)]
    with pytest.raises(ScheduleError, match="rank 0 element 0 misses contributions of ranks \\[0\\]"):
        check_schedules(copied)


def test_checker_catches_missing_allgather() -> None:
    half = [_sched(r, 2, _rs(r)) for r in range(2)]
    with pytest.raises(ScheduleError, match="rank 0 element 1 misses contributions of ranks \\[1\\]"):
        check_schedules(half)


def test_checker_catches_rank_left_out() -> None:
    with pytest.raises(ScheduleError, match="misses contributions of ranks \\[2\\]"):
        check_schedules([*_pair(), _sched(2, 2)])


def test_checker_catches_size_mismatch() -> None:
    s0 = _sched(0, 3, Step(1, (1, 3), 1, (0, 1), True))
    s1 = _sched(1, 3, Step(0, (0, 1), 0, (1, 2), True))
    with pytest.raises(ScheduleError, match="rank 0 step 0 sends 2 elements to rank 1, whose step 0 expects 1"):
        check_schedules([s0, s1])


def test_checker_catches_deadlock_both_receiving() -> None:
    s0 = _sched(0, 1, Step(None, NO_RANGE, 1, (0, 1), True))
    s1 = _sched(1, 1, Step(None, NO_RANGE, 0, (0, 1), True))
    with pytest.raises(ScheduleError, match="deadlock: rank 0 at step 0.*rank 1 at step 0"):
        check_schedules([s0, s1])


def test_checker_catches_deadlock_crossed_order() -> None:
    # Each rank first waits for the other's second message: a cycle.
    s0 = _sched(0, 1, Step(None, NO_RANGE, 1, (0, 1), True), Step(1, (0, 1), None, NO_RANGE, False))
    s1 = _sched(1, 1, Step(None, NO_RANGE, 0, (0, 1), True), Step(0, (0, 1), None, NO_RANGE, False))
    with pytest.raises(ScheduleError, match="deadlock"):
        check_schedules([s0, s1])


def test_checker_catches_unmatched_send() -> None:
    # Rank 0 sends once more to rank 1, which has already finished.
    s = _pair()
    s[0] = dataclasses.replace(s[0], steps=(*s[0].steps, Step(1, (0, 1), None, NO_RANGE, False)))
    with pytest.raises(ScheduleError, match="deadlock: rank 0 at step 2"):
        check_schedules(s)


def test_checker_catches_wrong_peer() -> None:
    # Rank 2 expects rank 0, which sends to rank 1 instead.
    s = [
        _sched(0, 1, Step(1, (0, 1), None, NO_RANGE, False)),
        _sched(1, 1, Step(None, NO_RANGE, 2, (0, 1), True)),
        _sched(2, 1, Step(None, NO_RANGE, 0, (0, 1), True)),
    ]
    with pytest.raises(ScheduleError, match="deadlock"):
        check_schedules(s)


@pytest.mark.parametrize(("send", "recv"), [((0, 2), (1, 3)), ((1, 3), (0, 2)), ((0, 3), (1, 2)), ((0, 2), (0, 2))])
def test_checker_catches_overlapping_ranges(send: tuple[int, int], recv: tuple[int, int]) -> None:
    pair = [_sched(r, 3, Step(1 - r, send, 1 - r, recv, True)) for r in range(2)]
    with pytest.raises(ScheduleError, match=re.escape(f"rank 0 step 0: send {send} overlaps receive {recv}")):
        check_schedules(pair)


def test_checker_allows_touching_ranges() -> None:
    # Adjacent (not overlapping) send/recv ranges are fine; empty ranges never overlap.
    s = [
        _sched(0, 2, Step(1, (0, 0), 1, (0, 0), True), *_pair()[0].steps),
        _sched(1, 2, Step(0, (0, 0), 0, (0, 0), True), *_pair()[1].steps),
    ]
    check_schedules(s)


def test_checker_catches_empty_step_and_wrong_header() -> None:
    with pytest.raises(ScheduleError, match="rank 0 step 0 neither sends nor receives"):
        check_schedules([_sched(0, 1, Step(None, NO_RANGE, None, NO_RANGE, False))])
    good = _pair()
    with pytest.raises(ScheduleError, match="schedule 1 is for rank 0"):
        check_schedules([good[0], dataclasses.replace(good[1], rank=0)])
    with pytest.raises(ScheduleError, match="count 3"):
        check_schedules([good[0], dataclasses.replace(good[1], count=3)])


@pytest.mark.parametrize("name", ALGORITHMS)
def test_checker_catches_mutated_real_schedules(name: str) -> None:
    topo = _topo("2x3")
    good = _compile_all(name, topo, 13)
    check_schedules(good)
    victim = good[4]
    mutants = [
        victim.steps[1:],  # drop the first step
        victim.steps[:-1],  # drop the last step
        victim.steps + victim.steps[:1],  # repeat a step
        tuple(dataclasses.replace(st, reduce=not st.reduce) for st in victim.steps),  # flip reduce/copy
    ]
    for steps in mutants:
        broken = list(good)
        broken[4] = dataclasses.replace(victim, steps=steps)
        with pytest.raises(ScheduleError):
            check_schedules(broken)


def test_schedule_error_is_assertion_error() -> None:
    assert issubclass(ScheduleError, AssertionError)
