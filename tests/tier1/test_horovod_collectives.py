"""Horovod's collectives in the core, on fake ranks: join, alltoall, scale factors, Adasum,
grouped and asynchronous allgather/reducescatter, poll."""

from __future__ import annotations

import numpy as np
import pytest

import ddl
from ddl.base.config import Config
from ddl.engine.collectives import Collectives
from ddl.reduction import adasum
from ddl.testing import run_engines


@pytest.mark.parametrize("mode", ["size", "contributors"])
def test_join_uneven_batches(mode: str) -> None:
    # Ranks run 3, 5 and 7 steps; each step allreduces (Average) its batch's gradient.
    # After join, Horovod's rule divides by every rank (the joined ones add zeros); with
    # DDL_JOIN_AVERAGE=contributors by the ranks still working, as one process would.
    steps = [3, 5, 7]
    grad = {(r, s): np.full(4, 10.0 * r + s) for r in range(3) for s in range(7)}

    def fn(c: Collectives) -> tuple[list[np.ndarray], int]:
        r = c.topology.rank
        outs = [c.allreduce(grad[(r, s)], name=f"g{s}") for s in range(steps[r])]
        return outs, c.join()

    results = run_engines(3, fn, config=Config(segment_bytes=64, stall_timeout=10.0, join_average=mode))
    for outs, last in results:
        assert last == 2  # the rank with 7 batches joined last
        for s, out in enumerate(outs):
            working = [q for q in range(3) if s < steps[q]]
            total = np.sum([grad[(q, s)] for q in working], axis=0)
            np.testing.assert_array_equal(out, total / (3 if mode == "size" else len(working)))


def test_join_twice_and_grouped_allreduce_with_zeros_from_joined_rank() -> None:
    def fn(c: Collectives) -> tuple[list[np.ndarray], int, np.ndarray]:
        r = c.topology.rank
        outs = []
        if r == 0:
            outs = c.grouped_allreduce([np.ones(3), np.arange(2.0)], op=ddl.Sum, name="grp")
        first = c.join()
        after = c.allreduce(np.ones(2), op=ddl.Sum, name="after")  # the runtime is back to normal
        return outs, first, after

    (outs0, last0, after0), (outs1, last1, after1) = run_engines(2, fn)
    np.testing.assert_array_equal(outs0[0], np.ones(3))
    np.testing.assert_array_equal(outs0[1], np.arange(2.0))
    assert last0 == last1 == 0
    np.testing.assert_array_equal(after0, [2.0, 2.0])


def test_broadcast_after_join_is_an_error_on_the_caller() -> None:
    def fn(c: Collectives) -> BaseException | None:
        err = None
        if c.topology.rank == 1:
            try:
                c.broadcast(np.ones(2), 0, name="b")
            except ddl.DDLError as exc:
                err = exc
        c.join()
        return err

    errs = run_engines(2, fn)
    assert errs[0] is None
    assert isinstance(errs[1], ddl.DDLError) and "joined" in str(errs[1])


def test_alltoall_with_splits_returns_received_splits() -> None:
    def fn(c: Collectives) -> tuple[np.ndarray, list[int]]:
        r = c.topology.rank
        splits = [r + 1, 1, 2][: c.topology.size]
        rows = np.arange(sum(splits) * 2, dtype=np.int16).reshape(-1, 2) + 100 * r
        return c.alltoall_async(rows, splits, name="a2a").wait()  # type: ignore[no-any-return]

    results = run_engines(3, fn)
    for r, (out, received) in enumerate(results):
        sent = {q: [q + 1, 1, 2] for q in range(3)}
        assert received == [sent[q][r] for q in range(3)]
        expect = []
        for q in range(3):
            start = sum(sent[q][:r])
            block = np.arange(sum(sent[q]) * 2, dtype=np.int16).reshape(-1, 2) + 100 * q
            expect.append(block[start : start + sent[q][r]])
        np.testing.assert_array_equal(out, np.concatenate(expect))


def test_alltoall_refuses_bad_splits_on_every_rank() -> None:
    def fn(c: Collectives) -> BaseException | None:
        try:
            c.alltoall_async(np.ones((4, 1)), [2, 2] if c.topology.rank == 0 else [5, 0], name="x").wait()
        except (ValueError, ddl.RemoteError) as exc:
            return exc
        return None

    errs = run_engines(2, fn)
    assert isinstance(errs[0], ddl.RemoteError) and isinstance(errs[1], ValueError)


@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_prescale_postscale(dtype: str) -> None:
    def fn(c: Collectives) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        x = np.full(5, 4 + c.topology.rank, dtype)
        big = np.full(2000, 4 + c.topology.rank, dtype)  # past the inline size: the bucket path
        return (c.allreduce(x, op=ddl.Sum, prescale=0.5, postscale=3.0),
                c.allreduce(big, op=ddl.Average, prescale=2.0, postscale=0.5),
                c.reducescatter(np.stack([x, x]), op=ddl.Sum, postscale=2.0))

    for small, big, scattered in run_engines(2, fn):
        # Each rank's input is scaled in its own dtype: integers truncate (0.5*5 -> 2), as in Horovod.
        np.testing.assert_array_equal(small, np.full(5, 13.5 if dtype == "float32" else 12).astype(dtype))
        np.testing.assert_array_equal(big, np.full(2000, 0.5 * (8 + 10) / 2).astype(dtype))
        np.testing.assert_array_equal(scattered, np.full((1, 5), 2 * 9).astype(dtype))


