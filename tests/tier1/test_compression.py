"""Compression compresses on every algorithm, ``mpi`` included: bytes on the wire, and exact sums."""

from __future__ import annotations

import numpy as np
import pytest

import ddl
from ddl.base.config import Config
from ddl.engine.collectives import Collectives
from ddl.engine.compression import Compression
from ddl.reduction import cost
from ddl.testing import run_engines

HOSTS = ["a", "a", "b", "b"]
N = 1 << 16  # float32 elements: 256 KiB, past the inline record, fused alone


def _wire_bytes(algorithm: str, compression: object) -> tuple[int, list[np.ndarray]]:
    """Bytes every rank handed to the network for three allreduces, and the results."""

    def fn(c: Collectives) -> tuple[int, np.ndarray]:
        comm = c.ctx.comm
        r = c.topology.rank
        # Small integers: exact in float16, so the compressed sum is exact too.
        x = (np.arange(N, dtype=np.float32) % 97) + r
        c.allreduce(x, op=ddl.Sum, algorithm=algorithm, name="warm-up", compression=compression)
        before = comm.wire_bytes  # type: ignore[attr-defined]
        out = x
        for i in range(3):
            out = c.allreduce(x, op=ddl.Sum, algorithm=algorithm, name=f"t{i}", compression=compression)
        return comm.wire_bytes - before, out  # type: ignore[attr-defined]

    cfg = Config(segment_bytes=1 << 20, stall_timeout=10.0, calibration="off")
    results = run_engines(4, fn, hostnames=HOSTS, spec="2x2", config=cfg)
    return sum(b for b, _ in results), [o for _, o in results]


@pytest.mark.parametrize("algorithm", ["mpi", "ring", "multiring", "halving_doubling", "shm", "auto"])
def test_fp16_halves_the_bytes_on_every_algorithm(algorithm: str) -> None:
    plain, want = _wire_bytes(algorithm, None)
    half, got = _wire_bytes(algorithm, ddl.Compression.fp16)
    assert half <= 0.6 * plain, f"{algorithm}: {half} bytes compressed vs {plain} uncompressed"
    expected = sum((np.arange(N, dtype=np.float32) % 97) + r for r in range(4))
    for g, w in zip(got, want, strict=True):
        assert g.dtype == np.float32
        np.testing.assert_array_equal(g, expected)
        np.testing.assert_array_equal(w, expected)
    assert all(np.array_equal(g, got[0]) for g in got)  # the same bits on every rank


def test_the_compressor_is_the_one_place_that_packs_and_unpacks() -> None:
    comp = Compression.fp16
    a, b = np.arange(4, dtype=np.float64), np.arange(3, dtype=np.float32).reshape(3, 1)
    out = np.empty(7, comp.wire_dtype(a.dtype))
    comp.compress([a, b], out, divisor=2)
    assert out.dtype == np.float16 and out.tolist() == [0, 0.5, 1, 1.5, 0, 0.5, 1]
    assert comp.decompress(out[:4], np.dtype(np.float64)).dtype == np.float64
    assert comp.compresses(np.dtype(np.float32)) and comp.compresses(np.dtype(np.float16))
    assert not comp.compresses(np.dtype(np.int32)) and comp.wire_dtype(np.dtype(np.int32)) == np.int32
    assert Compression.none.wire_dtype(np.dtype(np.float16)) == np.float32  # half types sum in float32
    assert not Compression.none.compresses(np.dtype(np.float16))


def test_auto_prices_a_compressed_bucket_at_its_wire_size_on_mpi_too() -> None:
    """The mpi path now moves 2-byte values: a half bucket costs what its bytes cost."""
    from ddl.base.topology import build_topology

    topo = build_topology(0, HOSTS, "2x2")
    model = cost.default_model(topo)
    assert cost.predict("mpi", topo, 1 << 20, 2, model) < cost.predict("mpi", topo, 1 << 20, 4, model)
