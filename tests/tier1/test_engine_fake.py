"""The engine's trust contract on fake ranks: threads, refusals, failures, shutdown, numerics."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from typing import Any

import numpy as np
import pytest

import ddl
from ddl.base.config import Config
from ddl.base.topology import build_topology
from ddl.engine import engine as engine_module
from ddl.engine import fusion
from ddl.engine.collectives import Collectives
from ddl.engine.context import Context
from ddl.engine.engine import Engine
from ddl.testing import FakeAbort, run_engines, run_ranks

ALGORITHMS = ["mpi", "ring", "multiring", "halving_doubling", "auto"]


def _catch(fn: Any) -> BaseException | None:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - returned to the test
        return exc
    return None


# -- names are per thread ------------------------------------------------------------


def test_unnamed_requests_from_two_threads_never_mix() -> None:
    """Two threads per rank, 40 unnamed allreduces each, random pauses: every result is
    the sum of the same thread's values over the ranks (one shared counter mixed them)."""

    def fn(c: Collectives) -> list[str]:
        r, wrong = c.topology.rank, []

        def worker(tag: int) -> None:
            rng = random.Random(tag * 100 + r)
            for i in range(40):
                value = np.full(4, 1000.0 * tag + i + r, np.float32)
                if rng.random() < 0.5:
                    time.sleep(rng.random() * 0.002)
                got = c.allreduce(value, op=ddl.Sum)
                want = sum(1000.0 * tag + i + q for q in range(c.topology.size))
                if not np.all(got == want):
                    wrong.append(f"thread {tag} call {i}: {got[0]} != {want}")

        threads = [threading.Thread(target=worker, args=(t,), name=f"worker-{t}") for t in (1, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return wrong

    assert run_engines(3, fn) == [[], [], []]


def test_two_live_threads_of_one_name_are_refused() -> None:
    def fn(c: Collectives) -> BaseException | None:
        gate = threading.Barrier(2)
        errors: list[BaseException | None] = []

        def worker() -> None:
            gate.wait()
            errors.append(_catch(lambda: c.engine.names.next()))
            gate.wait()

        threads = [threading.Thread(target=worker, name="same") for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return next((e for e in errors if e is not None), None)

    (err,) = run_engines(1, fn)
    assert isinstance(err, ValueError) and "'same'" in str(err) and "name=" in str(err)


# -- refused arguments end the call on every rank --------------------------------------


@pytest.mark.parametrize(
    ("call", "own_error", "needle"),
    [
        (lambda c, bad: c.allreduce(np.ones(3, np.complex64 if bad else np.float32), name="x"),
         TypeError, "complex64"),
        (lambda c, bad: c.allreduce(np.ones(3, np.int32), op=ddl.Adasum if bad else ddl.Sum),
         TypeError, "Adasum on an integer"),
        (lambda c, bad: c.broadcast(np.ones(2), root_rank=7 if bad else 0), ValueError, "root_rank=7"),
        (lambda c, bad: c.allgather_object(threading.Lock() if bad else 1), TypeError, "pickle"),
        (lambda c, bad: c.broadcast_object(threading.Lock(), root_rank=1) if bad else
         c.broadcast_object(None, root_rank=1), TypeError, "pickle"),
        (lambda c, bad: c.grouped_allreduce([np.ones(2), np.ones(2, np.complex64 if bad else np.float64),
                                             np.ones(3)]), TypeError, "complex64"),
    ],
    ids=["dtype", "adasum-int", "root", "allgather-object", "broadcast-object", "grouped"],
)
def test_an_argument_refused_on_one_rank_ends_the_call_everywhere(call: Any, own_error: type, needle: str) -> None:
    def fn(c: Collectives) -> tuple[BaseException | None, np.ndarray, float]:
        start = time.monotonic()
        err = _catch(lambda: call(c, c.topology.rank == 1))
        elapsed = time.monotonic() - start
        after = c.allreduce(np.ones(2), op=ddl.Sum)  # the runtime stays usable
        return err, after, elapsed

    results = run_engines(3, fn)
    for rank, (err, after, elapsed) in enumerate(results):
        assert elapsed < 5, f"rank {rank} took {elapsed:.1f} s"
        np.testing.assert_array_equal(after, [3.0, 3.0])
        if rank == 1:
            assert type(err) is own_error and needle in str(err), repr(err)
        else:
            assert isinstance(err, ddl.RemoteError), f"rank {rank}: {err!r}"
            assert "rank 1 could not start" in str(err) and needle in str(err), str(err)


def test_an_argument_refused_on_every_rank_raises_everywhere_at_once() -> None:
    results = run_engines(2, lambda c: _catch(lambda: c.allreduce(np.ones(2, np.complex128))))
    assert all(isinstance(e, TypeError) and "complex128" in str(e) for e in results)


def test_a_refusal_at_world_size_one_raises_its_own_error() -> None:
    (err,) = run_engines(1, lambda c: _catch(lambda: c.allreduce(np.ones(2, np.complex64))))
    assert isinstance(err, TypeError)


# -- a failure inside a cycle ends the job on every rank --------------------------------


def test_a_failure_inside_a_cycle_aborts_every_rank_quickly(monkeypatch: pytest.MonkeyPatch,
                                                              capfd: pytest.CaptureFixture[str]) -> None:
    real = fusion.execute

    def flaky(ctx: Context, ready: list[Any], *args: Any, **kwargs: Any) -> None:
        # (keywords too: the queued path passes ``solo=``, the lean path does not)
        if ctx.topology.rank == 1 and any(r.name == "boom" for r in ready):
            raise MemoryError("no room for the fused buffer")
        real(ctx, ready, *args, **kwargs)

    monkeypatch.setattr(fusion, "execute", flaky)

    def fn(c: Collectives) -> None:
        c.allreduce(np.ones(4), name="warm")
        with contextlib.suppress(MemoryError):  # the user catches it: the others must not be left waiting
            c.allreduce(np.ones(64 << 10), name="boom", algorithm="ring")
        c.allreduce(np.ones(4), name="after")

    start = time.monotonic()
    with pytest.raises((FakeAbort, ddl.DDLError)):
        run_engines(3, fn)
    assert time.monotonic() - start < 10
    err = capfd.readouterr().err
    assert "rank 1: the engine failed during a collective ('boom')" in err
    assert "MemoryError: no room for the fused buffer" in err and "aborted" in err


# -- shutdown ---------------------------------------------------------------------------


def test_shutdown_waits_for_late_ranks_and_then_for_nothing() -> None:
    def fn(c: Collectives) -> tuple[float, bool]:
        c.allreduce(np.ones(2))
        if c.topology.rank == 1:
            time.sleep(1.5)
        start = time.monotonic()
        c.engine.stop()
        thread = c.engine._thread
        return time.monotonic() - start, thread is not None and thread.is_alive()

    results = run_engines(2, fn, stop=False)
    assert results[0][0] >= 1.0, "rank 0 returned from shutdown before rank 1 reached it"
    assert results[1][0] < 1.0
    assert not any(alive for _, alive in results), "shutdown returned with the engine thread alive"


def test_an_engine_that_never_started_is_discarded_at_once() -> None:
    def body(comm: Any) -> float:
        ctx = Context(comm, build_topology(comm.rank, ["h"] * comm.size, None), Config())
        eng = Engine(ctx, fusion_threshold=1 << 20, stall_timeout=10, start=False)
        start = time.monotonic()
        eng.discard()
        assert eng._thread is not None and not eng._thread.is_alive()
        return time.monotonic() - start

    assert all(t < 1.0 for t in run_ranks(2, body))


# -- one numeric rule for half types ------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("count", [1, 3000])
def test_half_types_accumulate_in_float32_on_every_path(algorithm: str, count: int) -> None:
    # 2048 + 1 + 1 in float16 steps is 2048 (the 1s round away); in float32 it is 2050,
    # which float16 holds. Small counts go inline, large ones through the algorithm.
    def fn(c: Collectives) -> np.ndarray:
        value = [2048.0, 1.0, 1.0][c.topology.rank]
        return c.allreduce(np.full(count, value, np.float16), op=ddl.Sum, algorithm=algorithm)

    for out in run_engines(3, fn):
        assert out.dtype == np.float16
        np.testing.assert_array_equal(out, np.full(count, 2050.0, np.float16))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_average_of_large_half_values_does_not_overflow(algorithm: str) -> None:
    def fn(c: Collectives) -> np.ndarray:
        return c.allreduce(np.full(2000, 60000.0, np.float16), algorithm=algorithm)

    for out in run_engines(4, fn):
        assert np.all(np.isfinite(out)) and np.all(out == np.float16(60000.0)), out[:3]


def test_reducescatter_of_half_values_accumulates_in_float32() -> None:
    def fn(c: Collectives) -> np.ndarray:
        value = [2048.0, 1.0, 1.0][c.topology.rank]
        return c.reducescatter(np.full((6, 2), value, np.float16))

    for out in run_engines(3, fn):
        assert out.dtype == np.float16 and np.all(out == 2050.0)


# -- scale: the engine itself at 256 ranks ----------------------------------------------


def test_engine_at_256_fake_ranks() -> None:
    def fn(c: Collectives) -> tuple[float, float, BaseException | None]:
        r = c.topology.rank
        small = c.allreduce(np.full(3, r, np.float64), op=ddl.Sum)  # inline
        big = c.allreduce(np.full(700, 1.0, np.float32), op=ddl.Sum, algorithm="ring")
        err = _catch(lambda: c.allreduce(np.ones(2, np.complex64 if r == 200 else np.float32), name="late"))
        return float(small[0]), float(big[0]), err

    # algorithm="ring": pricing "auto" would be repeated by each of the 256 ranks of one process.
    results = run_engines(256, fn, config=Config(algorithm="ring", segment_bytes=1 << 20, stall_timeout=30.0))
    assert all(s == sum(range(256)) and b == 256.0 for s, b, _ in results)
    assert isinstance(results[200][2], TypeError)
    assert all(isinstance(e, ddl.RemoteError) and "rank 200" in str(e)
               for q, (_, _, e) in enumerate(results) if q != 200)


def test_large_in_place_buckets_are_reduced_where_they_lie(monkeypatch: pytest.MonkeyPatch) -> None:
    """A framework's bucket (in place, contiguous, >= 1 MiB) is not copied into a fused
    buffer with its neighbours; small ones still fuse."""
    seen: list[tuple[int, np.ndarray]] = []
    real = Context.allreduce_flat

    def spy(self: Context, buf: np.ndarray, *args: Any, **kwargs: Any) -> None:
        seen.append((self.topology.rank, buf))
        real(self, buf, *args, **kwargs)

    monkeypatch.setattr(Context, "allreduce_flat", spy)

    def fn(c: Collectives) -> tuple[bool, bool]:
        big = [np.full(fusion.SOLO_BYTES // 4, 1.0, np.float32) for _ in range(2)]
        small = [np.ones(300, np.float32) for _ in range(2)]
        with c.engine._baton:  # no cycle until all four are queued: they arrive as one batch
            hs = [c.allreduce_async(x, op=ddl.Sum, inplace=True, name=f"b{i}") for i, x in enumerate(big + small)]
        for h in hs:
            h.wait()
        mine = [buf for r, buf in seen if r == c.topology.rank]
        return (all(any(np.shares_memory(buf, b) for buf in mine) for b in big)
                and all(np.all(b == 2) for b in big)), any(buf.size == 600 for buf in mine)

    assert run_engines(2, fn) == [(True, True), (True, True)]



def test_a_batch_planned_before_is_planned_anew_where_only_its_layout_changed() -> None:
    """The engine remembers a batch's buckets by the negotiation's combined digest, which
    says nothing of which requests are in place or strided: the same ten requests, plain,
    with two large ones in place, and with one of those strided, each get what the fusion
    rule gives them, however often and in whatever order they come back."""
    from ddl.engine.handle import Handle
    from ddl.engine.negotiation import Descriptor, combine, digest

    def batch(inplace: tuple[int, ...], strided: tuple[int, ...]) -> list[fusion.Request]:
        reqs = []
        for i in range(10):
            n = fusion.SOLO_BYTES // 4 if i in (2, 6) else 300
            a = np.ones(2 * n, np.float32)[::2] if i in strided else np.ones(n, np.float32)
            desc = Descriptor("allreduce", f"t{i}", ((n,), "float32", "SUM"), "auto", "none")
            reqs.append(fusion.Request("allreduce", desc.name, desc, Handle(desc.name), array=a,
                                       inplace=i in inplace, digest=digest(desc)))
        return reqs

    variants = [batch((), ()), batch((2, 6), ()), batch((2, 6), (6,))]
    h = combine([r.digest for r in variants[0]])
    assert all(combine([r.digest for r in v]) == h for v in variants)  # the digest cannot tell them apart
    wants = [fusion.fuse([fusion._fusion_item(r, True) for r in v], 64 << 20) for v in variants]
    assert len({str(w) for w in wants}) == 3  # the rule does
    for k in [0, 1, 2, 0, 2, 1]:
        assert fusion._groups(variants[k], 64 << 20, True, h) == wants[k], k

@pytest.mark.parametrize(("compression", "reduced_in"), [(None, "float32"), ("fp16", "float16")])
def test_half_tensors_reduce_in_float32_unless_compression_asks_for_half_on_the_wire(
        monkeypatch: pytest.MonkeyPatch, compression: str | None, reduced_in: str) -> None:
    seen: list[str] = []
    real = Context.allreduce_flat

    def spy(self: Context, buf: np.ndarray, *args: Any, **kwargs: Any) -> None:
        seen.append(str(buf.dtype))
        real(self, buf, *args, **kwargs)

    monkeypatch.setattr(Context, "allreduce_flat", spy)
    out = run_engines(2, lambda c: c.allreduce(np.full(5000, 3.0, np.float16), compression=compression,
                                               algorithm="ring"))
    assert set(seen) == {reduced_in}
    assert all(o.dtype == np.float16 and np.all(o == 3.0) for o in out)


def test_an_idle_engine_backs_off_and_work_brings_it_back() -> None:
    """Idle cycles gather every rank's record (66 KB a rank at 16 ranks): 1.5 s with
    nothing pending costs a handful of them, not one every 20 ms; the engine thread,
    asleep for the longest gap, still runs new work at once."""

    def fn(c: Collectives) -> tuple[int, float, bool]:
        c.allreduce(np.ones(4), op=ddl.Sum, name="warm")
        before = c.engine.cycles
        time.sleep(1.5)
        idle, gap = c.engine.cycles - before, c.engine._idle_gap
        h = c.allreduce_async(np.ones(4), op=ddl.Sum, name="after")
        time.sleep(0.05)  # nobody waits on it: the background thread must wake and run it
        return idle, gap, h.done()

    for idle, gap, done in run_engines(3, fn):
        assert 3 <= idle <= 12, idle  # 20+40+80+160+320 ms, then every 320 ms (75 at a steady 20 ms)
        assert gap == engine_module._IDLE_MAX and done


# -- an elastic world that lost a peer -----------------------------------------------


def test_interrupt_fails_waiting_and_later_collectives_with_the_given_error() -> None:
    """A peer that will never submit (lost): interrupt() wakes the waiter with
    HorovodInternalError within a poll, later calls raise it at once, and the engine runs no
    exchange again: on MPI, the interrupted one (a persistent request) is still active, and
    starting it again aborted the job ("Persistent request ... already active", issue 39)."""

    def fn(c: Collectives) -> str:
        if c.topology.rank == 1:
            time.sleep(1.0)  # the "lost" rank submits nothing (its engine still cycles, as a live one would)
            return "idle"
        handle = c.allreduce_async(np.ones(3), op=ddl.Sum, name="never-matched")
        threading.Timer(0.2, c.engine.interrupt, [ddl.HorovodInternalError("peer lost")]).start()
        start = time.monotonic()
        with pytest.raises(ddl.HorovodInternalError, match="peer lost"):
            handle.wait()
        waited = time.monotonic() - start
        assert waited < 1.0, waited
        cycles = c.engine.cycles
        time.sleep(0.4)  # idle cycles would come every 20-320 ms
        assert c.engine.cycles == cycles, "an interrupted engine ran another exchange"
        with pytest.raises(ddl.HorovodInternalError):
            c.allreduce(np.ones(3), name="later")
        return "interrupted"

    # No stop(): an interrupted rank leaves without the agreeing shutdown (its peer is lost).
    assert run_engines(2, fn, stop=False) == ["interrupted", "idle"]
