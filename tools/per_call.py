"""What one ddl call costs beyond its bytes, taken apart: ``python -m tools.per_call [-np 2]``.

Two rows of issue 43, each beside what it is made of, in interleaved rounds under
``ddlrun -np N`` (the slowest rank's time per call; ``min`` over rounds is the machine's
best, ``median`` its typical):

- **one small call** (``ddl.allreduce_`` of 4 KiB, and of 8 B, in place) against MPI's own
  ``Allreduce(IN_PLACE)``; the same 4 KiB as one ``allreduce_async`` and its ``wait`` (a
  Horovod script's per-tensor pair), and with ``algorithm="auto"`` and ``Compression.none``
  named; and against the bare exchange ddl's call is built on: the
  engine's prepared ``Allgather`` of one negotiation record (its header words and the
  payload a record carries at this world size: 4 KiB below 17 ranks, 88 B up to 64),
  started and waited from Python with the payload copied in and the payloads added
  (``record + add``), and without them (``record``). A 4 KiB call too large to ride is
  the record and then MPI's allreduce. ddl's call minus its bare exchange is the Python
  of the lean path (the lane lookup, the baton, the digest, the verdict). The
  ``negotiation words (MIN) + MPI 4 KiB`` row is what a call costs in the compact
  exchange (from 65 ranks): a MIN-allreduce of the negotiation words, then the payload's.
- **256 asynchronous 16 KiB tensors** each waited, against one 4 MiB ``allreduce``, with
  the per-tensor part measured on its own: the submission (``allreduce_async`` x 256, CPU
  time of the calling thread, so other processes' load does not count), taken apart into
  the caller's own loop (the same loop calling a function that does nothing), ddl's call up
  to the queue (the same calls with the engine's ``submit`` answering at once: the public
  function, the signature lookup, the request and its handle) and the queue; and what packing
  the 256 into one buffer (``np.concatenate``) would cost against one 4 MiB copy (the
  bucket no longer packs: its algorithm reads the tensors where they lie,
  :mod:`ddl.reduction.scattered`; the pack row prices the pass that saved).

Prints a table and writes ``per-call.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: The 4 KiB call's bare exchange: its record with the payload riding in it and the payloads
#: added (4 KiB rides below 17 ranks), or the record and then MPI's allreduce (from 17).
BARE_4K = "record + add 4 KiB (or record, then MPI 4 KiB)"
#: One tensor's asynchronous call and its wait (Horovod's allreduce_async + synchronize), and the
#: synchronous call with the defaults named (Horovod code passes compression=Compression.none).
PAIR = "ddl async + wait 4 KiB"
NAMED = "ddl 4 KiB, algorithm='auto' and Compression.none named"
#: The submission's parts (CPU): the caller's loop alone, and ddl's calls with no queue behind them.
SUBMIT = "submit 256 (CPU)"
CALLER_LOOP = "256 calls of a function doing nothing (CPU)"
UNQUEUED = "submit 256, the engine's queue left out (CPU)"


def _timed(comm: Any, fn: Callable[[], Any], reps: int, clock: Callable[[], float] = time.perf_counter) -> float:
    from mpi4py import MPI

    fn()
    comm.Barrier()
    t0 = clock()
    for _ in range(reps):
        fn()
    return float(comm.allreduce((clock() - t0) / reps, op=MPI.MAX))


def worker(rounds: int, out: Path) -> None:
    import numpy as np
    from mpi4py import MPI

    import ddl
    from ddl.engine import codec
    from ddl.runtime import lifecycle

    ddl.init()
    comm = MPI.COMM_WORLD
    eng = lifecycle.engine()
    p = comm.Get_size()
    small = np.zeros(1024, np.float32)
    tiny = np.zeros(2, np.float32)
    # This job's record (its size depends on the world's: codec.record_bytes).
    shared = ddl.context().comm.shared_negotiation  # (then ddl's records go through shared memory, not this gather)
    rb, at = codec.record_bytes(p, shared), codec.HEADER_WORDS * 8
    send = np.zeros(rb, np.uint8)
    recv = np.zeros(p * rb, np.uint8)
    record = comm.Allgather_init(send, recv)

    def bare() -> None:
        record.Start()
        record.Wait()

    def bare_add(x: np.ndarray) -> Callable[[], None]:
        n = x.nbytes
        staged = send[at : at + n].view(x.dtype)
        parts = [recv[q * rb + at : q * rb + at + n].view(x.dtype) for q in range(p)]

        def run() -> None:
            staged[...] = x
            record.Start()
            record.Wait()
            out_ = np.add(parts[0], parts[1], out=x)
            for part in parts[2:]:
                np.add(out_, part, out=out_)
        return run

    def record_then(x: np.ndarray) -> Callable[[], None]:  # a call too large to ride: two collectives
        def run() -> None:
            record.Start()
            record.Wait()
            comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)
        return run

    n, each = 256, 16 << 10
    xs = [np.ones(each // 4, np.float32) for _ in range(n)]
    one = np.ones(n * each // 4, np.float32)
    fused = np.empty(n * each // 4, np.float32)

    def many() -> None:
        hs = [ddl.allreduce_async(x, op=ddl.Sum, name=f"pc{i}") for i, x in enumerate(xs)]
        for h in hs:
            h.wait()

    words = np.zeros(codec.COMPACT_WORDS, np.int64)

    def two_collectives() -> None:  # what a small call is made of in the compact exchange
        comm.Allreduce(MPI.IN_PLACE, words, op=MPI.MIN)
        comm.Allreduce(MPI.IN_PLACE, small, op=MPI.SUM)

    cases: dict[str, tuple[Callable[[], Any], int]] = {
        "ddl 4 KiB": (lambda: ddl.allreduce_(small, op=ddl.Sum), 400),
        "MPI 4 KiB": (lambda: comm.Allreduce(MPI.IN_PLACE, small, op=MPI.SUM), 400),
        PAIR: (lambda: ddl.allreduce_async(small, op=ddl.Sum, name="pair", inplace=True).wait(), 400),
        NAMED: (lambda: ddl.allreduce_(small, op=ddl.Sum, algorithm="auto", compression=ddl.Compression.none), 400),
        "ddl 8 B": (lambda: ddl.allreduce_(tiny, op=ddl.Sum), 400),
        "MPI 8 B": (lambda: comm.Allreduce(MPI.IN_PLACE, tiny, op=MPI.SUM), 400),
        BARE_4K: (bare_add(small) if small.nbytes <= codec.inline_capacity(p, shared) else record_then(small), 400),
        "record + add 8 B": (bare_add(tiny), 400),
        "record": (bare, 400),
        "negotiation words (MIN) + MPI 4 KiB": (two_collectives, 400),
        "256 x 16 KiB async": (many, 4),
        "one 4 MiB": (lambda: ddl.allreduce(one, op=ddl.Sum), 4),
        "pack 256 (concatenate)": (lambda: np.concatenate(xs, out=fused), 8),
        "copy 4 MiB (np.array)": (lambda: np.array(one), 8),
    }
    def nothing(x: np.ndarray, *, op: Any, name: str) -> Any:
        return None

    def answered(req: Any, wake: bool = True) -> Any:
        return req.handle

    def cpu(fn: Callable[[], Any]) -> float:
        comm.Barrier()
        c0 = time.thread_time()
        fn()
        return float(comm.allreduce(time.thread_time() - c0, op=MPI.MAX))

    def unqueued() -> None:  # ddl's call up to the queue: the engine's submit answers at once
        eng.submit = answered  # type: ignore[method-assign]
        try:
            [ddl.allreduce_async(x, op=ddl.Sum, name=f"pc{i}") for i, x in enumerate(xs)]
        finally:
            del eng.submit  # the class's method again

    held: list[Any] = []

    def submitted() -> None:
        held[:] = [ddl.allreduce_async(x, op=ddl.Sum, name=f"pc{i}") for i, x in enumerate(xs)]

    def loop() -> None:
        [nothing(x, op=ddl.Sum, name=f"pc{i}") for i, x in enumerate(xs)]

    times: dict[str, list[float]] = {k: [] for k in cases}
    parts = {SUBMIT: submitted, CALLER_LOOP: loop, UNQUEUED: unqueued}
    cpu_times: dict[str, list[float]] = {k: [] for k in parts}
    for r in range(rounds):
        order = list(cases) if r % 2 == 0 else list(reversed(cases))
        for k in order:
            fn, reps = cases[k]
            times[k].append(_timed(comm, fn, reps))
        # The submission and its two parts in turn, in reversed order every other round: the
        # first loop after the cases runs with cold caches, and each needs its warm rounds.
        for label in (parts if r % 2 == 0 else reversed(parts)):
            cpu_times[label].append(cpu(parts[label]))
            for h in held:  # (the queued ones wait after the clock stopped)
                h.wait()
            held.clear()
    record.Free()
    if comm.Get_rank() == 0:
        rows = {k: {"min_s": min(v), "median_s": statistics.median(v)} for k, v in times.items()}
        rows.update({k: {"min_s": min(v), "median_s": statistics.median(v)} for k, v in cpu_times.items()})
        out.write_text(json.dumps({"ranks": comm.Get_size(), "rows": rows, "cycles": eng.cycles}))
    ddl.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.per_call", description=__doc__.split("\n\n")[0])
    parser.add_argument("-np", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.rounds, args.worker)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    got = args.out / "per-call.json"
    load = os.getloadavg()[0]
    ddlrun = str(Path(sys.executable).with_name("ddlrun"))
    subprocess.run([ddlrun, "-np", str(args.np), sys.executable, "-m", "tools.per_call", "--rounds",
                    str(args.rounds), "--worker", str(got)], check=True, stdout=subprocess.DEVNULL)
    data = json.loads(got.read_text())
    rows = data["rows"]
    print(f"per-call cost, {args.np} ranks, {args.rounds} interleaved rounds, load {load:.1f}-{os.getloadavg()[0]:.1f}")
    print("| case | min us | median us |")
    print("| --- | ---: | ---: |")
    for k, v in rows.items():
        print(f"| {k} | {v['min_s'] * 1e6:.1f} | {v['median_s'] * 1e6:.1f} |")

    def ratio(a: str, b: str, stat: str) -> float:
        return float(rows[a][stat] / rows[b][stat])

    for size, bare in (("4 KiB", BARE_4K), ("8 B", "record + add 8 B")):
        print(f"MPI/ddl at {size}: {ratio(f'MPI {size}', f'ddl {size}', 'min_s'):.2f} (min), "
              f"{ratio(f'MPI {size}', f'ddl {size}', 'median_s'):.2f} (median); its exchange bare ({bare}): "
              f"{rows[bare]['min_s'] * 1e6:.1f} us, the rest (the lean path's Python, and at more ranks than "
              f"cores its waits to be scheduled): {(rows[f'ddl {size}']['min_s'] - rows[bare]['min_s']) * 1e6:.1f} us (min)")
    print(f"one tensor's async + wait at 4 KiB: {rows[PAIR]['min_s'] * 1e6:.1f} us, "
          f"{ratio(PAIR, 'ddl 4 KiB', 'min_s'):.2f}x the synchronous call and {ratio(PAIR, 'MPI 4 KiB', 'min_s'):.2f}x "
          f"MPI's (min); the defaults named: {ratio(NAMED, 'ddl 4 KiB', 'min_s'):.2f}x the call without them")
    print(f"256 async / one: {ratio('256 x 16 KiB async', 'one 4 MiB', 'min_s'):.2f} (min), "
          f"{ratio('256 x 16 KiB async', 'one 4 MiB', 'median_s'):.2f} (median); submission "
          f"{rows[SUBMIT]['min_s'] / 256 * 1e6:.2f} us CPU a tensor, pack "
          f"{(rows['pack 256 (concatenate)']['min_s'] - rows['copy 4 MiB (np.array)']['min_s']) * 1e6:.0f} us "
          "more than one copy")
    submit, loop, unq = (rows[k]["min_s"] / 256 * 1e6 for k in (SUBMIT, CALLER_LOOP, UNQUEUED))
    print(f"a submission, taken apart (min, us CPU a tensor): the caller's loop {loop:.2f}, ddl's call up to the "
          f"queue {unq - loop:.2f}, the queue {submit - unq:.2f}; the 256 submissions alone are "
          f"{ratio(SUBMIT, 'one 4 MiB', 'min_s'):.2f}x the one 4 MiB call's whole time (min)")
    data["load"] = load
    got.write_text(json.dumps(data, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
