"""The half types' kernels: torch's (what ``ddl.torch`` installs) give numpy's bits, and the
engine's pack, sum and unpack go through them."""

from __future__ import annotations

import numpy as np
import pytest

from ddl.base import kernels
from ddl.base.ops import ReduceOp
from ddl.engine.compression import Compression

torch_kernels = pytest.importorskip("ddl.torch.kernels")

DIVISORS = (2, 3, 7)


def _values(n: int = 200_000) -> np.ndarray:
    """float32 gradients of every float16 kind: normal, subnormal (most real gradients), zero,
    halfway cases, overflow, infinities, NaN."""
    rng = np.random.default_rng(0)
    special = [np.inf, -np.inf, np.nan, 7e4, -7e4, 65504.0, 65519.99, 65520.0, 6e-8, 2.98e-8, 3e-8, -0.0, 0.0,
               1 + 2**-11, 1 + 3 * 2**-11, 2**-24, 2**-25, 1.5 * 2**-25]
    parts = [rng.standard_normal(n) * 1e-5, rng.standard_normal(n) * 1e-7, rng.standard_normal(n) * 1e3, special]
    return np.concatenate(parts).astype(np.float32)


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint16 if a.itemsize == 2 else np.uint32)


def test_torch_casts_give_numpys_bits() -> None:
    src = _values()
    want, got = np.empty(src.size, np.float16), np.empty(src.size, np.float16)
    with np.errstate(over="ignore"):
        kernels.NUMPY.cast(want, src)
    torch_kernels.TORCH.cast(got, src)
    assert np.array_equal(_bits(want), _bits(got))
    back_want, back_got = np.empty(src.size, np.float32), np.empty(src.size, np.float32)
    kernels.NUMPY.cast(back_want, want)
    torch_kernels.TORCH.cast(back_got, want)
    assert np.array_equal(_bits(back_want), _bits(back_got))


@pytest.mark.parametrize("divisor", DIVISORS)
def test_torch_division_into_float16_gives_numpys_bits(divisor: int) -> None:
    src = _values()
    want, got = np.empty(src.size, np.float16), np.empty(src.size, np.float16)
    with np.errstate(over="ignore"):
        kernels.NUMPY.divide(want, src, divisor)
    torch_kernels.TORCH.divide(got, src, divisor)
    assert np.array_equal(_bits(want), _bits(got))


def test_torch_float16_sum_gives_numpys_bits() -> None:
    with np.errstate(over="ignore"):
        a = _values().astype(np.float16)
    b = a[::-1].copy()
    want, got = np.empty_like(a), np.empty_like(a)
    with np.errstate(over="ignore", invalid="ignore"):
        kernels.NUMPY.add(a, b, want)
    torch_kernels.TORCH.add(a, b, got)
    assert np.array_equal(_bits(want), _bits(got))


def test_views_torch_cannot_take_fall_back_to_numpy_and_read_only_inputs_are_read() -> None:
    src = _values(1000)[::-1]  # a negative stride: torch.from_numpy refuses it
    want, got = np.empty(src.size, np.float16), np.empty(src.size, np.float16)
    with np.errstate(over="ignore"):
        kernels.NUMPY.cast(want, src)
        torch_kernels.TORCH.cast(got, src)
    assert np.array_equal(_bits(want), _bits(got))
    frozen = want.copy()
    frozen.setflags(write=False)  # as MPI hands a reduction op its input
    into, expect = want.copy(), np.empty_like(want)
    with np.errstate(over="ignore", invalid="ignore"):
        kernels.NUMPY.add(want, frozen, expect)
    torch_kernels.TORCH.add(into, frozen, into)
    assert np.array_equal(_bits(expect), _bits(into))


def test_ddl_torch_installs_its_kernels_and_the_engine_packs_with_them(monkeypatch: pytest.MonkeyPatch) -> None:
    import ddl.torch  # noqa: F401 - installs torch's kernels

    assert kernels.installed().name == "torch"
    calls: list[str] = []
    spy = kernels.Kernels("spy", lambda d, s: (calls.append("cast"), kernels.NUMPY.cast(d, s))[1],
                          lambda d, s, k: (calls.append("divide"), kernels.NUMPY.divide(d, s, k))[1],
                          lambda a, b, o: (calls.append("add"), kernels.NUMPY.add(a, b, o))[1])
    monkeypatch.setattr(kernels, "_installed", spy)
    grads = [_values(50_000)[:100_000], np.full(20_000, 1e-6, np.float32)]
    wire = np.empty(120_000, np.float16)
    with np.errstate(over="ignore"):
        Compression.fp16.compress(grads, wire, divisor=3)
    assert calls == ["divide", "divide"]
    with np.errstate(over="ignore", invalid="ignore"):
        kernels.combiner(ReduceOp.SUM, wire.dtype)(wire, wire, out=wire)
    out = np.empty(120_000, np.float32)
    Compression.fp16.decompress(wire, np.dtype(np.float32), into=out)
    assert calls == ["divide", "divide", "add", "cast"]
    assert kernels.combiner(ReduceOp.MAX, wire.dtype) is np.maximum  # only sums go to the kernels
    assert kernels.combiner(ReduceOp.SUM, np.dtype(np.float32)) is np.add


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("divisor", [2, 3, 4, 6, 8, 32, 1024])
def test_an_averages_prepared_division_gives_numpys_bits(dtype: type, divisor: int) -> None:
    """``dtypes.divide`` multiplies by the reciprocal for a power of two: the same bits as
    numpy's divide on normals, subnormals, the extremes, zeros, infinities and NaN."""
    from ddl.base import dtypes

    info = np.finfo(dtype)
    rng = np.random.default_rng(divisor)
    x = np.concatenate([rng.standard_normal(20000).astype(dtype),
                        (rng.random(4000) * float(info.tiny) * 4).astype(dtype) * np.array(-1, dtype),
                        np.array([info.max, -info.max, info.tiny, info.smallest_subnormal, 0.0, -0.0,
                                  np.inf, -np.inf, np.nan], dtype)])
    want = x.copy()
    np.divide(want, divisor, out=want)
    got = x.copy()
    dtypes.divide(got, divisor)
    assert got.tobytes() == want.tobytes()
    ufunc, operand = dtypes.float_division(np.dtype(dtype), divisor)  # type: ignore[misc]
    assert ufunc is (np.multiply if divisor & (divisor - 1) == 0 else np.divide)
    assert operand.dtype == dtype
    assert dtypes.float_division(np.dtype(np.int32), divisor) is None
