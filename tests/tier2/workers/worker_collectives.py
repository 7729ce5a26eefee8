"""Tier-2 worker: every collective, algorithm, op and dtype under a real mpiexec.

Run by tests/tier2/test_mpi.py at several world sizes and topologies. Any failed check
raises, and ddl's abort hook ends the whole job with the message.
"""

import hashlib
import sys

import numpy as np

import ddl
from ddl.base.dtypes import BFLOAT16
from ddl.reduction.algorithms import SCHEDULED

ddl.init()
r, p = ddl.rank(), ddl.size()
# shm runs where every dim-0 ring shares a host and dims[0] > 1; elsewhere it is refused.
SHM_OK = SCHEDULED["shm"].unavailable(ddl.topology()) is None
ALGS = ["mpi", "ring", "multiring", "halving_doubling", *(["shm"] if SHM_OK else []), "auto"]


def same_everywhere(a: np.ndarray, what: str) -> None:
    digest = hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()
    seen = ddl.allgather_object(digest)
    assert len(set(seen)) == 1, f"{what}: results differ between ranks"


def contribution(q: int, n: int, dtype: np.dtype) -> np.ndarray:
    rng = np.random.default_rng(1000 + q)
    if np.dtype(dtype).kind in "iu":
        return rng.integers(0, 4, size=n).astype(dtype)
    return rng.standard_normal(n).astype(dtype)


# Sums, all algorithms, awkward counts, against a float64 reference.
for alg in ALGS:
    for n in (0, 1, 7, 10_000, 262_147):
        for dt in (np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8):
            if n > 10_000 and dt not in (np.float32,):
                continue
            x = contribution(r, n, dt)
            ref = sum(contribution(q, n, dt).astype(np.float64) for q in range(p))
            y = ddl.allreduce(x, op=ddl.Sum, algorithm=alg, name=f"s.{alg}.{n}")
            assert y.dtype == x.dtype and y.shape == x.shape
            if np.dtype(dt).kind in "iu":
                assert np.array_equal(y, ref.astype(dt)), (alg, n, dt)
            else:
                tol = 2e-2 if dt == np.float16 else 1e-5
                assert np.allclose(y, ref, rtol=tol, atol=tol * p), (alg, n, dt)
            same_everywhere(y, f"{alg} n={n} {np.dtype(dt)}")

# Every op, shapes and non-contiguous input.
base = np.arange(1, 25, dtype=np.float64).reshape(4, 6)
for alg in ALGS:
    x = base + r
    refs = {
        ddl.Sum: sum(base + q for q in range(p)),
        ddl.Average: sum(base + q for q in range(p)) / p,
        ddl.Min: base,
        ddl.Max: base + p - 1,
        ddl.Product: np.prod([base + q for q in range(p)], axis=0),
    }
    for op, ref in refs.items():
        y = ddl.allreduce(x.T, op=op, algorithm=alg)  # transposed: non-contiguous
        assert y.shape == (6, 4) and np.allclose(y, ref.T, rtol=1e-12), (alg, op)
        same_everywhere(y, f"{alg} {op}")
    z = np.zeros((4, 12)) + r
    view = z[:, ::2]
    out = ddl.allreduce_(view, op=ddl.Sum, algorithm=alg)
    assert out is view and np.allclose(z[:, ::2], sum(range(p))) and np.allclose(z[:, 1::2], r)

if BFLOAT16 is not None:
    xb = (np.ones(33) * (r + 1)).astype(BFLOAT16)
    for alg in ALGS:
        yb = ddl.allreduce(xb, op=ddl.Sum, algorithm=alg)
        assert yb.dtype == BFLOAT16 and np.allclose(yb.astype(np.float32), p * (p + 1) / 2)

