"""Tier-2 worker: the async engine — ordering, overlap, fusion, compression, mismatch."""

import sys
import threading
import time

import numpy as np

import ddl

ddl.init()
r, p = ddl.rank(), ddl.size()

# Named tensors submitted in a different order on every rank still match by name.
names = ["a", "b", "c", "d"]
order = names[r % 4:] + names[: r % 4]
handles = {n: ddl.allreduce_async(np.full(5, names.index(n) + r, np.float64), op=ddl.Sum, name=n) for n in order}
for n in names:
    want = sum(names.index(n) + q for q in range(p))
    assert np.all(handles[n].wait() == want), n
    assert handles[n].done()

# The calling thread keeps running while a large allreduce is in flight.
big = np.ones(8 << 20, np.float32)
h = ddl.allreduce_async(big, op=ddl.Sum, name="big")
ticks = 0
while not h.done():
    np.sqrt(np.arange(1000.0))
    ticks += 1
assert np.all(h.wait() == p)
if p > 1:
    assert ticks > 3, f"main thread made only {ticks} steps of progress during a large allreduce"

# Many small tensors are fused; results come back split and in place where asked.
xs = [np.full(4096, i + r, np.float32) for i in range(256)]
hs = [ddl.allreduce_async(x, op=ddl.Sum, name=f"g{i}") for i, x in enumerate(xs)]
for i, hh in enumerate(hs):
    assert np.all(hh.wait() == sum(i + q for q in range(p)))
z = np.full((3, 4), r, np.float32)
assert ddl.allreduce_(z, op=ddl.Sum) is z and np.all(z == sum(range(p)))
g = ddl.grouped_allreduce([np.ones(3), np.ones(2, np.int32)], op=ddl.Sum)
assert np.all(g[0] == p) and g[1].dtype == np.int32 and np.all(g[1] == p)

# fp16 compression: values whose float16 sum would overflow average correctly.
grad = np.full(1000, 60000.0, np.float32) + r
avg = ddl.allreduce(grad, compression=ddl.Compression.fp16, name="fp16")
assert avg.dtype == np.float32 and np.allclose(avg, 60000.0 + (p - 1) / 2, rtol=1e-3), avg[:3]
s16 = ddl.allreduce(np.full(10, 1.5, np.float64), op=ddl.Sum, compression="fp16")
assert np.allclose(s16, 1.5 * p)

if p > 1:
    # Same name, different shape: MismatchError on every rank, quickly, and the job goes on.
    start = time.monotonic()
    try:
        ddl.allreduce(np.zeros(2 + r), name="w")
    except ddl.MismatchError as exc:
        text = str(exc)
        assert "'w'" in text and "(2,)" in text and "(3,)" in text, text
    else:
        raise AssertionError("shape mismatch went unnoticed")
    assert time.monotonic() - start < 10
    # Different collectives at the same point: also a MismatchError everywhere.
    try:
        if r == 0:
            ddl.allreduce(np.zeros(3))
        else:
            ddl.broadcast(np.zeros(3))
    except ddl.MismatchError as exc:
        assert "allreduce" in str(exc) and "broadcast" in str(exc), str(exc)
    else:
        raise AssertionError("kind mismatch went unnoticed")
    # A name may not be in flight twice.
    h1 = ddl.allreduce_async(np.ones(3), name="dup")
    try:
        ddl.allreduce_async(np.ones(3), name="dup")
    except ValueError as exc:
        assert "dup" in str(exc)
    else:
        raise AssertionError("duplicate in-flight name accepted")
    h1.wait()

assert np.all(ddl.allreduce(np.ones(2), op=ddl.Sum) == p)
hooked = sys.excepthook is not sys.__excepthook__
ddl.shutdown()
# While ddl ran (several ranks), an uncaught exception would abort the job; after shutdown
# the interpreter's own hooks are back (an exception is an ordinary one again).
assert hooked == (p > 1) and sys.excepthook is sys.__excepthook__ and threading.excepthook is threading.__excepthook__
print(f"PASS engine rank {r}/{p}", flush=True)
