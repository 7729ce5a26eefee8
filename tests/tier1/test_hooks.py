"""Communication hooks on fake ranks: the Future chain, apply_hook, PowerSGD's arithmetic and state, HookedBuckets."""

from __future__ import annotations

import math

import numpy as np
import pytest

import ddl
from ddl.base.config import Config
from ddl.engine.collectives import Collectives
from ddl.engine.compression import Compression
from ddl.engine.handle import Handle
from ddl.engine.hooked import HookedBuckets
from ddl.engine.hooks import (
    Future,
    GradBucket,
    apply_hook,
    as_hook,
    is_identity,
    matrix_shape,
    traffic,
)
from ddl.engine.powersgd import PowerSGD
from ddl.testing import run_engines

CFG = Config(segment_bytes=1 << 16, stall_timeout=20.0, calibration="off")
#: A linear weight, its bias, a torch conv kernel (out, in, kh, kw), a vector, a thin matrix.
SHAPES = ((12, 7), (12,), (6, 3, 3, 3), (5,), (30, 2))


def _grads(rank: int, step: int, shapes: tuple[tuple[int, ...], ...] = SHAPES) -> np.ndarray:
    rng = np.random.default_rng([rank, step])
    return np.concatenate([rng.standard_normal(math.prod(s)) for s in shapes]).astype(np.float32)


def _done(value: object) -> Handle:
    h = Handle("x")
    h.set_result(value)
    return h


# -- the Future chain ----------------------------------------------------------------------
def test_future_runs_its_steps_in_order_and_returns_the_last_value() -> None:
    seen = []
    f = Future(_done(2)).then(lambda v: seen.append(v) or _done(v * 10)).then(lambda v: v + 1)
    assert f.wait() == 21 and seen == [2]


def test_future_done_moves_on_without_blocking_and_stops_at_a_pending_handle() -> None:
    pending = Handle("p")
    started = []
    f = Future(_done(1)).then(lambda v: started.append(v) or pending).then(lambda v: v * 3)
    assert not f.done() and started == [1]  # the second collective was started by polling
    pending.set_result(5)
    assert f.done() and f.wait() == 15


def test_future_raises_a_step_error_on_wait_and_counts_as_done() -> None:
    f = Future(_done(1)).then(lambda v: 1 / 0)
    assert f.done()
    with pytest.raises(ZeroDivisionError):
        f.wait()