def test_scale_factors_must_agree() -> None:
    def fn(c: Collectives) -> BaseException | None:
        try:
            c.allreduce(np.ones(3), op=ddl.Sum, prescale=1.0 + c.topology.rank, name="s")
        except ddl.MismatchError as exc:
            return exc
        return None

    assert all(isinstance(e, ddl.MismatchError) for e in run_engines(2, fn))


def test_adasum_matches_the_pairwise_tree_and_is_identical_everywhere() -> None:
    rng = np.random.default_rng(0)
    data = [rng.standard_normal(7) for _ in range(4)]

    def fn(c: Collectives) -> tuple[np.ndarray, list[np.ndarray]]:
        x = data[c.topology.rank]
        return c.allreduce(x, op=ddl.Adasum), c.grouped_allreduce([x, 2 * x], op=ddl.Adasum)

    results = run_engines(4, fn)
    expect = adasum.pair(adasum.pair(data[0], data[1]), adasum.pair(data[2], data[3]))
    for single, grouped in results:
        np.testing.assert_array_equal(single, results[0][0])
        np.testing.assert_allclose(single, expect, rtol=1e-12)
        np.testing.assert_allclose(grouped[1], adasum.combine([2 * d for d in data]), rtol=1e-12)


def test_adasum_pair_averages_parallel_and_adds_orthogonal() -> None:
    a = np.array([3.0, 0.0])
    np.testing.assert_allclose(adasum.pair(a, a), a)
    np.testing.assert_allclose(adasum.pair(a, np.array([0.0, 2.0])), [3.0, 2.0])
    np.testing.assert_allclose(adasum.combine([a, a, a]), a)  # an odd one is carried up


def test_grouped_allgather_reducescatter_async_and_poll() -> None:
    def fn(c: Collectives) -> tuple[list[np.ndarray], list[np.ndarray], bool]:
        r = c.topology.rank
        h1 = c.grouped_allgather_async([np.full((r + 1, 2), r), np.array([r], np.int8)], name="ga")
        h2 = c.grouped_reducescatter_async([np.ones((4, 2)), np.arange(6.0).reshape(3, 2)], op=ddl.Average,
                                           name="grs")
        gathered, scattered = h1.wait(), h2.wait()
        return gathered, scattered, ddl.poll(h1) and ddl.poll(h2)

    for r, (gathered, scattered, polled) in enumerate(run_engines(2, fn)):
        assert polled
        np.testing.assert_array_equal(gathered[0], [[0, 0], [1, 1], [1, 1]])
        np.testing.assert_array_equal(gathered[1], np.array([0, 1], np.int8))
        np.testing.assert_array_equal(scattered[0], np.ones((2, 2)))
        np.testing.assert_array_equal(scattered[1], np.arange(6.0).reshape(3, 2)[[0, 1]] if r == 0 else [[4.0, 5.0]])


def test_reducescatter_postscale_rounds_halves_once() -> None:
    # Horovod scales a float16 result in float32 (a float32 factor) and rounds once; scaling
    # after the cast to float16 rounds the factor and the product a second time.
    factor = 0.1915194503788923
    rows = np.arange(-96, 96, 3, dtype=np.float16).reshape(16, 4)

    def fn(c: Collectives) -> tuple[np.ndarray, np.ndarray]:
        return (c.reducescatter(rows, op=ddl.Sum, postscale=factor),
                c.reducescatter(rows, op=ddl.Average, postscale=factor))

    summed32 = 2 * rows.astype(np.float32)
    once = (summed32 * np.float32(factor)).astype(np.float16)
    twice = summed32.astype(np.float16) * np.float16(factor)
    assert not np.array_equal(once, twice)  # the data tell the two roundings apart
    for r, (total, mean) in enumerate(run_engines(2, fn)):
        assert total.dtype == mean.dtype == np.float16
        np.testing.assert_array_equal(total, once[8 * r : 8 * r + 8])
        np.testing.assert_array_equal(mean, (rows.astype(np.float32) * np.float32(factor)).astype(np.float16)[8 * r : 8 * r + 8])


@pytest.mark.parametrize("dtype", ["int32", "float32"])
def test_reducescatter_refuses_adasum_with_a_runtime_error(dtype: str) -> None:
    # Horovod refuses Adasum for reducescatter with a RuntimeError, whatever the dtype: the
    # op's refusal comes before the integer-dtype rule that would name another problem.
    def fn(c: Collectives) -> BaseException | None:
        try:
            c.reducescatter(np.ones((4, 2), dtype), op=ddl.Adasum, name="rs")
        except RuntimeError as exc:
            return exc
        return None

    for err in run_engines(2, fn):
        assert isinstance(err, NotImplementedError) and "Adasum" in str(err) and "Sum or Average" in str(err)


def test_unnamed_calls_after_join_meet_on_every_rank() -> None:
    # Rank 1 makes unnamed calls while rank 0 waits in join() (an allreduce rank 0 stands
    # in for, an allgather that fails); afterwards both ranks' unnamed calls must pair up.
    def fn(c: Collectives) -> tuple[np.ndarray, list[np.ndarray], BaseException | None]:
        err = None
        if c.topology.rank == 1:
            c.allreduce(np.ones(2), op=ddl.Sum)
            try:
                c.allgather(np.ones(2))
            except ddl.DDLError as exc:
                err = exc
        c.join()
        return c.allreduce(np.full(2, 1.0 + c.topology.rank), op=ddl.Sum), c.allgather_object(c.topology.rank), err

    results = run_engines(2, fn, config=Config(segment_bytes=64, stall_timeout=3.0))
    for total, gathered, _ in results:
        np.testing.assert_array_equal(total, [3.0, 3.0])
        assert gathered == [0, 1]
    assert results[0][2] is None and "joined" in str(results[1][2])
