"""The engine's fast paths on fake ranks: the lean synchronous allreduce and grouped submission."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import ddl
from ddl.engine import codec, fusion
from ddl.engine import engine as engine_module
from ddl.engine.collectives import Collectives
from ddl.engine.engine import Engine
from ddl.engine.fusion import Request
from ddl.testing import run_engines


def _count_requests(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of every request queued through ``Engine.submit`` (the lean path queues none).

    Idle cycles are turned off meanwhile: the background thread holding the baton for
    one makes a lean call step aside (rightly), which would make the count flaky.
    """
    monkeypatch.setattr(engine_module, "_IDLE_MIN", 3600.0)
    monkeypatch.setattr(engine_module, "_IDLE_MAX", 3600.0)
    made: list[str] = []
    real = Engine.submit

    def spy(self: Engine, req: Request, **kwargs: Any) -> Any:
        made.append(req.name)
        return real(self, req, **kwargs)

    monkeypatch.setattr(Engine, "submit", spy)
    return made


# -- the lean synchronous path ----------------------------------------------------------


@pytest.mark.parametrize("size", [2, 3, 5, 17])
def test_small_synchronous_allreduces_take_the_lean_path(monkeypatch: pytest.MonkeyPatch, size: int) -> None:
    """Sum, Average, Max, in place and not, int and float: right results, bit-identical to
    the queued inline path, one inline cycle each and no Request built."""
    made = _count_requests(monkeypatch)

    def fn(c: Collectives) -> tuple[list[np.ndarray], int]:
        r = c.topology.rank
        rng = np.random.default_rng(r)
        x = rng.standard_normal((3, 5)).astype(np.float32)
        inplace = x.copy()
        for op, a in ((ddl.Sum, x), (ddl.Average, x), (ddl.Max, np.arange(6))):
            c.allreduce(a, op=op, name="warm-up")  # a (dtype, op) is checked once, on the queued path
        cycles = c.engine.inline_cycles
        out = [
            c.allreduce(x, op=ddl.Sum),
            c.allreduce(x, op=ddl.Average, name="avg"),
            c.allreduce(np.arange(6, dtype=np.int64) * (r + 1), op=ddl.Max),
            c.allreduce_(inplace, op=ddl.Sum),
            x[:, ::2].copy(),  # a non-contiguous input
        ]
        out[-1] = c.allreduce(x[:, ::2], op=ddl.Sum)
        lean = c.engine.inline_cycles - cycles
        # The queued path (async) on the same input: the same bits.
        out.append(c.allreduce_async(x, op=ddl.Sum, name="queued").wait())
        assert inplace is out[3] or np.shares_memory(inplace, out[3])
        return out, lean

    results = run_engines(size, fn)
    xs = [np.random.default_rng(q).standard_normal((3, 5)).astype(np.float32) for q in range(size)]
    total = xs[0].copy()
    for x in xs[1:]:
        total += x  # rank order, in float32: what every path must give, bit for bit
    for out, lean in results:
        assert lean == 5
        np.testing.assert_array_equal(out[0], total)
        np.testing.assert_array_equal(out[1], total / size)
        np.testing.assert_array_equal(out[2], np.arange(6) * size)
        np.testing.assert_array_equal(out[3], total)
        np.testing.assert_array_equal(out[4], total[:, ::2])
        np.testing.assert_array_equal(out[5], total)
        assert out[0].shape == (3, 5) and out[0].dtype == np.float32
    # Past the warm-up, only the async call built a Request.
    assert set(made) <= {"warm-up", "queued"} and made.count("queued") == size


def test_lean_call_meets_a_rank_that_queued_other_work_first() -> None:
    """Rank 0 calls synchronously (lean) while rank 1 still has an async request of another
    name pending: the lean cycle falls back to the queue, and both finish right."""

    def fn(c: Collectives) -> tuple[float, float]:
        r = c.topology.rank
        if r == 1:
            h = c.allreduce_async(np.full(4, 10.0), op=ddl.Sum, name="other")
            with c.engine._baton:  # hold cycles back: the request stays pending until the lean call
                pass
            a = c.allreduce(np.full(4, 1.0 + r), op=ddl.Sum, name="sync")
            b = h.wait()
        else:
            a = c.allreduce(np.full(4, 1.0 + r), op=ddl.Sum, name="sync")
            b = c.allreduce(np.full(4, 10.0), op=ddl.Sum, name="other")
        return float(a[0]), float(b[0])

    assert run_engines(2, fn) == [(3.0, 20.0), (3.0, 20.0)]


def test_lean_calls_that_do_not_match_raise_a_mismatch_on_every_rank() -> None:
    def fn(c: Collectives) -> BaseException | None:
        shape = (4,) if c.topology.rank else (5,)
        try:
            c.allreduce(np.ones(shape), op=ddl.Sum, name="w")
        except ddl.MismatchError as exc:
            return exc
        return None

    errors = run_engines(3, fn)
    assert all(isinstance(e, ddl.MismatchError) and "'w'" in str(e) and "(5,)" in str(e) for e in errors)


