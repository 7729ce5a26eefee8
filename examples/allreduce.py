"""Allreduce with every algorithm; rank 0 prints a table of results and timings.

    ddlrun -np 4 --topology 2x2 python examples/allreduce.py
"""

import hashlib
import time

import numpy as np

import ddl

ddl.init()
rank, size, topo = ddl.rank(), ddl.size(), ddl.topology()
count = 1 << 20  # 4 MiB of float32
repeats = 10

# Rank r contributes r + i at position i, so the sum is known in closed form.
x = np.arange(count, dtype=np.float32) + rank
expected = size * np.arange(count, dtype=np.float64) + size * (size - 1) / 2

if rank == 0:
    print(f"ddl {ddl.__version__}: {size} ranks, {topo.cross_size} host(s), topology {topo}")
    print(f"{'algorithm':<18}{'resolved':<18}{'ms/allreduce':>13}{'max rel err':>13}  identical on all ranks")
for algorithm in ("mpi", "ring", "multiring", "halving_doubling", "auto"):
    y = ddl.allreduce(x, op=ddl.Sum, algorithm=algorithm)
    err = float(np.max(np.abs(y - expected) / np.maximum(expected, 1)))
    digests = ddl.allgather_object(hashlib.sha256(y.tobytes()).hexdigest())
    ddl.barrier()
    start = time.perf_counter()
    for _ in range(repeats):
        ddl.allreduce(x, op=ddl.Sum, algorithm=algorithm)
    ms = max(ddl.allgather_object((time.perf_counter() - start) / repeats * 1e3))
    resolved = ddl.context().resolve_algorithm(algorithm, count, 4)
    if rank == 0:
        same = "yes" if len(set(digests)) == 1 else "NO"
        print(f"{algorithm:<18}{resolved:<18}{ms:>13.2f}{err:>13.1e}  {same}")
    assert err < 1e-6 and len(set(digests)) == 1, f"{algorithm}: wrong or diverging result"
