"""Tier-2 worker on emulated hosts: discovery, every algorithm across the links, or a loop.

Run by tests/tier2/test_multihost.py under ``ddlrun -H``/``--hostfile`` in
``emulation.cluster``. ``check``: every algorithm, exact and bit-identical on every
rank, and prints the payload bytes reduced (the test compares them with the veth
counters). ``compression``: per algorithm, the bytes this host's link sent for three
8 MiB allreduces with and without fp16 compression (read from the namespace's own
interface counters between barriers). ``small``: discovery and one 1 MiB allreduce.
``loop``: allreduces until killed. A failed check raises, and ddl's abort hook ends the whole job.
"""

import hashlib
import socket
import sys
import time

import numpy as np

import ddl

mode = sys.argv[1]
ddl.init()
r, p, topo = ddl.rank(), ddl.size(), ddl.topology()
print(f"RANK {r}/{p} host={socket.gethostname()} dims={topo} local={ddl.local_rank()}/{ddl.local_size()} "
      f"cross={ddl.cross_rank()}/{ddl.cross_size()}", flush=True)
ALGS = ["mpi", "ring", "multiring", "halving_doubling", "auto"]
payload = 0


def same_everywhere(a: np.ndarray, what: str) -> None:
    digest = hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()
    assert len(set(ddl.allgather_object(digest))) == 1, f"{what}: results differ between ranks"


def contribution(q: int, n: int) -> np.ndarray:
    return np.random.default_rng(1000 + q).standard_normal(n).astype(np.float32)


if mode == "check":
    # Exchanges with the other hosts' ranks wait yielding the core (ddl.wire.waits.yielding_waitall).
    from ddl.runtime import lifecycle

    hosts = ddl.allgather_object(socket.gethostname())
    want = frozenset(q for q in range(p) if hosts[q] != hosts[r])
    assert lifecycle.engine().ctx.comm.remote == want, (lifecycle.engine().ctx.comm.remote, want)
    for alg in ALGS:
        for n in (1, 7, 10_003, 262_147):
            x = contribution(r, n)
            ref = sum(contribution(q, n).astype(np.float64) for q in range(p))
            y = ddl.allreduce(x, op=ddl.Sum, algorithm=alg, name=f"s.{alg}.{n}")
            assert np.allclose(y, ref, rtol=1e-5, atol=1e-5 * p), (alg, n)
            same_everywhere(y, f"{alg} n={n}")
            payload += x.nbytes
        # Small integers in float32 sum exactly whatever the order: equal to the bit.
        z = ddl.allreduce(np.full(1 << 18, r + 1, np.float32), op=ddl.Sum, algorithm=alg)
        assert np.array_equal(z, np.full(1 << 18, p * (p + 1) / 2, np.float32)), alg
        payload += z.nbytes
    # shm across the hosts runs pipelined (ddl.reduction.pipelined) at 8 MiB: the same bits
    # as step after step, over real MPI's nonblocking messages.
    from ddl.reduction import pipelined

    real_plan, cuts = pipelined.plan, []

    def plan(schedule, itemsize):  # type: ignore[no-untyped-def]
        got = real_plan(schedule, itemsize)
        cuts.append(got.fractions if got else 0)
        return got

    x = contribution(r, 1 << 21)
    pipelined.plan = plan
    piped = ddl.allreduce(x, op=ddl.Sum, algorithm="shm", name="piped")
    pipelined.plan = lambda schedule, itemsize: None
    plain = ddl.allreduce(x, op=ddl.Sum, algorithm="shm", name="plain")
    pipelined.plan = real_plan
    assert cuts and min(cuts) >= 2, cuts
    assert piped.tobytes() == plain.tobytes(), "pipelined shm differs from step after step"
    same_everywhere(piped, "pipelined shm")
    payload += 2 * x.nbytes
    print(f"PASS rank {r} payload {payload}", flush=True)
elif mode == "compression":
    from pathlib import Path

    def sent() -> int:  # bytes out of this emulated host, all its ranks together
        return sum(int((d / "statistics" / "tx_bytes").read_text()) for d in Path("/sys/class/net").iterdir()
                   if d.name != "lo")

    n = 2 << 20  # 8 MiB of float32; small integers, exact in float16, so every sum is exact
    x = (np.arange(n, dtype=np.float32) % 97) + r
    want = sum((np.arange(n, dtype=np.float32) % 97) + q for q in range(p))
    for alg in [*ALGS[:-1], "shm", "auto"]:
        for comp in ("none", "fp16"):
            ddl.allreduce(x, op=ddl.Sum, algorithm=alg, compression=comp, name=f"w.{alg}.{comp}")  # warm-up
            ddl.barrier()
            before = sent()
            for i in range(3):
                y = ddl.allreduce(x, op=ddl.Sum, algorithm=alg, compression=comp, name=f"c.{alg}.{comp}.{i}")
                assert np.array_equal(y, want), (alg, comp)
            ddl.barrier()
            if ddl.local_rank() == 0:
                print(f"BYTES {alg} {comp} h{ddl.cross_rank() + 1} {sent() - before}", flush=True)
    print(f"PASS rank {r} payload {3 * x.nbytes}", flush=True)
elif mode == "small":
    y = ddl.allreduce(np.full(1 << 18, r, np.float32), op=ddl.Sum, algorithm="multiring")
    assert np.all(y == sum(range(p)))
    print(f"PASS rank {r} payload {y.nbytes}", flush=True)
elif mode == "loop":
    x = np.ones(1 << 16, np.float32)
    print(f"LOOPING rank {r}", flush=True)
    while True:
        ddl.allreduce(x, op=ddl.Sum, algorithm="ring")
        time.sleep(0.01)
ddl.shutdown()