def test_lean_calls_from_two_threads_never_mix() -> None:
    """Two threads per rank race for the baton with unnamed small allreduces: each result is
    its own thread's sum (the lean path keeps names per thread, and steps aside when busy)."""

    def fn(c: Collectives) -> list[str]:
        r, wrong = c.topology.rank, []

        def worker(tag: int) -> None:
            for i in range(60):
                got = c.allreduce(np.full(3, 100.0 * tag + i + r), op=ddl.Sum)
                want = sum(100.0 * tag + i + q for q in range(c.topology.size))
                if got[0] != want:
                    wrong.append(f"thread {tag} call {i}: {got[0]} != {want}")

        threads = [threading.Thread(target=worker, args=(t,), name=f"w{t}") for t in (1, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return wrong

    assert run_engines(3, fn) == [[], [], []]


def test_the_lean_path_takes_half_types_and_compression_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """Half types (summed in float32) and compressed calls run in the caller's one cycle as
    well, with the bits the queued path gives."""
    made = _count_requests(monkeypatch)

    def fn(c: Collectives) -> list[np.ndarray]:
        r = c.topology.rank
        half = np.full(8, 0.5 + r, np.float16)
        wide = np.linspace(0, 1, 3000, dtype=np.float32) * (r + 1)
        out = []
        for _ in range(2):  # the second time, the (dtype, op) has passed the checks
            out.append(c.allreduce(half, op=ddl.Sum))
            out.append(c.allreduce(wide, op=ddl.Average, compression=ddl.Compression.fp16))
        out.append(c.allreduce_async(half, op=ddl.Sum, name="q1").wait())
        out.append(c.allreduce_async(wide, op=ddl.Average, compression=ddl.Compression.fp16, name="q2").wait())
        return out

    results = run_engines(2, fn)
    for out in results:
        assert out[0].dtype == np.float16 and out[1].dtype == np.float32
        np.testing.assert_array_equal(out[0], out[4])  # lean == queued, bit for bit
        np.testing.assert_array_equal(out[1], out[5])
        np.testing.assert_array_equal(out[0], np.full(8, 2.0, np.float16))
    np.testing.assert_array_equal(results[0][1], results[1][1])
    assert set(made) == {"q1", "q2"}  # nothing else was queued


@pytest.mark.parametrize("algorithm", [None, "ring", "mpi", "halving_doubling"])
def test_larger_synchronous_allreduces_run_at_once_as_their_own_bucket(
        monkeypatch: pytest.MonkeyPatch, algorithm: str | None) -> None:
    """Past the record's 4 KiB: one negotiation cycle, then the algorithm on this tensor alone,
    in place for allreduce_; nothing queued once the (dtype, op) and algorithm passed."""
    made = _count_requests(monkeypatch)

    def fn(c: Collectives) -> tuple[bool, bool]:
        r = c.topology.rank
        x = np.arange(3000, dtype=np.float64).reshape(30, 100) * (r + 1)
        c.allreduce(x, op=ddl.Sum, algorithm=algorithm, name="warm-up")
        c.allreduce(x, op=ddl.Average, algorithm=algorithm, name="warm-up-avg")
        y = c.allreduce(x, op=ddl.Sum, algorithm=algorithm)
        z = x.copy()
        w = c.allreduce_(z, op=ddl.Average, algorithm=algorithm)
        want = np.arange(3000, dtype=np.float64).reshape(30, 100) * sum(range(1, c.topology.size + 1))
        return bool(np.array_equal(y, want) and y.shape == (30, 100)), bool(w is z and np.allclose(z, want / c.topology.size))

    assert run_engines(3, fn) == [(True, True)] * 3
    assert set(made) <= {"warm-up", "warm-up-avg"}


def _compact_from_17(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compact exchange from 17 ranks (it starts at 65): 17 fake ranks run it."""
    monkeypatch.setattr(codec, "COMPACT_FROM", 17)


@pytest.mark.parametrize("compact", [True, False])
def test_lean_path_at_17_ranks_runs_without_a_queue(monkeypatch: pytest.MonkeyPatch, compact: bool) -> None:
    """At 17 ranks the cycle gathers 128-byte records (an 8 B call rides in them) or, in the
    compact exchange, is a MIN-allreduce with no payloads; either way a synchronous call
    runs in one cycle with nothing queued."""
    if compact:
        _compact_from_17(monkeypatch)
    made = _count_requests(monkeypatch)

    def fn(c: Collectives) -> tuple[float, float, float, bool, int]:
        c.allreduce(np.ones(2), op=ddl.Sum, name="warm-up")
        inline = c.engine.inline_cycles
        a = float(c.allreduce(np.ones(11), op=ddl.Sum)[0])  # 88 B: a record's whole payload
        b = float(c.allreduce(np.ones(12), op=ddl.Sum)[-1])  # 96 B: its own allreduce after the cycle
        d = float(c.allreduce(np.full(600, 1.0), op=ddl.Sum)[-1])
        return a, b, d, c.engine.exchange.compact, c.engine.inline_cycles - inline

    results = run_engines(17, fn)
    # Only the 88-byte call rides in a record, and only where there are records.
    assert results == [(17.0, 17.0, 17.0, compact, 0 if compact else 1)] * 17
    assert set(made) <= {"warm-up"}


def test_shared_records_at_17_ranks_carry_a_4_kib_call() -> None:
    """Records through shared memory (one node) keep 4 KiB at 17 ranks: a 4 KiB call rides
    in them (one exchange), where gathered over MPI it would need its own allreduce."""
    def fn(c: Collectives) -> tuple[int, float, float, int]:
        c.allreduce(np.ones(2), op=ddl.Sum, name="warm-up")
        inline = c.engine.inline_cycles
        a = float(c.allreduce(np.full(512, 1.0), op=ddl.Sum)[-1])  # 4 KiB
        b = float(c.allreduce(np.full(513, 1.0), op=ddl.Sum)[-1])  # one element more: its own allreduce
        return c.engine.exchange.record_bytes, a, b, c.engine.inline_cycles - inline

    assert run_engines(17, fn, shared_records=True) == [(4136, 17.0, 17.0, 1)] * 17


def test_small_records_at_two_ranks_read_the_peer_at_their_own_stride(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ranks' lean exchange reads rank 1's words a record apart, whatever the record's size."""
    monkeypatch.setattr(codec, "SMALL_RECORDS_FROM", 2)

    def fn(c: Collectives) -> tuple[int, float, float, int]:
        c.allreduce(np.ones(2), op=ddl.Sum, name="warm-up")
        inline = c.engine.inline_cycles
        a = float(c.allreduce(np.ones(2), op=ddl.Sum)[0])
        b = float(c.allreduce_(np.ones(1024), op=ddl.Sum)[-1])
        return c.engine.exchange.record_bytes, a, b, c.engine.inline_cycles - inline

    assert run_engines(2, fn) == [(128, 2.0, 2.0, 1)] * 2


@pytest.mark.parametrize("compact", [True, False])
def test_a_lean_call_at_17_ranks_meets_a_rank_with_other_work(monkeypatch: pytest.MonkeyPatch, compact: bool) -> None:
    if compact:
        _compact_from_17(monkeypatch)

    def fn(c: Collectives) -> tuple[float, float]:
        r = c.topology.rank
        if r == 5:
            h = c.allreduce_async(np.full(4, 10.0), op=ddl.Sum, name="other")
            a = c.allreduce(np.full(4, 1.0), op=ddl.Sum, name="sync")
            b = h.wait()
        else:
            a = c.allreduce(np.full(4, 1.0), op=ddl.Sum, name="sync")
            b = c.allreduce(np.full(4, 10.0), op=ddl.Sum, name="other")
        return float(a[0]), float(b[0])

    results = run_engines(17, fn, config=ddl.base.config.Config(algorithm="ring", segment_bytes=1 << 20))
    assert results == [(17.0, 170.0)] * 17


def test_payloads_reduce_in_rank_order() -> None:
    parts = [np.array([1e8], np.float32), np.array([1.0], np.float32), np.array([-1e8], np.float32)]
    # (1e8 + 1) rounds to 1e8 in float32, then - 1e8 = 0: rank order, not sorted or pairwise.
    assert fusion.reduce_payloads(parts, ddl.Sum, None)[0] == 0.0


@pytest.mark.parametrize("shape", [(), (3,), (2, 5)])
def test_stacked_payloads_reduce_to_the_same_bits_as_one_by_one(shape: tuple[int, ...]) -> None:
    """A lane at many ranks reduces one strided array of the records' payloads with the
    ufunc's accumulate: each rank's part added to the sum of those before it, as the list does."""
    p, record = 33, 128
    rng = np.random.default_rng(7)
    # Magnitudes from 1e-3 to 1e8: adding them in another order gives other bits.
    spread = (rng.standard_normal((p, *shape)) * 10.0 ** rng.integers(-3, 9, (p, *shape))).astype(np.float32)
    near_one = (1 + rng.standard_normal((p, *shape)) / 8).astype(np.float32)  # products that stay finite
    for op, average, values in ((np.add, False, spread), (np.add, True, spread), (np.maximum, False, spread),
                                (np.multiply, False, near_one)):
        records = np.zeros(p * record, np.uint8)
        for q in range(p):
            records[q * record + 40 : q * record + 40 + values[q].nbytes] = values[q].reshape(-1).view(np.uint8)
        stacked = np.ndarray((p, *shape), np.float32, buffer=records, offset=40,
                             strides=(record, *np.empty(shape, np.float32).strides))
        want = fusion.reduce_with([values[q] for q in range(p)], op, average, None)
        into = np.empty(shape, np.float32)
        got = fusion.reduce_with(stacked, op, average, into)
        assert got is into and got.shape == shape
        np.testing.assert_array_equal(got, want)
        assert np.array_equal(fusion.reduce_with(stacked, op, average, None), want)


# -- grouped submission -----------------------------------------------------------------


def test_grouped_allreduce_async_is_one_request_per_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    made = _count_requests(monkeypatch)

    def fn(c: Collectives) -> list[np.ndarray]:
        r = c.topology.rank
        xs = [np.full((2, 3), r, np.float32), np.full(5, r, np.int64), np.full(4, 2 * r, np.float32)]
        h = c.grouped_allreduce_async(xs, op=ddl.Sum, name="g")
        xs[0][...] = 99  # copied at the call: changing the input now changes nothing
        return h.wait()  # type: ignore[no-any-return]

    for out in run_engines(3, fn):
        np.testing.assert_array_equal(out[0], np.full((2, 3), 3.0))
        np.testing.assert_array_equal(out[1], np.full(5, 3))
        np.testing.assert_array_equal(out[2], np.full(4, 6.0))
        assert [o.dtype for o in out] == [np.float32, np.int64, np.float32]
    assert sorted(set(made)) == ["g<float32>", "g<int64>"] and len(made) == 6


def test_grouped_allreduce_of_many_tensors_reduces_one_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    """256 small tensors: one bucket, whose results are views of it in the input shapes."""
    from ddl.engine.context import Context

    buffers: list[int] = []
    real = Context.allreduce_flat

    def spy(self: Context, buf: np.ndarray, *args: Any, **kwargs: Any) -> None:
        buffers.append(buf.size)
        real(self, buf, *args, **kwargs)

    monkeypatch.setattr(Context, "allreduce_flat", spy)

    def fn(c: Collectives) -> bool:
        r = c.topology.rank
        xs = [np.full((4, 4), i + r, np.float64) for i in range(256)]
        out = c.grouped_allreduce(xs, op=ddl.Average, algorithm="ring")
        base = out[0].base if out[0].base is not None else out[0]
        return all(o.shape == (4, 4) and np.all(o == i + 0.5) and np.shares_memory(o, base)
                   for i, o in enumerate(out))

    assert run_engines(2, fn) == [True, True]
    assert buffers == [256 * 16] * 2


def test_grouped_allreduce_refuses_a_non_list_on_every_rank() -> None:
    def fn(c: Collectives) -> BaseException | None:
        try:
            c.grouped_allreduce(np.ones(3) if c.topology.rank == 0 else [np.ones(3)])  # type: ignore[arg-type]
        except (TypeError, ddl.RemoteError) as exc:
            return exc
        return None

    own, other = run_engines(2, fn)
    assert isinstance(own, TypeError) and "list of arrays" in str(own)
    assert isinstance(other, ddl.RemoteError) and "rank 0" in str(other)


@pytest.mark.parametrize("size", [2, 3, 17])
def test_repeated_small_calls_run_through_a_prepared_lane(monkeypatch: pytest.MonkeyPatch, size: int) -> None:
    """From the second call of a signature on, a small synchronous allreduce runs through its
    lane: no request built, one lane per (dtype, shape, op, in place), the same bits as the
    queued path, and the unnamed-call counter advanced as the queued path advances it."""
    made = _count_requests(monkeypatch)
    lanes: list[str] = []
    real = Engine.run_lane

    def spy(self: Engine, lane: Any, x: np.ndarray, name: str | None) -> Any:
        got = real(self, lane, x, name)
        if got is not None:
            lanes.append(name or "unnamed")
        return got

    monkeypatch.setattr(Engine, "run_lane", spy)

    def fn(c: Collectives) -> tuple[list[np.ndarray], int, str]:
        r = c.topology.rank
        x = np.linspace(-1, 1, 7, dtype=np.float32) * (r + 1)
        out = []
        for _ in range(3):
            out.append(c.allreduce(x, op=ddl.Sum, name=""))  # an empty name is no name, as when queued
            out.append(c.allreduce(x, op=ddl.Average, name="avg"))
            y = x.copy()
            out.append(c.allreduce_(y, op=ddl.Max))
        out.append(c.allreduce_async(x, op=ddl.Sum, name="queued").wait())
        return out, len(c._lanes), c.engine.names.next()

    results = run_engines(size, fn)
    for out, n_lanes, next_name in results:
        assert n_lanes == 3
        assert next_name == "#7"  # six unnamed lane calls counted, as the queued path counts them
        for k in range(0, 9, 3):
            np.testing.assert_array_equal(out[k], out[9])  # lane == queued, bit for bit
    assert made == ["queued"] * size
    assert len(lanes) == 9 * size


def test_a_lane_call_sends_the_digest_the_queued_path_negotiates(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lane hashes a name from its parts (written out for speed): named or counted, the
    digest it sends is the one the queued path computes from the descriptor, so a rank on
    either path meets the others in one cycle."""
    _count_requests(monkeypatch)
    sent: dict[int, list[int]] = {}
    real = codec.Exchange.run_one

    def spy(self: codec.Exchange, digest: int, inline: int, due: bool) -> bool:
        sent.setdefault(self.comm.rank, []).append(digest)
        return real(self, digest, inline, due)

    monkeypatch.setattr(codec.Exchange, "run_one", spy)

    def fn(c: Collectives) -> tuple[list[int], list[int]]:
        x = np.arange(5, dtype=np.float32)
        for _ in range(2):  # the first call of each builds its lane
            c.allreduce(x, op=ddl.Sum)
            c.allreduce(x, op=ddl.Sum, name="named")
        counted = c.engine.names.next()  # what the next unnamed call is called here
        c.allreduce(x, op=ddl.Sum, name=counted)  # keep the ranks' counters alike
        want = [c.engine.digest_of(c._allreduce_request(x, ddl.Sum, name, None, None, False).descriptor)
                for name in ("#2", "named", counted)]
        return sent[c.topology.rank][-3:], want

    for got, want in run_engines(2, fn):
        assert got == [want[0], want[1], want[2]]


def test_a_lane_call_meets_a_rank_on_the_queued_path_and_a_mismatch_on_the_next() -> None:
    """Rank 1 holds an async request when rank 0's lane call arrives: the lane falls back to
    the queue and both finish; a later lane call whose shapes differ is a MismatchError on
    every rank, as on the queued path."""

    def fn(c: Collectives) -> tuple[float, float, str]:
        r = c.topology.rank
        for _ in range(2):
            c.allreduce(np.ones(3), op=ddl.Sum, name="warm")  # both ranks hold a lane for it
        if r == 1:
            h = c.allreduce_async(np.full(4, 10.0), op=ddl.Sum, name="other")
            a = c.allreduce(np.full(3, 1.0 + r), op=ddl.Sum, name="warm")
            b = h.wait()
        else:
            a = c.allreduce(np.full(3, 1.0 + r), op=ddl.Sum, name="warm")
            b = c.allreduce(np.full(4, 10.0), op=ddl.Sum, name="other")
        try:
            c.allreduce(np.ones(3 + r), op=ddl.Sum, name="w")
            c.allreduce(np.ones(3 + r), op=ddl.Sum, name="w")
        except ddl.MismatchError as exc:
            return float(a[0]), float(b[0]), str(exc)
        return float(a[0]), float(b[0]), ""

    for a, b, error in run_engines(2, fn):
        assert (a, b) == (3.0, 20.0)
        assert "'w'" in error and "(3,)" in error and "(4,)" in error


def test_a_large_call_seen_before_builds_the_request_the_checked_path_builds() -> None:
    """``prepared_calls.Prepared``: same descriptor, digest and request fields as
    ``_allreduce_request`` for the same name, named or counted."""
    from ddl.engine import negotiation, prepared_calls

    def fn(c: Collectives) -> list[bool]:
        x = np.ones(5000, np.float32)
        checked = [c._allreduce_request(x, ddl.Average, name, None, None, True) for name in ("g", "#7")]
        prepared = prepared_calls.prepare(checked[0], ddl.Average)
        assert prepared is not None
        out = []
        for want in checked:
            got = prepared.request(x, want.name, True)
            out.append(got.descriptor == want.descriptor and got.digest == negotiation.digest(want.descriptor)
                       and (got.op, got.algorithm, got.compression, got.inplace, got.array is x)
                       == (want.op, want.algorithm, want.compression, want.inplace, True))
        half = c._allreduce_request(x, ddl.Sum, "h", None, None, False, prescale=0.5)
        out.append(prepared_calls.prepare(half, ddl.Sum) is None)  # scaled: the checked path only
        return out

    assert run_engines(2, fn) == [[True, True, True]] * 2


def test_large_calls_seen_before_meet_the_queued_path_and_a_mismatch() -> None:
    """Rank 0 repeats a large unnamed in-place allreduce (prepared from its first call on),
    rank 1 waits on unnamed async handles: the same names, the right sums, in place; then
    shapes that differ under one name are a MismatchError on every rank."""

    def fn(c: Collectives) -> tuple[bool, str]:
        r = c.topology.rank
        ok = True
        for step in range(4):
            x = np.full(3000, float(r + step), np.float64)
            if r == 0:
                got = c.allreduce_(x, op=ddl.Sum)
            else:
                got = c.allreduce_async(x, op=ddl.Sum, inplace=True).wait()
            ok = ok and bool(np.all(got == 2 * step + 1)) and got is x
        try:
            c.allreduce(np.ones(3000 + r), op=ddl.Sum, name="w")
        except ddl.MismatchError as exc:
            return ok, str(exc)
        return ok, ""

    for ok, error in run_engines(2, fn):
        assert ok
        assert "'w'" in error and "(3000,)" in error and "(3001,)" in error


@pytest.mark.parametrize("size", [2, 3, 17])
def test_large_in_place_calls_seen_before_reduce_where_they_lie(monkeypatch: pytest.MonkeyPatch, size: int) -> None:
    """A larger in-place call of a contiguous array builds no request when every rank holds
    it (17 ranks: 128-byte records), and gives the queued path's bits; a strided or
    half-type one takes the request path."""
    made = _count_requests(monkeypatch)
    direct: dict[int, list[str]] = {}
    real = Engine.run_in_place

    def spy(self: Engine, prepared: Any, x: np.ndarray, name: str | None) -> Any:
        got = real(self, prepared, x, name)
        if type(got) is np.ndarray:
            direct.setdefault(self.ctx.topology.rank, []).append(name or "unnamed")
        return got

    monkeypatch.setattr(Engine, "run_in_place", spy)

    def fn(c: Collectives) -> tuple[list[np.ndarray], list[np.ndarray]]:
        r = c.topology.rank
        base = np.linspace(-3, 5, 3001, dtype=np.float32) * (r + 1)
        got, want = [], []
        for op in (ddl.Sum, ddl.Average):
            for _ in range(3):
                x = base.copy()
                assert c.allreduce_(x, op=op, name="g") is x
                got.append(x)
            got.append(c.allreduce_(base.copy(), op=op))  # unnamed: counted names
            got.append(c.allreduce_(base.copy(), op=op))
        strided = np.zeros(6002, np.float32)
        for _ in range(2):
            strided[::2] = base
            c.allreduce_(strided[::2], op=ddl.Sum, name="strided")
        for _ in range(2):
            c.allreduce_(base.astype(np.float16), op=ddl.Sum, name="half")
        # The queued reference last: the engine thread it wakes may still hold the baton
        # when the next call comes, which then (rightly) queues too.
        for op in (ddl.Sum, ddl.Average):
            want.append(c.allreduce_async(base.copy(), op=op, name="queued", inplace=True).wait())
        return got, want

    for got, want in run_engines(size, fn):
        for k, x in enumerate(got):
            np.testing.assert_array_equal(x, want[k // 5])  # direct == queued, bit for bit
    # Per rank: every contiguous float32 call ran directly (a first call too: its checks
    # build a request that is never queued); the strided and the half-type calls did not.
    # (17 threads on 2 cores: a call finding the engine thread in a cycle rightly queues.)
    if size < 17:
        assert made == ["queued"] * 2 * size
    for rank in range(size):
        ran = direct.get(rank, [])
        assert 0 < len(ran) <= 10 and ran.count("unnamed") <= 4 and set(ran) <= {"g", "unnamed"}
        assert size == 17 or (len(ran), ran.count("unnamed")) == (10, 4)


@pytest.mark.parametrize("size", [2, 3])
def test_scalars_take_the_lean_path(size: int) -> None:
    """A 0-d array or a numpy scalar (a loss): Sum and Average, as arrays of shape ()."""

    def fn(c: Collectives) -> list[np.ndarray]:
        r = c.topology.rank
        return [c.allreduce(np.float64(r + 1), op=op) for op in (ddl.Sum, ddl.Average, ddl.Sum)] + \
               [c.allreduce(np.array(r + 1.0), op=ddl.Average)]

    want = sum(range(1, size + 1))
    for out in run_engines(size, fn):
        assert [o.shape for o in out] == [()] * 4
        assert [float(o) for o in out] == [want, want / size, want, want / size]


def test_a_named_async_tensor_resubmitted_reuses_its_checks_but_not_its_data() -> None:
    """Every step submits the same named tensors: the second step onwards reuses the first
    submission's descriptor, yet each result is that step's sum, a changed shape under the
    same name is checked afresh (a MismatchError when the ranks disagree), and an in-place
    call on a read-only array is still refused on every rank."""

    def fn(c: Collectives) -> tuple[list[float], str, str]:
        r = c.topology.rank
        sums = []
        for step in range(3):
            xs = [np.full(3000, float(step + i + r), np.float32) for i in range(12)]
            xs[3] = xs[3].reshape(30, 100)  # several shapes in one fused bucket
            xs[5] = np.full(6000, float(step + 5 + r), np.float32)[::2] if step < 2 else xs[5]  # strided
            hs = [c.allreduce_async(x, op=ddl.Sum, name=f"g{i}", inplace=step == 2) for i, x in enumerate(xs)]
            sums += [float(h.wait().reshape(-1)[0]) for h in hs]
        mismatch = refused = ""
        try:
            c.allreduce_async(np.ones(5 + r, np.float32), op=ddl.Sum, name="g0").wait()
        except ddl.MismatchError as exc:
            mismatch = str(exc)
        frozen = np.ones(3000, np.float32)
        frozen.flags.writeable = False
        try:
            c.allreduce_async(frozen, op=ddl.Sum, name="g1", inplace=True).wait()
        except (ValueError, TypeError, ddl.RemoteError) as exc:
            refused = type(exc).__name__
        return sums, mismatch, refused

    results = run_engines(2, fn)
    want = [float(2 * (step + i) + 1) for step in range(3) for i in range(12)]
    for sums, mismatch, refused in results:
        assert sums == want
        assert "'g0'" in mismatch and "(5,)" in mismatch and "(6,)" in mismatch
        assert refused


def test_resubmit_takes_only_a_signature_seen_before() -> None:
    """The per-step path answers only for a name whose dtype, shape, op and in-place flag
    passed the checks before; anything else goes back to the checked path."""

    def fn(c: Collectives) -> list[Any]:
        x = np.ones((4, 5), np.float32)
        out: list[Any] = [c.resubmit(x, ddl.Sum, "w", False)]  # never seen: None, nothing queued
        c.allreduce_async(x, op=ddl.Sum, name="w").wait()
        again = c.resubmit(x * 2, ddl.Sum, "w", False)
        out.append(None if again is None else again.wait())
        out += [c.resubmit(x, ddl.Average, "w", False), c.resubmit(x.reshape(-1), ddl.Sum, "w", False),
                c.resubmit(x.astype(np.float64), ddl.Sum, "w", False), c.resubmit(x, ddl.Sum, "w", True),
                c.resubmit(x.tolist(), ddl.Sum, "w", False)]
        return out

    for out in run_engines(2, fn):
        assert out[0] is None
        np.testing.assert_array_equal(out[1], np.full((4, 5), 4.0, np.float32))
        assert out[2:] == [None] * 5


def _notifies_from_long_sleep(eng: Engine, work: Callable[[], list[float]]) -> tuple[int, list[float]]:
    """Wait for the engine's thread to reach its long sleep, then run ``work``, counting the
    notifications that wake the thread meanwhile. (Idle cycles must be off: see the callers.)"""
    for _ in range(2000):  # the thread goes to its long sleep once nothing is pending
        if eng._long_sleep:
            break
        threading.Event().wait(0.005)
    assert eng._long_sleep
    calls = []
    real = eng._wake.notify

    def counting(n: int = 1) -> None:
        calls.append(n)
        real(n)

    eng._wake.notify = counting  # type: ignore[method-assign]
    try:
        sums = work()
    finally:
        eng._wake.notify = real  # type: ignore[method-assign]
    return len(calls), sums


def test_submissions_during_a_backward_pass_wake_the_sleeping_engine_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Until the woken thread runs, it still reads as asleep: a burst of submissions must not
    notify it once per tensor (each notification costs the submitting caller)."""
    monkeypatch.setattr(engine_module, "_IDLE_MIN", 3600.0)
    monkeypatch.setattr(engine_module, "_IDLE_MAX", 3600.0)

    def fn(c: Collectives) -> tuple[int, list[float]]:
        def burst() -> list[float]:
            xs = [np.full(7, float(i), np.float32) for i in range(40)]
            hs = [c.allreduce_async(x, op=ddl.Sum, name=f"burst{i}") for i, x in enumerate(xs)]
            return [float(h.wait()[0]) for h in hs]

        return _notifies_from_long_sleep(c.engine, burst)

    for notified, sums in run_engines(2, fn):
        assert 1 <= notified < 20  # once per wake-up of the thread, not once per tensor
        assert sums == [2.0 * i for i in range(40)]


@pytest.mark.parametrize("size", [2, 3])
def test_a_synchronous_group_of_one_dtype_runs_in_the_callers_cycle(monkeypatch: pytest.MonkeyPatch,
                                                                    size: int) -> None:
    """SyncBatchNorm's statistics: ``grouped_allreduce`` of a few float64 arrays queues no
    request (small: inline in the record; large: at once as its own bucket), with the bits
    of the queued grouped call; a group of two dtypes still goes through the queue."""
    made = _count_requests(monkeypatch)

    def fn(c: Collectives) -> list[list[np.ndarray]]:
        r = c.topology.rank
        small = [np.full(16, r + 0.5), np.arange(16.0) * (r + 1), np.full(16, 1e-3 * r)]
        large = [np.linspace(0, r + 1, 3000), np.full(700, float(r))]
        out = [c.grouped_allreduce(small, op=ddl.Sum), c.grouped_allreduce(large, op=ddl.Sum, name="big"),
               c.grouped_allreduce_async(small, op=ddl.Sum, name="queued").wait(),
               c.grouped_allreduce([np.ones(3, np.float32), np.ones(2)], op=ddl.Sum, name="mixed")]
        return out

    results = run_engines(size, fn)
    for out in results:
        for a, b in zip(out[0], out[2], strict=True):
            np.testing.assert_array_equal(a, b)  # caller's cycle == queued, bit for bit
        np.testing.assert_allclose(out[1][0], sum(np.linspace(0, q + 1, 3000) for q in range(size)))
        assert [float(v[0]) for v in out[3]] == [size, size]
    assert sorted(set(made)) == ["mixed<float32>", "mixed<float64>", "queued"]


# -- the defaults named, and an asynchronous call waited on alone ---------------------------


def test_the_default_algorithm_or_no_compression_named_takes_the_per_tensor_paths(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``algorithm=`` the job's own and ``compression=Compression.none`` (ddl's, Horovod's class or
    the name) mean what leaving them out means: same results, and repeated calls skip the
    checked path (prepared lanes, resubmission). Naming another algorithm still takes it."""
    from ddl.base.horovod_compressors import NoneCompressor

    checked: list[tuple[int, str]] = []
    real = Collectives._allreduce_request

    def spy(self: Collectives, x: Any, op: Any, name: str | None, *args: Any) -> Any:
        checked.append((self.topology.rank, name or ""))
        return real(self, x, op, name, *args)

    monkeypatch.setattr(Collectives, "_allreduce_request", spy)

    def fn(c: Collectives) -> tuple[list[float], list[str]]:
        r = c.topology.rank
        default = c.ctx.config.algorithm
        x = np.full(5, float(r + 1), np.float32)
        for _ in range(2):  # the first of each is checked, the second already is not
            c.allreduce(x, op=ddl.Sum, algorithm=default)
            c.allreduce_(x.copy(), op=ddl.Sum, compression=ddl.Compression.none)
            c.allreduce_async(x, op=ddl.Sum, name="a", compression=NoneCompressor).wait()
        before = sum(1 for q, _ in checked if q == r)
        out = [float(c.allreduce(x, op=ddl.Sum, algorithm=default)[0]),
               float(c.allreduce_(x.copy(), op=ddl.Sum, compression=ddl.Compression.none)[0]),
               float(c.allreduce(x, op=ddl.Sum, algorithm=default, compression="none")[0]),
               float(c.allreduce_async(x, op=ddl.Sum, name="a", compression=NoneCompressor).wait()[0]),
               float(c.allreduce(x, op=ddl.Sum, algorithm="ring", name="r")[0])]
        return out, [name for q, name in checked if q == r][before:]

    for out, after in run_engines(2, fn):
        assert out == [3.0] * 5
        assert after == ["r"]  # only the call naming another algorithm was checked afresh


def test_an_async_call_waited_alone_runs_the_lean_cycle(monkeypatch: pytest.MonkeyPatch) -> None:
    """``allreduce_async`` then ``wait`` with nothing else pending: the waiter runs the lean
    path's cycle (same bits as the synchronous call), and the name is free again at once."""
    ran: list[bool] = []
    real = Engine.run_waited

    def spy(self: Engine, handle: Any) -> bool:
        got = real(self, handle)
        ran.append(got)
        return got

    monkeypatch.setattr(Engine, "run_waited", spy)

    def fn(c: Collectives) -> tuple[list[np.ndarray], list[np.ndarray]]:
        rng = np.random.default_rng(c.topology.rank)
        xs = [rng.standard_normal(n).astype(np.float32) for n in (3, 700, 5000)]
        sync, waited = [], []
        # Each shape with every op, in place and not, twice: the lane a lone cycle takes is
        # cached per (dtype, shape, op, in place), and must never serve another of them.
        for _ in range(2):
            for op in (ddl.Average, ddl.Sum, ddl.Max):
                for x in xs:
                    sync += [c.allreduce(x, op=op), c.allreduce_(x.copy(), op=op)]
                    waited.append(c.allreduce_async(x, op=op, name="same").wait())
                    y = x.copy()
                    waited.append(c.allreduce_async(y, op=op, name="same", inplace=True).wait())
                    assert np.shares_memory(waited[-1], y)
        return sync, waited

    for sync, waited in run_engines(3, fn):
        for a, b in zip(sync, waited, strict=True):
            np.testing.assert_array_equal(a, b)
    assert ran and ran.count(True) >= len(ran) // 2  # the thread may rarely cycle first


def test_an_async_call_waited_alone_meets_a_rank_holding_more() -> None:
    """One rank waits on "a" alone while the other holds "b" then "a": the lone cycle finds
    they differ, "a" rejoins the queue, the names are paired, and both end right."""

    def fn(c: Collectives) -> list[float]:
        r = c.topology.rank
        x = np.full(4, float(r + 1), np.float32)
        if r == 0:
            a = float(c.allreduce_async(x, op=ddl.Sum, name="a").wait()[0])
            b = float(c.allreduce_async(x * 10, op=ddl.Sum, name="b").wait()[0])
        else:
            hb = c.allreduce_async(x * 10, op=ddl.Sum, name="b")
            ha = c.allreduce_async(x, op=ddl.Sum, name="a")
            a, b = float(ha.wait()[0]), float(hb.wait()[0])
        return [a, b]

    for out in run_engines(2, fn):
        assert out == [3.0, 30.0]


def test_async_calls_waited_one_after_another_do_not_wake_the_engine_each(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a submission the thread looks by itself for a while: calls waited on at once,
    one after another, do not each pay for a wake-up (it cost more than the call)."""
    monkeypatch.setattr(engine_module, "_IDLE_MIN", 3600.0)
    monkeypatch.setattr(engine_module, "_IDLE_MAX", 3600.0)

    def fn(c: Collectives) -> tuple[int, list[float]]:
        def one_by_one() -> list[float]:
            sums = []
            for i in range(60):  # a millisecond apart: time enough for the thread to go back to sleep
                sums.append(float(c.allreduce_async(np.full(7, float(i), np.float32), op=ddl.Sum,
                                                    name="one").wait()[0]))
                time.sleep(0.001)
            return sums

        return _notifies_from_long_sleep(c.engine, one_by_one)

    for notified, sums in run_engines(2, fn):
        assert sums == [2.0 * i for i in range(60)]
        assert 1 <= notified < 15, notified  # the first call wakes it; before, nearly every one of the 60 did