# Compression on every algorithm (mpi: a user-defined MPI op on 2-byte values), exact for
# small integers, identical on every rank; float16 and bfloat16 wires, Sum and Average.
comps = [ddl.Compression.fp16, *([ddl.Compression.bf16] if BFLOAT16 is not None else [])]
for alg in ALGS:
    for comp in comps:
        for n in (5, 70_001):
            x = (np.arange(n, dtype=np.float32) % 31) + r
            want = sum((np.arange(n, dtype=np.float32) % 31) + q for q in range(p))
            y = ddl.allreduce(x, op=ddl.Sum, algorithm=alg, compression=comp)
            assert y.dtype == np.float32 and np.array_equal(y, want), (alg, comp, n)
            a = ddl.allreduce(x, op=ddl.Average, algorithm=alg, compression=comp)
            assert np.allclose(a, want / p, rtol=1e-2), (alg, comp, n)
            same_everywhere(a, f"{alg} {comp} average n={n}")
        h = ddl.allreduce(np.full(9, 0.5 + r, np.float16), op=ddl.Sum, algorithm=alg, compression=comp)
        assert h.dtype == np.float16 and np.all(h == sum(0.5 + q for q in range(p))), (alg, comp)

# grouped, allgather, broadcast, reducescatter, objects.
g = ddl.grouped_allreduce([np.full(3, r, np.float32), np.full((2, 2), r, np.int64)], op=ddl.Sum)
assert g[0].dtype == np.float32 and np.all(g[0] == sum(range(p))) and g[1].shape == (2, 2)
ga = ddl.allgather(np.full((r + 1, 2), r, np.int32))
assert ga.shape == (p * (p + 1) // 2, 2) and list(ga[:, 0]) == [q for q in range(p) for _ in range(q + 1)]
root = p - 1
b = ddl.broadcast(np.full(5, r, np.float32), root_rank=root)
assert np.all(b == root)
bi = np.full((3, 3), r, np.float64)
assert ddl.broadcast_(bi, root_rank=root) is bi and np.all(bi == root)
rows = 2 * p + 1
rs = ddl.reducescatter(np.ones((rows, 3)) * (r + 1), op=ddl.Sum)
mine = rows // p + (1 if r < rows % p else 0)
assert rs.shape == (mine, 3) and np.allclose(rs, p * (p + 1) / 2)
ra = ddl.reducescatter(np.ones((rows, 3)) * (r + 1), op=ddl.Average)
assert np.allclose(ra, (p + 1) / 2)
assert ddl.broadcast_object({"from": r}, root_rank=root) == {"from": root}
assert ddl.allgather_object(r * 10) == [q * 10 for q in range(p)]
ddl.barrier()

# Errors: clear, raised on every rank, and the job goes on afterwards.
if p > 1:
    try:
        ddl.allreduce(np.zeros(3 + (r == 0)), name="grad.w")
    except ddl.MismatchError as exc:
        assert "grad.w" in str(exc) and "(4,)" in str(exc) and "(3,)" in str(exc), exc
    else:
        raise AssertionError("shape mismatch went unnoticed")
    try:
        if r == 0:
            ddl.allreduce(np.zeros(3))
        else:
            ddl.broadcast(np.zeros(3))
    except ddl.MismatchError as exc:
        assert "allreduce" in str(exc) and "broadcast" in str(exc)
    else:
        raise AssertionError("collective kind mismatch went unnoticed")
if not SHM_OK:
    try:
        ddl.allreduce(np.zeros(2), algorithm="shm")
    except ValueError as exc:
        assert "cannot run here" in str(exc) and "multiring" in str(exc), exc
    else:
        raise AssertionError("shm ran on a topology it cannot serve")
for bad, err in ((lambda: ddl.allreduce(np.zeros(2), algorithm="nope"), ValueError),
                 (lambda: ddl.allreduce(np.zeros(2, np.int32), op=ddl.Adasum), TypeError),
                 (lambda: ddl.allreduce(np.zeros(2, np.complex64)), TypeError)):
    try:
        bad()
    except err:
        pass
    else:
        raise AssertionError("bad input was accepted")
assert np.allclose(ddl.allreduce(np.ones(4), op=ddl.Sum), p)
# Horovod's rule: Average on integers divides and truncates toward zero (-(p-1)/2 -> toward 0).
avg = ddl.allreduce(np.array([r, -r], np.int8))
assert avg.dtype == np.int8 and avg.tolist() == [(p - 1) // 2, -((p - 1) // 2)], avg

topo = ddl.topology()
print(f"PASS rank {r}/{p} topology {topo} shm {'ran' if SHM_OK else 'refused'} local {ddl.local_rank()}/{ddl.local_size()} "
      f"cross {ddl.cross_rank()}/{ddl.cross_size()}", flush=True)
sys.exit(0)
