"""Horovod's ``Compression`` classes are written once (ddl.base.horovod_compressors) and each
adapter's are built from its framework's casts: same names, behaviour and wire compression."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from ddl.base.horovod_compressors import (
    Compressor,
    HalfCasts,
    HalfCompressor,
    NoneCompressor,
    half_compressors,
)
from ddl.engine.compression import Compression as WireCompression
from ddl.engine.compression import as_compressor

NUMPY = HalfCasts(cast=lambda a, dtype: a.astype(dtype), is_floating=lambda dtype: np.issubdtype(dtype, np.floating),
                  float16=np.dtype(np.float16), bfloat16=np.dtype(np.float32))


def test_the_classes_are_built_from_any_frameworks_casts() -> None:
    fp16, bf16, compression = half_compressors("tests.numpy_compression", NUMPY)
    assert (compression.none, compression.fp16, compression.bf16) == (NoneCompressor, fp16, bf16)
    assert fp16.__name__ == "FP16Compressor" and fp16.__module__ == "tests.numpy_compression"
    assert issubclass(fp16, HalfCompressor) and issubclass(bf16, Compressor) and issubclass(compression.none, Compressor)
    x = np.array([1.0, 2.5e-4, 70000.0])
    small, ctx = compression.fp16.compress(x)
    assert small.dtype == np.float16 and ctx == np.float64
    back = compression.fp16.decompress(small, ctx)
    assert back.dtype == np.float64 and back[0] == 1.0 and np.isinf(back[2])  # 70000 overflows float16
    ints = np.arange(3)
    assert compression.fp16.compress(ints)[0] is ints and compression.fp16.decompress(ints, ints.dtype) is ints
    assert compression.none.compress(x) == (x, None) and compression.none.decompress(x, None) is x
    assert [as_compressor(c) for c in (compression.none, fp16, bf16)] == \
        [WireCompression.none, WireCompression.fp16, WireCompression.bf16]


def test_torch_compression_keeps_horovods_names_and_casts() -> None:
    torch = pytest.importorskip("torch")
    import ddl.torch as dt
    from ddl.torch import compression

    assert dt.Compression is compression.Compression
    assert (dt.Compression.none, dt.Compression.fp16, dt.Compression.bf16) == \
        (compression.NoneCompressor, compression.FP16Compressor, compression.BF16Compressor)
    assert dt.Compression.fp16.__module__ == "ddl.torch.compression" and dt.Compression.fp16.wire_compression == "fp16"
    assert pickle.loads(pickle.dumps(dt.Compression.bf16)) is dt.Compression.bf16
    for comp, half in ((dt.Compression.fp16, torch.float16), (dt.Compression.bf16, torch.bfloat16)):
        x = torch.tensor([1.0, 1 / 3], dtype=torch.float64)
        small, ctx = comp.compress(x)
        assert small.dtype == half and ctx == torch.float64
        back = comp.decompress(small, ctx)
        assert back.dtype == torch.float64 and torch.equal(back, x.to(half).to(torch.float64))
    ints = torch.arange(3)
    small, ctx = dt.Compression.fp16.compress(ints)
    assert small is ints and dt.Compression.fp16.decompress(small, ctx) is ints
    assert dt.Compression.none.compress(ints) == (ints, None)
    assert isinstance(dt.Compression.fp16(), compression.Compressor)
