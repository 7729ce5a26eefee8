"""A bucket's tensors read where they lie: ranges across tensors, and buckets that skip the pack."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import ddl
from ddl.engine.collectives import Collectives
from ddl.engine.compression import Compressor
from ddl.engine.context import Context
from ddl.reduction.scattered import Scattered, fill, read
from ddl.testing import run_engines


def _parts() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    strided = rng.standard_normal(10).astype(np.float32)
    return [rng.standard_normal(3).astype(np.float32), np.float32(2.5) * np.ones((), np.float32),
            np.zeros(0, np.float32), rng.standard_normal((2, 3)).astype(np.float32), strided[::2],
            rng.standard_normal((3, 2)).astype(np.float32).T, rng.standard_normal(4).astype(np.float32)]


def test_every_range_reads_the_flat_concatenation() -> None:
    parts = _parts()
    flat = np.concatenate([p.reshape(-1) for p in parts])
    src = Scattered(parts)
    assert src.size == flat.size and src.dtype == np.float32
    for lo in range(flat.size + 1):
        for n in range(flat.size - lo + 1):
            out = np.full(n, np.nan, np.float32)
            read(src, lo, n, out)
            assert out.tobytes() == flat[lo : lo + n].tobytes(), (lo, n)
    whole = np.empty(flat.size, np.float32)
    fill(whole, src)
    assert whole.tobytes() == flat.tobytes()


@pytest.mark.parametrize(("lo", "n", "out_size"), [(-1, 2, 2), (24, 3, 3), (0, 3, 2)])
def test_a_range_outside_the_input_is_refused(lo: int, n: int, out_size: int) -> None:
    with pytest.raises(ValueError, match="does not fit"):
        Scattered(_parts()).read(lo, n, np.empty(out_size, np.float32))


def test_mixed_dtypes_and_no_arrays_are_refused() -> None:
    with pytest.raises(ValueError, match="one dtype"):
        Scattered([np.ones(2, np.float32), np.ones(2, np.float64)])
    with pytest.raises(ValueError, match="at least one"):
        Scattered([])


def test_a_strided_tensor_is_copied_once_when_a_read_first_cuts_it_and_whole_ones_never() -> None:
    """Building the input checks no tensor's layout (a bucket of hundreds pays per read, not
    per tensor); the first read that cuts a strided tensor keeps a contiguous copy of it, so
    later cuts slice that copy instead of flattening the whole tensor again."""
    base = np.arange(40, dtype=np.float32)
    strided, plain = base[::2], np.arange(5, dtype=np.float32)  # 20 and 5 elements
    src = Scattered([plain, strided, plain.copy()])
    assert src.arrays[1] is strided  # nothing copied up front
    whole = np.empty(30, np.float32)
    fill(whole, src)  # a whole tensor is read as it lies, however strided
    assert src.arrays[1] is strided
    assert whole.tobytes() == np.concatenate([plain, strided, plain]).tobytes()
    out = np.empty(5, np.float32)
    src.read(7, 5, out)  # inside the strided one: cut
    kept = src.arrays[1]
    assert kept is not strided and kept.flags.c_contiguous and kept.tobytes() == strided.tobytes()
    assert out.tobytes() == strided[2:7].tobytes()
    src.read(20, 8, np.empty(8, np.float32))  # cuts it again: the same copy serves
    assert src.arrays[1] is kept and src.arrays[0] is plain

@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("algorithm", ["shm", "ring", "mpi"])
def test_a_bucket_of_many_tensors_is_not_packed_and_gives_the_rank_order_sum(
        size: int, algorithm: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Out-of-place and in-place tensors of one bucket (odd shapes, one strided) are read where
    they lie: no pack, the inputs untouched, the results those of the packed bucket."""
    sources: list[Any] = []
    real = Context.allreduce_flat

    def spy(self: Context, buf: np.ndarray, *args: Any, **kwargs: Any) -> None:
        sources.append(kwargs.get("src"))
        real(self, buf, *args, **kwargs)

    def no_pack(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("an uncompressed bucket was packed")

    monkeypatch.setattr(Context, "allreduce_flat", spy)
    monkeypatch.setattr(Compressor, "compress", no_pack)

    def tensors(rank: int) -> list[np.ndarray]:
        rng = np.random.default_rng(rank)
        base = rng.standard_normal(2000).astype(np.float32)
        return [base[:700], base[700:1300].reshape(20, 30), base[1300::3], np.float32(rank) * np.ones(5, np.float32)]

    def fn(c: Collectives) -> list[np.ndarray]:
        xs = tensors(c.topology.rank)
        kept = [x.copy() for x in xs]
        with c.engine._baton:  # one batch, so one bucket
            hs = [c.allreduce_async(x, op=ddl.Sum, name=f"t{i}", algorithm=algorithm, inplace=i == 3)
                  for i, x in enumerate(xs)]
        got = [np.array(h.wait()) for h in hs]
        assert all(a.tobytes() == b.tobytes() for a, b in zip(xs[:3], kept[:3], strict=True))  # inputs untouched
        assert got[3].tobytes() == xs[3].tobytes()  # the in-place one holds its result
        return got

    results = run_engines(size, fn)
    assert any(isinstance(s, Scattered) for s in sources)
    for i, ref_parts in enumerate(zip(*(tensors(r) for r in range(size)), strict=True)):
        ref = np.sum([p.astype(np.float64) for p in ref_parts], axis=0)
        for r in range(size):
            assert results[r][i].shape == ref_parts[0].shape
            assert np.allclose(results[r][i], ref, rtol=1e-5, atol=1e-5), (i, r)
            assert results[r][i].tobytes() == results[0][i].tobytes()