# -- buckets and hooks ----------------------------------------------------------------------
def test_grad_bucket_checks_its_layout() -> None:
    with pytest.raises(ValueError, match="shapes hold 6 elements but the buffer has 5"):
        GradBucket(0, "b", np.zeros(5, np.float32), ((2, 3),), ddl.Average, None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Average or ddl.Sum"):
        GradBucket(0, "b", np.zeros(6, np.float32), ((2, 3),), ddl.Max, None)  # type: ignore[arg-type]
    b = GradBucket(0, "b", np.arange(8, dtype=np.float32), ((2, 3), (2,)), ddl.Sum, None)  # type: ignore[arg-type]
    assert [t.shape for t in b.tensors()] == [(2, 3), (2,)] and b.tensors()[1].tolist() == [6.0, 7.0]


def test_matrix_shape_takes_the_output_dimension_first_in_torch_and_last_in_keras() -> None:
    assert matrix_shape((6, 3, 3, 3), 0) == (6, 27)
    assert matrix_shape((3, 3, 4, 8), -1) == (36, 8)
    assert matrix_shape((5,), 0) is None


def test_as_hook_takes_compressors_and_stateful_hooks_and_refuses_the_rest() -> None:
    assert as_hook(None) is Compression.none and as_hook("fp16") is Compression.fp16
    assert is_identity(as_hook(None)) and not is_identity(Compression.fp16)
    hook = PowerSGD(rank=2)
    assert as_hook(hook) is hook and not is_identity(hook)
    with pytest.raises(ValueError, match="PowerSGD"):
        as_hook("topk")


def test_apply_hook_with_a_compressor_is_the_engine_allreduce_in_place() -> None:
    def fn(c: Collectives) -> tuple[bool, np.ndarray]:
        x = _grads(c.topology.rank, 0)
        bucket = GradBucket(0, "b0", x.copy(), SHAPES, ddl.Average, c)
        out = apply_hook(Compression.none, None, bucket).wait()
        return out is bucket.buffer, out - c.allreduce(x, name="plain")

    for same, diff in run_engines(3, fn, config=CFG):
        assert same and not diff.any()


# -- PowerSGD --------------------------------------------------------------------------------
@pytest.mark.parametrize("out_axis", [0, -1])
def test_powersgd_at_full_rank_without_error_feedback_is_the_plain_average(out_axis: int) -> None:
    """P = M Q spans every column of the averaged M when r >= min(n, m): P Qᵀ is that average."""
    hook = PowerSGD(rank=40, start_iter=0, min_compression_rate=0, error_feedback=False)

    def fn(c: Collectives) -> list[float]:
        state, worst = hook.new_state(), []
        for step in range(3):
            x = _grads(c.topology.rank, step)
            out = apply_hook(hook, state, GradBucket(0, "b0", x.copy(), SHAPES, ddl.Average, c, out_axis)).wait()
            worst.append(float(np.abs(out - c.allreduce(x, name=f"plain{step}")).max()))
        assert state.compression_stats()["compressed_calls"] == 3
        return worst

    for worst in run_engines(3, fn, config=CFG):
        assert max(worst) < 1e-5, worst


def test_powersgd_compresses_gives_every_rank_the_same_bits_and_loses_nothing_with_error_feedback() -> None:
    """With error feedback, the outputs so far plus the ranks' mean error are the sum of the
    plain averages (each rank keeps exactly what it did not send)."""
    hook = PowerSGD(rank=1, start_iter=2)

    def fn(c: Collectives) -> tuple[list[np.ndarray], np.ndarray, np.ndarray, dict[str, float], int]:
        state = hook.new_state()
        outs, total = [], np.zeros(sum(math.prod(s) for s in SHAPES), np.float64)
        for step in range(6):
            x = _grads(c.topology.rank, step)
            outs.append(apply_hook(hook, state, GradBucket(0, "b0", x.copy(), SHAPES, ddl.Average, c)).wait().copy())
            total += c.allreduce(x, name=f"plain{step}")
        mem = next(iter(state.buckets.values()))
        error = np.zeros_like(total)
        assert mem.errors is not None
        for part, e in zip(mem.compressed, mem.errors, strict=True):
            error[part.offset : part.offset + part.size] = e.reshape(-1)
        mean_error = c.allreduce(error, name="errors")
        return outs, total, mean_error, state.compression_stats(), c.ctx.comm.wire_bytes  # type: ignore[attr-defined]

    results = run_engines(3, fn, config=CFG)
    outs, total, mean_error, stats, _ = results[0]
    for other in results[1:]:
        assert all(np.array_equal(a, b) for a, b in zip(outs, other[0], strict=True)), "ranks got different bits"
    np.testing.assert_allclose(np.sum(outs, axis=0) + mean_error, total, atol=1e-4)
    plain = _grads(0, 5)
    assert not np.allclose(outs[-1], plain, atol=1e-3)  # compressed: not the plain average
    assert stats["iteration"] == 6 and stats["compressed_calls"] == 4
    # rank 1: (12,7) and (6,27) go as 12+7 and 6+27; (30,2) would save too little (60 < 2 x 32)
    # and travels as it is, with the vectors.
    assert stats["compression_rate"] == pytest.approx((84 + 12 + 162 + 5 + 60) / (19 + 12 + 33 + 5 + 60))


def test_powersgd_start_iter_is_the_plain_allreduce_bit_for_bit() -> None:
    hook = PowerSGD(rank=1, start_iter=2)

    def fn(c: Collectives) -> list[bool]:
        state, same = hook.new_state(), []
        for step in range(3):
            x = _grads(c.topology.rank, step)
            out = apply_hook(hook, state, GradBucket(0, "b0", x.copy(), SHAPES, ddl.Average, c)).wait()
            same.append(bool(np.array_equal(out, c.allreduce(x, name=f"plain{step}"))))
        return same

    assert run_engines(2, fn, config=CFG) == [[True, True, False]] * 2


def test_powersgd_traffic_is_what_it_sends() -> None:
    hook = PowerSGD(rank=2)
    t = traffic(hook, SHAPES, 4)
    # P: 12x2 + 6x2 + 30x2 (compressed) + 12 + 5 (vectors); Q: 7x2 + 27x2 + 2x2... (30, 2) has rank 2:
    # 60 > 2 * 32 * 2 is false, so it travels uncompressed with the P matrices.
    assert [r.count for r in t.rounds] == [24 + 12 + 12 + 5 + 60, 14 + 54]
    assert t.flops > 0 and t.memory_bytes > 0
    assert traffic(Compression.fp16, SHAPES, 4).rounds[0].itemsize == 2
    assert traffic(PowerSGD(rank=8), [(5,), (4, 4)], 4).rounds[0].count == 21  # nothing worth compressing: one round


def test_powersgd_refuses_bad_settings_and_integer_buckets() -> None:
    with pytest.raises(ValueError, match="rank must be an integer >= 1"):
        PowerSGD(rank=0)
    with pytest.raises(ValueError, match="start_iter"):
        PowerSGD(start_iter=-1)
    with pytest.raises(ValueError, match="min_compression_rate"):
        PowerSGD(min_compression_rate=-1)
    hook = PowerSGD()
    bucket = GradBucket(0, "ints", np.zeros(6, np.int64), ((2, 3),), ddl.Sum, None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="floating-point values; bucket 'ints' holds int64"):
        apply_hook(hook, hook.new_state(), bucket)


def test_powersgd_state_dict_keeps_counts_and_q_and_restarts_the_errors() -> None:
    hook = PowerSGD(rank=1, start_iter=1)

    def fn(c: Collectives) -> tuple[bool, bool, bool]:
        state = hook.new_state()
        for step in range(3):
            apply_hook(hook, state, GradBucket(0, "b0", _grads(c.topology.rank, step), SHAPES, ddl.Average, c)).wait()
        saved = state.state_dict()
        fresh = hook.new_state()
        fresh.load_state_dict(saved)
        apply_hook(hook, fresh, GradBucket(0, "b0", _grads(c.topology.rank, 9), SHAPES, ddl.Average, c)).wait()
        mem, old = next(iter(fresh.buckets.values())), next(iter(state.buckets.values()))
        state.load_state_dict(saved)  # an existing state: errors zero, counts and Q kept
        return mem.calls == 4, old.errors is None and old.calls == 3, np.array_equal(saved["buckets"][(0, "float32",
                                                                                                        SHAPES)]["qs"][0],
                                                                                      old.qs[0])

    assert run_engines(2, fn, config=CFG) == [(True, True, True)] * 2


# -- HookedBuckets ----------------------------------------------------------------------------
class HeldHook:
    """A user-written stateful hook: sums the bucket locally, and finishes only when released."""

    name = "held"

    def new_state(self) -> dict[str, object]:
        return {"calls": 0, "gate": Handle("gate")}

    def __call__(self, state: dict[str, object], bucket: GradBucket) -> Future:
        state["calls"] = int(state["calls"]) + 1  # type: ignore[call-overload]
        return Future(state["gate"]).then(lambda _: bucket.buffer * 2)

    def traffic(self, shapes: object, itemsize: int, *, out_axis: int = 0) -> object:
        raise NotImplementedError


def test_hooked_buckets_reduce_a_list_by_dtype() -> None:
    shapes = [(4, 3), (3,), (5,)]
    dtypes = [np.float32, np.float32, np.float64]

    def fn(c: Collectives) -> list[np.ndarray]:
        hb = HookedBuckets(shapes, dtypes, hook=Compression.none, name="list", cap_bytes=1 << 20)
        assert len(hb._buckets) == 2  # one per dtype
        for view, s in zip(hb.views(), shapes, strict=True):
            view[...] = np.full(s, c.topology.rank + 1.0)
        return [v.copy() for v in hb.start(c).wait()]

    for outs in run_engines(2, fn, config=CFG):
        assert [o.dtype for o in outs] == [np.float32, np.float32, np.float64]
        assert all(np.all(o == 1.5) for o in outs)


def test_hooked_buckets_run_a_user_hook_with_its_state_and_refuse_a_second_start_in_flight() -> None:
    hook = HeldHook()
    hb = HookedBuckets([(2, 2), (3,)], [np.float32, np.float32], hook=hook, name="held")
    for view in hb.views():
        view[...] = 1.0
    pending = hb.start(None)  # type: ignore[arg-type] # the hook issues no collective
    assert not pending.done() and hb.state["calls"] == 1
    with pytest.raises(RuntimeError, match="still in flight"):
        hb.start(None)  # type: ignore[arg-type]
    hb.state["gate"].set_result(None)
    assert [v.tolist() for v in pending.wait()] == [[[2.0, 2.0], [2.0, 2.0]], [2.0, 2.0, 2.0]]


# -- PowerSGD across skipped steps, loss scales and resumes (issue 44) -------------------------
def _call(hook: PowerSGD, state: object, x: np.ndarray, c: Collectives, name: str = "b0") -> np.ndarray:
    return apply_hook(hook, state, GradBucket(0, name, x.copy(), SHAPES, ddl.Average, c)).wait().copy()


def test_powersgd_a_non_finite_round_is_non_finite_on_every_rank_and_changes_nothing() -> None:
    """One rank's overflow: every rank gets NaN in the compressed weights (a scaler skips the
    step), and the state is as if the call never happened: no inf or NaN is kept."""
    hook = PowerSGD(rank=1, start_iter=0)

    def fn(c: Collectives) -> tuple[bool, bool, bool, int]:
        rank = c.topology.rank
        state, clean = hook.new_state(), hook.new_state()
        for step in range(2):
            _call(hook, state, _grads(rank, step), c)
            _call(hook, clean, _grads(rank, step), c)
        bad = _grads(rank, 2)
        if rank == 1:
            bad[3] = np.inf
        out = _call(hook, state, bad, c)
        mem = next(iter(state.buckets.values()))
        nan_where_compressed = all(np.isnan(out[p.offset : p.offset + p.size]).all() for p in mem.compressed)
        finite_state = all(np.isfinite(q).all() for q in mem.qs) and all(np.isfinite(e).all() for e in mem.errors or [])
        after, expected = _call(hook, state, _grads(rank, 3), c), _call(hook, clean, _grads(rank, 3), c)
        return nan_where_compressed, finite_state, bool(np.array_equal(after, expected)), state.skipped

    assert run_engines(2, fn, config=CFG) == [(True, True, True, 1)] * 2


def test_powersgd_deferred_updates_wait_for_commit_and_a_step_not_taken_is_dropped() -> None:
    hook = PowerSGD(rank=1, start_iter=1)

    def fn(c: Collectives) -> tuple[bool, int, int]:
        rank = c.topology.rank
        taken, skipping = hook.new_state(), hook.new_state()
        skipping.deferred = True
        for step in range(3):
            _call(hook, taken, _grads(rank, step), c)
            _call(hook, skipping, _grads(rank, step), c)
            skipping.commit()
        _call(hook, skipping, _grads(rank, 99), c)  # reduced, and its step not taken: no commit
        calls = next(iter(skipping.buckets.values())).calls
        same = np.array_equal(_call(hook, taken, _grads(rank, 3), c), _call(hook, skipping, _grads(rank, 3), c))
        return same, calls, skipping.skipped

    assert run_engines(2, fn, config=CFG) == [(True, 3, 1)] * 2


def test_powersgd_error_memory_follows_the_loss_scale_bit_for_bit() -> None:
    """Values scaled by a power of two that changes every step, with ``loss_scale`` set: the
    outputs are the unscaled run's times the scale, exactly."""
    hook = PowerSGD(rank=1, start_iter=1)
    scales = [1024.0, 2048.0, 512.0, 512.0, 4096.0, 8.0]

    def fn(c: Collectives) -> bool:
        rank = c.topology.rank
        plain, scaled = hook.new_state(), hook.new_state()
        same = True
        for step, s in enumerate(scales):
            x = _grads(rank, step)
            scaled.loss_scale = s
            same &= np.array_equal(_call(hook, plain, x, c) * np.float32(s), _call(hook, scaled, x * np.float32(s), c))
        return bool(same)

    assert run_engines(2, fn, config=CFG) == [True, True]


def test_powersgd_errors_travel_with_the_state_and_a_resume_continues_exactly() -> None:
    """state_dict + errors_state_dict into a fresh state: the next outputs equal the continuing
    run's; without errors they differ (a resume that drops them is not the same run)."""
    hook = PowerSGD(rank=1, start_iter=1)

    def fn(c: Collectives) -> tuple[bool, bool]:
        rank = c.topology.rank
        state = hook.new_state()
        state.loss_scale = 256.0
        for step in range(3):
            _call(hook, state, _grads(rank, step) * np.float32(256.0), c)
        shared, errors = state.state_dict(), state.errors_state_dict()
        resumed, forgetful = hook.new_state(), hook.new_state()
        resumed.load_state_dict(shared, errors)
        forgetful.load_state_dict(shared)
        x = _grads(rank, 3) * np.float32(256.0)
        want = _call(hook, state, x, c)
        return (bool(np.array_equal(want, _call(hook, resumed, x, c))),
                bool(np.array_equal(want, _call(hook, forgetful, x, c))))

    assert run_engines(2, fn, config=CFG) == [(True, False)] * 2
