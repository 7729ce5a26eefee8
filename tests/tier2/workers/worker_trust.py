"""Tier-2 worker: the engine's trust contract under a real mpiexec; the mode is argv[1].

refuse      rank 1 passes an unsupported dtype and catches the TypeError; the others get a
            RemoteError at once; then two threads per rank submit unnamed allreduces.
cycle-error rank 1's engine raises MemoryError inside a cycle; the user catches it; the
            job must still end (abort) on every rank.
settings    run with different DDL_* settings per rank: init refuses on every rank.
init-fails  calibration raises during init: shutdown afterwards returns at once.
late-stop   rank 1 reaches shutdown 3 s after rank 0: rank 0 waits, then all exit cleanly.
Lines "T0 <epoch>" mark the moment of the failure, so the driver times the ending from
there and not from the (load-dependent) start-up.
"""

import contextlib
import random
import sys
import threading
import time

import numpy as np

import ddl

mode = sys.argv[1]


def mark() -> None:
    print(f"T0 {time.time():.3f}", flush=True)


if mode == "settings":
    try:
        ddl.init()
    except ddl.SettingsMismatchError as exc:
        print(f"SETTINGS {exc}", flush=True)
        sys.exit(0)
    raise AssertionError("different settings were accepted")

if mode == "init-fails":
    import ddl.runtime.lifecycle

    def broken(*args, **kwargs):
        raise RuntimeError("calibration probe failed")

    ddl.runtime.lifecycle.calibrate = broken
    with contextlib.suppress(RuntimeError):
        ddl.init()
    start = time.monotonic()
    ddl.shutdown()
    print(f"SHUTDOWN {time.monotonic() - start:.3f}", flush=True)
    sys.exit(0)

ddl.init()
r, p = ddl.rank(), ddl.size()
ddl.allreduce(np.ones(2), name="warmup")

if mode == "refuse":
    if r == 0:
        mark()
    start = time.monotonic()
    try:
        ddl.allreduce(np.ones(3, np.complex64 if r == 1 else np.float32), name="x")
    except TypeError as exc:
        assert r == 1, exc
    except ddl.RemoteError as exc:
        assert r != 1 and "rank 1" in str(exc) and "complex64" in str(exc), exc
    else:
        raise AssertionError("the refused call returned")
    print(f"REFUSED rank {r} after {time.monotonic() - start:.3f} s", flush=True)
    assert np.all(ddl.allreduce(np.ones(2), op=ddl.Sum) == p)  # still usable

    wrong: list[str] = []

    def worker(tag: int) -> None:
        rng = random.Random(tag * 1000 + r)
        for i in range(40):
            if rng.random() < 0.5:
                time.sleep(rng.random() * 0.003)
            got = ddl.allreduce(np.full(4, 1000.0 * tag + i + r, np.float32), op=ddl.Sum)
            want = sum(1000.0 * tag + i + q for q in range(p))
            if not np.all(got == want):
                wrong.append(f"thread {tag} call {i}")

    threads = [threading.Thread(target=worker, args=(t,), name=f"worker-{t}") for t in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong, f"rank {r}: {len(wrong)} of 80 results were another thread's: {wrong[:3]}"
    half = ddl.allreduce(np.full(5, [2048.0, 1.0, 1.0, 1.0][r], np.float16), op=ddl.Sum)
    assert np.all(half == 2048.0 + p - 1), half
    ddl.shutdown()
    print(f"PASS trust rank {r}/{p}", flush=True)

elif mode == "cycle-error":
    if r == 1:
        from ddl.engine import fusion
        real = fusion.execute

        def flaky(ctx, ready, *args):
            if any(q.name == "boom" for q in ready):
                mark()
                raise MemoryError("no room for the fused buffer")
            real(ctx, ready, *args)

        fusion.execute = flaky
    with contextlib.suppress(MemoryError):  # caught by the user: the others must still not wait forever
        ddl.allreduce(np.ones(1 << 16), name="boom", algorithm="ring")
    ddl.allreduce(np.ones(4), name="after")
    time.sleep(30)
    print("UNREACHABLE", flush=True)

elif mode == "late-stop":
    if r == 1:
        time.sleep(3)
    start = time.monotonic()
    ddl.shutdown()
    print(f"STOPPED rank {r} after {time.monotonic() - start:.3f} s", flush=True)
