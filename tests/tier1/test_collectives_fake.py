"""The public collectives through the real engine on the thread-backed fake communicator,
every algorithm and topology."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

import ddl
from ddl.base.config import Config
from ddl.engine.collectives import Collectives as Context
from ddl.testing import run_engines

ALGORITHMS = ["mpi", "ring", "multiring", "halving_doubling", "auto"]
DTYPES = ["float16", "float32", "float64", "int32", "int64", "uint8"]
OPS = [ddl.Sum, ddl.Average, ddl.Min, ddl.Max, ddl.Product]


def _hosts_for(size: int) -> list[str]:
    """Two hosts, ranks placed round robin, for even sizes >= 4 (so order != rank order)."""
    if size >= 4 and size % 2 == 0:
        return [f"host{r % 2}" for r in range(size)]
    return ["solo"] * size


# (label, world size, spec, hostnames)
TOPOLOGIES: list[tuple[str, int, str | None, list[str]]] = [
    (f"p{n}", n, None, _hosts_for(n)) for n in (*range(1, 10), 12, 16)
] + [
    ("2x3", 6, "2x3", ["a", "a", "b", "b", "c", "c"]),
    ("3x3x2", 18, "3x3x2", ["solo"] * 18),
    ("2x2x2", 8, "2x2x2", ["a", "b"] * 4),
]
TOPO_IDS = [t[0] for t in TOPOLOGIES]


def run_ctx(
    size: int,
    fn: Callable[[Context], Any],
    *,
    spec: str | None = None,
    hostnames: Sequence[str] | None = None,
    algorithm: str = "auto",
    segment_bytes: int = 12,
) -> list[Any]:
    """Run ``fn(collectives)`` on ``size`` fake ranks, each with its own engine."""
    config = Config(algorithm=algorithm, segment_bytes=segment_bytes, stall_timeout=10.0)
    return run_engines(size, fn, hostnames=hostnames, spec=spec, config=config)


def run_all_raise(size: int, fn: Callable[[Context], Any], **kw: Any) -> list[BaseException | None]:
    """Like :func:`run_ctx`, but return what each rank raised (None if it did not)."""

    def catching(ctx: Context) -> BaseException | None:
        try:
            fn(ctx)
        except Exception as exc:  # noqa: BLE001 - returned to the test
            return exc
        return None

    return run_ctx(size, catching, **kw)


def assert_same_bits(results: Sequence[np.ndarray]) -> None:
    first = results[0]
    for r, res in enumerate(results):
        assert res.dtype == first.dtype and res.shape == first.shape, (r, res.dtype, res.shape)
        assert res.tobytes() == first.tobytes(), f"rank {r} differs from rank 0"


def floats(rank: int, count: int, dtype: str = "float32") -> np.ndarray:
    return np.random.default_rng(1000 + rank).standard_normal(count).astype(dtype)


def check_sum(results: Sequence[np.ndarray], inputs: Sequence[np.ndarray]) -> None:
    """Same bits everywhere and close to the float64 sum of the inputs."""
    assert_same_bits(results)
    oracle = np.sum([x.astype(np.float64) for x in inputs], axis=0)
    scale = np.sum([np.abs(x.astype(np.float64)) for x in inputs], axis=0)
    eps = np.finfo(results[0].dtype).eps
    err = np.abs(results[0].astype(np.float64) - oracle)
    assert np.all(err <= 4 * len(inputs) * eps * scale + 1e-30), float(np.max(err - len(inputs) * eps * scale))


# -- every algorithm x topology x count ------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize(("label", "size", "spec", "hostnames"), TOPOLOGIES, ids=TOPO_IDS)
def test_allreduce_sum_small_counts(
    algorithm: str, label: str, size: int, spec: str | None, hostnames: list[str]
) -> None:
    counts = (0, 1, 7)

    def fn(ctx: Context) -> list[np.ndarray]:
        assert ctx.topology.size == size
        return [ctx.allreduce(floats(ctx.topology.rank, n), op=ddl.Sum) for n in counts]

    per_rank = run_ctx(size, fn, spec=spec, hostnames=hostnames, algorithm=algorithm, segment_bytes=12)
    for i, n in enumerate(counts):
        results = [res[i] for res in per_rank]
        assert results[0].shape == (n,) and results[0].dtype == np.float32
        check_sum(results, [floats(r, n) for r in range(size)])


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize(("label", "size", "spec", "hostnames"), TOPOLOGIES, ids=TOPO_IDS)
def test_allreduce_sum_large_count(
    algorithm: str, label: str, size: int, spec: str | None, hostnames: list[str]
) -> None:
    # A tiny segment (3 float32) on the smaller worlds; elsewhere still several segments per step.
    seg = 12 if label in ("p2", "p3", "p5", "2x3", "2x2x2") else 400
    n = 10_000

    def fn(ctx: Context) -> np.ndarray:
        return ctx.allreduce(floats(ctx.topology.rank, n), op=ddl.Sum)

    results = run_ctx(size, fn, spec=spec, hostnames=hostnames, algorithm=algorithm, segment_bytes=seg)
    check_sum(results, [floats(r, n) for r in range(size)])


@pytest.mark.parametrize("dtype", ["float16", "float64"])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize(("size", "spec", "hostnames"), [(5, None, None), (8, "2x2x2", ["a", "b"] * 4)],
                         ids=["p5", "2x2x2"])
def test_random_floats_same_bits_everywhere(
    algorithm: str, dtype: str, size: int, spec: str | None, hostnames: list[str] | None
) -> None:
    n = 301

    def fn(ctx: Context) -> list[np.ndarray]:
        x = floats(ctx.topology.rank, n, dtype)
        return [ctx.allreduce(x, op=op) for op in (ddl.Sum, ddl.Average, ddl.Product)]

    per_rank = run_ctx(size, fn, spec=spec, hostnames=hostnames, algorithm=algorithm, segment_bytes=40)
    for i in range(3):
        assert_same_bits([res[i] for res in per_rank])
    check_sum([res[0] for res in per_rank], [floats(r, n, dtype) for r in range(size)])
    np.testing.assert_allclose(per_rank[0][1].astype(np.float64), per_rank[0][0].astype(np.float64) / size,
                               rtol=float(np.finfo(dtype).eps))


@pytest.mark.parametrize("algorithm", ["ring", "multiring", "halving_doubling"])
def test_scheduled_algorithms_agree_with_mpi(algorithm: str) -> None:
    # Sums differ across algorithms only by rounding; exact on integer-valued floats.
    def fn(ctx: Context) -> tuple[np.ndarray, np.ndarray]:
        x = np.arange(50, dtype=np.float64) * (ctx.topology.rank + 1)
        return ctx.allreduce(x, op=ddl.Sum, algorithm=algorithm), ctx.allreduce(x, op=ddl.Sum, algorithm="mpi")

    for mine, ref in run_ctx(6, fn, spec="2x3", segment_bytes=16):
        np.testing.assert_array_equal(mine, ref)
        np.testing.assert_array_equal(ref, np.arange(50) * 21.0)


# -- ops x dtypes -------------------------------------------------------------------


def _op_inputs(op: ddl.ReduceOp, dtype: str, rank: int, n: int) -> np.ndarray:
    """Small exactly representable values, so every op is exact in every dtype."""
    rng = np.random.default_rng(7 * rank + 1)
    signed = dtype != "uint8"
    if op is ddl.Product:
        choices = [1, 2, -1] if signed else [1, 2]
    elif op in (ddl.Min, ddl.Max):
        choices = list(range(-50, 51)) if signed else list(range(0, 200))
    else:
        choices = list(range(-10, 11)) if signed else list(range(0, 11))
    return rng.choice(choices, size=n).astype(dtype)


def _oracle(op: ddl.ReduceOp, inputs: list[np.ndarray]) -> np.ndarray:
    wide = np.stack([x.astype(np.float64) for x in inputs])
    if op is ddl.Sum:
        return wide.sum(axis=0)
    if op is ddl.Average:
        return wide.sum(axis=0) / len(inputs)
    if op is ddl.Min:
        return wide.min(axis=0)
    if op is ddl.Max:
        return wide.max(axis=0)
    return wide.prod(axis=0)


def _check_ops(algorithm: str, dtype: str, size: int, spec: str | None, hostnames: list[str]) -> None:
    n = 23
    is_float = np.dtype(dtype).kind == "f" or dtype == "bfloat16"
    ops = OPS if is_float else [op for op in OPS if op is not ddl.Average]

    def fn(ctx: Context) -> list[np.ndarray]:
        r = ctx.topology.rank
        return [ctx.allreduce(_op_inputs(op, dtype, r, n), op=op) for op in ops]

    per_rank = run_ctx(size, fn, spec=spec, hostnames=hostnames, algorithm=algorithm, segment_bytes=6)
    for i, op in enumerate(ops):
        results = [res[i] for res in per_rank]
        assert_same_bits(results)
        assert results[0].dtype == np.dtype(dtype)
        expected = _oracle(op, [_op_inputs(op, dtype, r, n) for r in range(size)])
        if op is ddl.Average:
            np.testing.assert_allclose(results[0].astype(np.float64), expected, rtol=2 * np.finfo(dtype).eps)
        else:
            np.testing.assert_array_equal(results[0].astype(np.float64), expected, err_msg=f"{op} {dtype}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_ops_and_dtypes(algorithm: str, dtype: str) -> None:
    _check_ops(algorithm, dtype, 6, "2x3", ["a", "b", "c"] * 2)


@pytest.mark.parametrize("algorithm", ["mpi", "ring", "halving_doubling"])
def test_ops_and_dtypes_odd_world(algorithm: str) -> None:
    for dtype in ("float16", "int64", "uint8"):
        _check_ops(algorithm, dtype, 5, None, ["solo"] * 5)


@pytest.mark.parametrize("algorithm", ["mpi", "ring", "multiring"])
def test_bfloat16(algorithm: str) -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf16 = np.dtype(ml_dtypes.bfloat16)

    def fn(ctx: Context) -> list[np.ndarray]:
        x = (np.arange(9) % 4 + ctx.topology.rank).astype(bf16)
        return [ctx.allreduce(x, op=op) for op in (ddl.Sum, ddl.Max, ddl.Average)]

    per_rank = run_ctx(4, fn, spec="2x2", algorithm=algorithm, segment_bytes=4)
    for i in range(3):
        assert_same_bits([res[i] for res in per_rank])
        assert per_rank[0][i].dtype == bf16
    base = np.arange(9) % 4
    np.testing.assert_array_equal(per_rank[0][0].astype(np.float64), 4 * base + 6)
    np.testing.assert_array_equal(per_rank[0][1].astype(np.float64), base + 3)
    np.testing.assert_array_equal(per_rank[0][2].astype(np.float64), base + 1.5)


def test_ops_by_name() -> None:
    def fn(ctx: Context) -> list[np.ndarray]:
        x = np.array([ctx.topology.rank + 1.0])
        return [ctx.allreduce(x, op=name) for name in ("sum", "MAX", "Average", "min", "product")]

    for res in run_ctx(3, fn, algorithm="ring"):
        assert [float(r[0]) for r in res] == [6.0, 3.0, 2.0, 1.0, 6.0]


def test_default_op_is_average() -> None:
    res = run_ctx(4, lambda ctx: ctx.allreduce(np.full(3, float(ctx.topology.rank))), algorithm="ring")
    for r in res:
        np.testing.assert_array_equal(r, np.full(3, 1.5))


# -- layouts and in place ----------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["mpi", "ring", "multiring", "halving_doubling"])
def test_non_contiguous_and_nd_inputs(algorithm: str) -> None:
    def base(rank: int) -> np.ndarray:
        return np.arange(60, dtype=np.float64).reshape(5, 12) * (rank + 1)

    def fn(ctx: Context) -> dict[str, Any]:
        b = base(ctx.topology.rank)
        before = b.copy()
        out = {
            "strided": ctx.allreduce(b.reshape(-1)[::2], op=ddl.Sum),
            "transposed": ctx.allreduce(b.T, op=ddl.Sum),
            "nd": ctx.allreduce(b.reshape(3, 4, 5), op=ddl.Sum),
            "scalar": ctx.allreduce(np.float64(ctx.topology.rank), op=ddl.Sum),
            "list": ctx.allreduce([1.0, 2.0], op=ddl.Sum),
        }
        out["untouched"] = np.array_equal(b, before)
        return out

    res = run_ctx(6, fn, spec="3x2", hostnames=["a"] * 3 + ["b"] * 3, algorithm=algorithm, segment_bytes=20)
    total = base(0) * 21  # sum of (rank + 1) over 6 ranks
    for r in res:
        assert r["untouched"]
        np.testing.assert_array_equal(r["strided"], total.reshape(-1)[::2])
        np.testing.assert_array_equal(r["transposed"], total.T)
        assert r["transposed"].shape == (12, 5)
        np.testing.assert_array_equal(r["nd"], total.reshape(3, 4, 5))
        assert r["scalar"].shape == () and float(r["scalar"]) == 15.0
        np.testing.assert_array_equal(r["list"], [6.0, 12.0])
    for key in ("strided", "transposed", "nd"):
        assert_same_bits([r[key] for r in res])


@pytest.mark.parametrize("algorithm", ["mpi", "ring", "halving_doubling"])
def test_allreduce_inplace(algorithm: str) -> None:
    def fn(ctx: Context) -> dict[str, Any]:
        r = ctx.topology.rank
        contiguous = np.arange(10, dtype=np.float32).reshape(2, 5) + r
        ret = ctx.allreduce_(contiguous, op=ddl.Sum)
        holder = np.full(20, -1.0)
        view = holder[1::2]
        view[...] = np.arange(10) * (r + 1)
        ret2 = ctx.allreduce_(view, op=ddl.Sum)
        matrix = np.arange(12.0).reshape(3, 4) + r
        ret3 = ctx.allreduce_(matrix.T, op=ddl.Max)
        return {
            "same": ret is contiguous, "contiguous": contiguous,
            "same2": ret2 is view, "holder": holder,
            "same3": ret3.base is matrix, "matrix": matrix,
        }

    res = run_ctx(4, fn, algorithm=algorithm, segment_bytes=8)
    for r in res:
        assert r["same"] and r["same2"] and r["same3"]
        np.testing.assert_array_equal(r["contiguous"], np.arange(10).reshape(2, 5) * 4 + 6)
        np.testing.assert_array_equal(r["holder"][1::2], np.arange(10) * 10)
        np.testing.assert_array_equal(r["holder"][0::2], np.full(10, -1.0))  # neighbours untouched
        np.testing.assert_array_equal(r["matrix"], np.arange(12.0).reshape(3, 4) + 3)
    assert_same_bits([r["holder"] for r in res])


def test_allreduce_inplace_rejects_non_arrays() -> None:
    def fn(ctx: Context) -> list[BaseException]:
        errors = []
        for bad in ([1.0, 2.0], np.arange(3.0)):
            if isinstance(bad, np.ndarray):
                bad.flags.writeable = False
            try:
                ctx.allreduce_(bad)
            except (TypeError, ValueError) as exc:
                errors.append(exc)
        return errors

    errors = run_ctx(1, fn)[0]
    assert len(errors) == 2
    assert isinstance(errors[0], TypeError) and "list" in str(errors[0])
    assert isinstance(errors[1], ValueError) and "read-only" in str(errors[1])


# -- grouped allreduce -------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["mpi", "ring", "auto"])
def test_grouped_allreduce_mixed_dtypes(algorithm: str) -> None:
    def inputs(r: int) -> list[np.ndarray]:
        return [
            np.arange(3, dtype=np.float32) + r,
            np.full((2, 2), r, dtype=np.int32),
            np.arange(5, dtype=np.float32)[::-1] * r,
            np.float64(r) + np.zeros(()),
            np.arange(12, dtype=np.int64).reshape(3, 4).T + r,
            np.zeros((0, 3), dtype=np.float32),
        ]

    res = run_ctx(3, lambda ctx: ctx.grouped_allreduce(inputs(ctx.topology.rank), op=ddl.Sum),
                  algorithm=algorithm, segment_bytes=8)
    expected = [sum(x.astype(np.float64) for x in parts) for parts in zip(*(inputs(r) for r in range(3)), strict=True)]
    for out in res:
        assert len(out) == 6
        for got, want, like in zip(out, expected, inputs(0), strict=True):
            assert got.dtype == like.dtype and got.shape == like.shape
            np.testing.assert_array_equal(got, want)
    for i in range(6):
        assert_same_bits([out[i] for out in res])


def test_grouped_allreduce_average_and_empty() -> None:
    def fn(ctx: Context) -> tuple[list[np.ndarray], list[np.ndarray]]:
        r = float(ctx.topology.rank)
        return ctx.grouped_allreduce([np.array([r]), np.array([2 * r, 4 * r], np.float32)]), ctx.grouped_allreduce([])

    for avg, empty in run_ctx(4, fn, algorithm="ring"):
        np.testing.assert_array_equal(avg[0], [1.5])
        np.testing.assert_array_equal(avg[1], [3.0, 6.0])
        assert empty == []


# -- allgather / broadcast / reducescatter / objects --------------------------------


@pytest.mark.parametrize(("size", "hostnames"), [(1, None), (3, None), (4, ["a", "b"] * 2)])
def test_allgather_different_first_dims(size: int, hostnames: list[str] | None) -> None:
    def mine(r: int) -> np.ndarray:
        return np.arange(r * 3, dtype=np.int64).reshape(r, 3) + 100 * r  # rank 0 sends no rows

    def fn(ctx: Context) -> tuple[np.ndarray, np.ndarray]:
        r = ctx.topology.rank
        strided = np.arange(8.0)[::2] + r
        return ctx.allgather(mine(r)), ctx.allgather(strided)

    res = run_ctx(size, fn, hostnames=hostnames)
    expected = np.concatenate([mine(r) for r in range(size)])
    strided = np.concatenate([np.arange(8.0)[::2] + r for r in range(size)])
    for rows, flat in res:
        assert rows.shape == (sum(range(size)), 3)
        np.testing.assert_array_equal(rows, expected)
        np.testing.assert_array_equal(flat, strided)


def test_allgather_nd_and_errors() -> None:
    def fn(ctx: Context) -> tuple[np.ndarray, BaseException | None]:
        x = np.full((1, 2, 2), ctx.topology.rank, dtype=np.float16)
        err = None
        try:
            ctx.allgather(np.zeros(2, dtype=np.complex64))
        except TypeError as exc:
            err = exc
        return ctx.allgather(x), err

    for out, err in run_ctx(3, fn):
        assert out.shape == (3, 2, 2) and out.dtype == np.float16
        np.testing.assert_array_equal(out[:, 0, 0], [0, 1, 2])
        assert isinstance(err, TypeError)


def test_allgather_rejects_scalar() -> None:
    errors = run_all_raise(2, lambda ctx: ctx.allgather(np.float64(1.0)))
    assert all(isinstance(e, ValueError) for e in errors)


@pytest.mark.parametrize(("size", "root"), [(4, 2), (3, 1), (5, 4), (1, 0)])
def test_broadcast_from_root(size: int, root: int) -> None:
    def fn(ctx: Context) -> dict[str, Any]:
        r = ctx.topology.rank
        x = np.arange(12, dtype=np.int32).reshape(3, 4) * (r + 1)
        out = ctx.broadcast(x, root_rank=root)
        x_after = x.copy()
        y = np.arange(6, dtype=np.float64) + r
        ret = ctx.broadcast_(y, root_rank=root)
        holder = np.arange(12.0).reshape(3, 4) + 10 * r
        col = holder[:, 1]
        ret2 = ctx.broadcast_(col, root_rank=root)
        empty = ctx.broadcast(np.zeros((0, 2)), root_rank=root)
        return {"out": out, "x_after": x_after, "y": y, "same": ret is y, "holder": holder,
                "same2": ret2 is col, "empty": empty}

    res = run_ctx(size, fn, hostnames=["a", "b"] * (size // 2) + ["a"] * (size % 2))
    for r, d in enumerate(res):
        np.testing.assert_array_equal(d["out"], np.arange(12).reshape(3, 4) * (root + 1))
        assert d["out"].dtype == np.int32
        np.testing.assert_array_equal(d["x_after"], np.arange(12).reshape(3, 4) * (r + 1))  # input untouched
        assert d["same"] and d["same2"]
        np.testing.assert_array_equal(d["y"], np.arange(6) + root)
        expected = np.arange(12.0).reshape(3, 4) + 10 * r
        expected[:, 1] = np.arange(12.0).reshape(3, 4)[:, 1] + 10 * root
        np.testing.assert_array_equal(d["holder"], expected)
        assert d["empty"].shape == (0, 2)


@pytest.mark.parametrize("op", [ddl.Sum, ddl.Average, ddl.Max])
@pytest.mark.parametrize(
    ("size", "rows", "hostnames"),
    [(4, 10, None), (4, 10, ["a", "b"] * 2), (3, 7, None), (4, 2, None), (5, 5, None), (1, 3, None)],
)
def test_reducescatter(op: ddl.ReduceOp, size: int, rows: int, hostnames: list[str] | None) -> None:
    def x(r: int) -> np.ndarray:
        return (np.arange(rows * 3, dtype=np.float64).reshape(rows, 3) + 1) * (r + 1)

    res = run_ctx(size, lambda ctx: ctx.reducescatter(x(ctx.topology.rank), op=op), hostnames=hostnames,
                  segment_bytes=16)
    full = _oracle(op, [x(r) for r in range(size)])
    counts = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
    start = 0
    for r, mine in enumerate(res):
        assert mine.shape == (counts[r], 3)
        np.testing.assert_allclose(mine, full[start : start + counts[r]], rtol=1e-15)
        start += counts[r]
    assert counts[0] >= counts[-1]


def test_reducescatter_int_and_errors() -> None:
    def fn(ctx: Context) -> tuple[np.ndarray, list[BaseException]]:
        r = ctx.topology.rank
        out = ctx.reducescatter(np.arange(9, dtype=np.int32)[::-1] + r)
        errors: list[BaseException] = []
        for bad, op in ((np.arange(4, dtype=np.int64), ddl.Adasum), (np.float64(1.0), ddl.Sum)):
            try:
                ctx.reducescatter(bad, op=op)
            except (NotImplementedError, ValueError) as exc:
                errors.append(exc)
        return out, errors

    res = run_ctx(2, fn)
    full = 2 * np.arange(9)[::-1] + 1
    np.testing.assert_array_equal(res[0][0], full[:5])
    np.testing.assert_array_equal(res[1][0], full[5:])
    for _, errors in res:
        # Adasum is refused as an op (Horovod's RuntimeError), before any dtype rule.
        assert [type(e) for e in errors] == [NotImplementedError, ValueError]


def test_objects_and_barrier() -> None:
    def fn(ctx: Context) -> tuple[Any, list[Any], Any]:
        r = ctx.topology.rank
        got = ctx.broadcast_object({"from": r, "data": [r] * 3}, root_rank=2)
        everyone = ctx.allgather_object(("rank", r))
        ctx.barrier()
        return got, everyone, ctx.broadcast_object(None if r else "zero")

    for got, everyone, zero in run_ctx(4, fn):
        assert got == {"from": 2, "data": [2, 2, 2]}
        assert everyone == [("rank", r) for r in range(4)]
        assert zero == "zero"
    solo = run_ctx(1, lambda ctx: (ctx.broadcast_object([1]), ctx.allgather_object("me"), ctx.barrier()))
    assert solo == [([1], ["me"], None)]


def test_barrier_waits_for_every_rank() -> None:
    import threading
    import time

    arrived: list[int] = []
    lock = threading.Lock()

    def fn(ctx: Context) -> list[int]:
        if ctx.topology.rank == 2:
            time.sleep(0.05)
        with lock:
            arrived.append(ctx.topology.rank)
        ctx.barrier()
        with lock:
            return sorted(arrived)

    for seen in run_ctx(3, fn):
        assert seen == [0, 1, 2]


# -- errors ---------------------------------------------------------------------------


def test_unknown_algorithm() -> None:
    with pytest.raises(ValueError, match="unknown allreduce algorithm 'tree'") as info:
        run_ctx(2, lambda ctx: None, algorithm="tree")
    for name in ALGORITHMS:
        assert name in str(info.value)
    errors = run_all_raise(2, lambda ctx: ctx.allreduce(np.ones(3), algorithm="bogus"))
    assert all(isinstance(e, ValueError) and "'bogus'" in str(e) and "multiring" in str(e) for e in errors)


@pytest.mark.parametrize(
    "bad",
    [np.zeros(3, np.complex64), np.array([object(), 1], dtype=object), np.zeros(3, np.uint64),
     np.zeros(2, np.complex128)],
    ids=["complex64", "object", "uint64", "complex128"],
)
def test_unsupported_dtype(bad: np.ndarray) -> None:
    def fn(ctx: Context) -> list[BaseException | None]:
        out: list[BaseException | None] = []
        for call in (
            lambda: ctx.allreduce(bad, op=ddl.Sum),
            lambda: ctx.grouped_allreduce([np.ones(2), bad], op=ddl.Sum),
            lambda: ctx.broadcast(bad),
            lambda: ctx.reducescatter(bad),
        ):
            try:
                call()
                out.append(None)
            except TypeError as exc:
                out.append(exc)
        return out

    for errors in run_ctx(2, fn):
        assert all(isinstance(e, TypeError) for e in errors), errors
        assert str(bad.dtype) in str(errors[0]) and "float32" in str(errors[0])


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64"])
def test_average_on_int_truncates_toward_zero(dtype: str) -> None:
    # Horovod's rule: the sum divided by the ranks, truncated toward zero (5/2 -> 2, -5/2 -> -2).
    def fn(ctx: Context) -> tuple[np.ndarray, list[np.ndarray]]:
        x = np.array([1, -1], dtype) * (3 * ctx.topology.rank + 1)
        return ctx.allreduce(x), ctx.grouped_allreduce([np.ones(1), x.copy()], op=ddl.Average)

    for single, grouped in run_ctx(2, fn):
        assert single.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(single, [2, -2])
        np.testing.assert_array_equal(grouped[1], [2, -2])


def test_bool_moves_but_does_not_reduce() -> None:
    def fn(ctx: Context) -> tuple[np.ndarray, np.ndarray, BaseException | None]:
        flags = np.array([ctx.topology.rank == 0, True])
        try:
            ctx.allreduce(flags, op=ddl.Sum)
            err = None
        except TypeError as exc:
            err = exc
        return ctx.broadcast(flags, 0), ctx.allgather(flags), err

    for bcast, gathered, err in run_ctx(2, fn):
        np.testing.assert_array_equal(bcast, [True, True])
        np.testing.assert_array_equal(gathered, [True, True, False, True])
        assert isinstance(err, TypeError) and "bool" in str(err)


def test_unknown_op() -> None:
    errors = run_all_raise(2, lambda ctx: ctx.allreduce(np.ones(3), op="median"))
    assert all(isinstance(e, ValueError) and "'median'" in str(e) and "ddl.Sum" in str(e) for e in errors)


@pytest.mark.parametrize("root", [-1, 3, 99, 1.0, "0", None])
def test_bad_root_rank(root: Any) -> None:
    def fn(ctx: Context) -> list[BaseException | None]:
        out: list[BaseException | None] = []
        for call in (lambda: ctx.broadcast(np.ones(2), root_rank=root),
                     lambda: ctx.broadcast_(np.ones(2), root_rank=root),
                     lambda: ctx.broadcast_object("x", root_rank=root)):
            try:
                call()
                out.append(None)
            except ValueError as exc:
                out.append(exc)
        return out

    for errors in run_ctx(3, fn):
        assert all(isinstance(e, ValueError) and "root_rank" in str(e) and "0..2" in str(e) for e in errors)


def _assert_mismatch_everywhere(errors: list[BaseException | None], *needles: str) -> None:
    for r, e in enumerate(errors):
        assert isinstance(e, ddl.MismatchError), f"rank {r} raised {e!r}"
        for needle in needles:
            assert needle in str(e), (needle, str(e))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_mismatched_shapes(algorithm: str) -> None:
    def fn(ctx: Context) -> None:
        n = 4 if ctx.topology.rank == 2 else 3
        ctx.allreduce(np.ones(n, np.float32), op=ddl.Sum)

    errors = run_all_raise(3, fn, algorithm=algorithm)
    _assert_mismatch_everywhere(errors, "(3,)", "(4,)", "ranks 0,1:", "rank 2:")
    assert all(str(e) == str(errors[0]) for e in errors)


def test_mismatched_op_dtype_and_name() -> None:
    cases: list[tuple[Callable[[Context], Any], tuple[str, ...]]] = [
        (lambda ctx: ctx.allreduce(np.ones(3), op=ddl.Max if ctx.topology.rank == 1 else ddl.Sum),
         ("SUM", "MAX", "ranks 0,2,3:", "rank 1:")),
        (lambda ctx: ctx.allreduce(np.ones(3, np.float32 if ctx.topology.rank else np.float64), op=ddl.Sum),
         ("float32", "float64", "rank 0:", "ranks 1,2,3:")),
        (lambda ctx: ctx.broadcast(np.ones(3), root_rank=ctx.topology.rank % 2),
         ("broadcast", "ranks 0,2:", "ranks 1,3:")),
        (lambda ctx: ctx.allgather(np.ones((1, 2 + ctx.topology.rank // 2))),
         ("(2,)", "(3,)", "ranks 0,1:", "ranks 2,3:")),
        (lambda ctx: ctx.reducescatter(np.ones((4, 2)), op=ddl.Sum if ctx.topology.rank else ddl.Min),
         ("reducescatter", "MIN", "SUM")),
        (lambda ctx: ctx.grouped_allreduce([np.ones(2), np.ones(1 + (ctx.topology.rank == 3))]),
         ("grouped_allreduce(#1, ((2,), (1,))", "ranks 0,1,2:", "rank 3:", "((2,), (2,))")),
    ]
    for fn, needles in cases:
        _assert_mismatch_everywhere(run_all_raise(4, fn, algorithm="ring"), *needles)


def test_mismatched_collective_kinds() -> None:
    def fn(ctx: Context) -> None:
        x = np.ones(3)
        if ctx.topology.rank == 0:
            ctx.allreduce(x, op=ddl.Sum)
        else:
            ctx.broadcast(x, root_rank=0)

    errors = run_all_raise(2, fn)
    _assert_mismatch_everywhere(errors, "allreduce(", "broadcast(", "rank 0:", "rank 1:")

    def fn3(ctx: Context) -> None:
        [lambda: ctx.barrier(), lambda: ctx.allgather_object(1), lambda: ctx.allgather(np.ones(1))][ctx.topology.rank]()

    _assert_mismatch_everywhere(run_all_raise(3, fn3), "barrier(", "allgather_object(", "allgather(")


def test_ranks_recover_after_mismatch() -> None:
    def fn(ctx: Context) -> tuple[bool, np.ndarray]:
        raised = False
        try:
            ctx.allreduce(np.ones(2 + ctx.topology.rank), op=ddl.Sum)
        except ddl.MismatchError:
            raised = True
        return raised, ctx.allreduce(np.ones(5), op=ddl.Sum)

    for raised, out in run_ctx(3, fn, algorithm="ring"):
        assert raised
        np.testing.assert_array_equal(out, np.full(5, 3.0))
