"""``ddl bench rehearsal``: a training step's gradient stream replayed on the ranks it runs on.

Every rank replays one step of a real model's gradients (``--model``: the built-in
``resnet50``, an ONNX file or a torch factory, as ``ddl plan`` takes them): the buckets
``ddl.torch`` would fill (:func:`ddl.reduction.buckets.gradient_buckets`, with the presence
flags its buffers carry), each gradient landing when backward would produce
it (:func:`ddl.reduction.step_plan.landing_times`) and each bucket's allreduce starting the
moment its last gradient lands, as ``ddl.torch``'s hooks start it. The compute itself
is a wait, so the cores stay free for communication, and it lasts ``--compute-ms``, or
is scaled so that compute : link time matches a real cluster (``--like ddl-p100``:
IBM DDL's ResNet-50 on 64 hosts with one 100 Gbit port each, a 200 ms step, given this
cluster's per-host ``--link``).

Contenders, in interleaved rounds: ``auto``, every fixed algorithm, and MPI's own
allreduce on the same buckets from a thread of its own (the Horovod-over-MPI shape,
without Horovod's negotiation). Per contender: the step (slowest rank), the compute-only
step measured in it (the last gradient's landing), scaling efficiency = compute-only /
step, the bucket allreduces back to back without compute (the communication alone), and
``ddl plan``'s prediction of each from the cost model ``auto`` uses. One table, JSON
and a plot. Run it under ``ddlrun`` (or ``-np N``). On emulated hosts, run
``python -m emulation.rehearsal`` from a checkout: the emulation is a repository harness,
not part of the package, so this shipped command never imports it.
"""

from __future__ import annotations

import argparse
import dataclasses
import queue
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ddl.reduction.buckets import (
    BUCKET_BYTES,
    FIRST_BUCKET_BYTES,
    FLAGS_PER_TENSOR,
    MiB,
    gradient_buckets,
)
from ddl.reduction.step_plan import landing_times
from ddl.tools import plan
from ddl.tools.arg_types import amount, count
from ddl.tools.helptext import plain
from ddl.tools.plan_models import ModelSpecError, gradient_sizes


@dataclasses.dataclass(frozen=True)
class Reference:
    """A real cluster's step and network, whose compute : link-time ratio a rehearsal keeps."""

    step_ms: float
    link: str
    hosts: int
    about: str


REFERENCES = {
    "ddl-p100": Reference(200.0, "100gbit", 64, "IBM DDL 2017: ResNet-50, 64 hosts x 4 P100, one 100 Gbit "
                          "EDR port per host, ~200 ms per step at 32 images (docs: ddl plan's worked example)"),
}
#: MPI's own allreduce on a thread of its own, beside ddl's engine.
MPI_PEER = "MPI_Allreduce"
FIXED = ("ring", "multiring", "halving_doubling", "shm", "mpi")


def link_bound(nbytes: int, hosts: int, rate: float) -> float:
    """Seconds to move 2(H-1)/H x N bytes through one host's port of ``rate`` bytes/s."""
    return 2 * (hosts - 1) / hosts * nbytes / rate


def scaled_compute(total_bytes: int, hosts: int, link: str, like: Reference) -> float:
    """The step whose ratio to this cluster's link bound is ``like``'s step to its own.

    Raises:
        plan.PlanError: one host (no link to scale by) or an unreadable rate.
    """
    if hosts < 2:
        raise plan.PlanError("one host has no link to scale the compute by; give --compute-ms")
    here = link_bound(total_bytes, hosts, plan.parse_bandwidth(link))
    there = link_bound(total_bytes, like.hosts, plan.parse_bandwidth(like.link))
    return like.step_ms / 1e3 * here / there


@dataclasses.dataclass
class Stream:
    """One step's gradient stream: tensors, their buckets and when each lands."""

    sizes: list[int]  # elements per gradient, forward order
    buckets: list[list[int]]  # gradient indices, in the order the buckets fill
    lands: list[float]  # seconds after the step starts, per gradient
    compute: float

    @classmethod
    def build(cls, sizes: list[int], itemsize: int, *, compute: float, backward_fraction: float,
              first_cap: int, cap: int) -> Stream:
        nbytes = [n * itemsize for n in sizes]
        buckets = gradient_buckets(sizes, [itemsize] * len(sizes), first_cap=first_cap, cap=cap)
        return cls(sizes, [list(b.members) for b in buckets],
                   landing_times(nbytes, step=compute, backward_fraction=backward_fraction), compute)

    def events(self) -> list[tuple[float, int, int, bool]]:
        """(time, gradient, bucket, whether it completes its bucket), in landing order."""
        owner = {i: k for k, members in enumerate(self.buckets) for i in members}
        left = [len(m) for m in self.buckets]
        out = []
        for i in sorted(range(len(self.sizes)), key=lambda i: (self.lands[i], -i)):
            k = owner[i]
            left[k] -= 1
            out.append((self.lands[i], i, k, left[k] == 0))
        return out


class Buckets:
    """Each bucket's flat buffer (gradients, then the presence flags, as ``ddl.torch``'s)."""

    def __init__(self, stream: Stream, dtype: np.dtype) -> None:
        self.buffers: list[np.ndarray] = []
        self.slices: dict[int, tuple[int, int, int]] = {}
        for members in stream.buckets:
            offset = 0
            for i in members:
                self.slices[i] = (len(self.buffers), offset, offset + stream.sizes[i])
                offset += stream.sizes[i]
            self.buffers.append(np.zeros(offset + FLAGS_PER_TENSOR * len(members), dtype))
        self.flags = [len(b) - FLAGS_PER_TENSOR * len(m) for b, m in zip(self.buffers, stream.buckets, strict=True)]

    def land(self, gradient: int, value: float) -> None:
        """Write one gradient into its bucket (backward writing ``.grad`` in place)."""
        k, lo, hi = self.slices[gradient]
        self.buffers[k][lo:hi] = value

    def close(self, k: int) -> None:
        self.buffers[k][self.flags[k]:] = 1.0

    def correct(self, expected: float, rtol: float) -> bool:
        return all(np.allclose(b[: f], expected, rtol=rtol) and np.all(b[f:] == 1.0)
                   for b, f in zip(self.buffers, self.flags, strict=True))


class BucketClock:
    """Records when the engine starts and ends each bucket (in place of its timeline)."""

    def __init__(self) -> None:
        self.spans: dict[str, tuple[float, float, str]] = {}

    def tensor(self, name: str, submitted: float, start: float, fused: float,
               phases: list[tuple[str, float, float]], end: float, info: dict[str, Any]) -> None:
        self.spans[name] = (start, end, str(info.get("algorithm", "")))

    def span(self, name: str, kind: str, submitted: float, start: float, end: float, info: dict[str, Any]) -> None:
        pass


class MPIPeer:
    """MPI's own allreduce of each bucket, in order, from a thread of its own (Horovod's shape)."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.jobs: queue.Queue[tuple[int, np.ndarray] | None] = queue.Queue()
        self.spans: dict[int, tuple[float, float]] = {}
        self.thread = threading.Thread(target=self._run, name="rehearsal-mpi", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from mpi4py import MPI

        p = self.comm.Get_size()
        while (job := self.jobs.get()) is not None:
            k, buf = job
            start = time.perf_counter()
            self.comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
            np.divide(buf, p, out=buf)
            self.spans[k] = (start, time.perf_counter())
            self.jobs.task_done()

    def stop(self) -> None:
        self.jobs.put(None)
        self.thread.join()


@dataclasses.dataclass
class Measured:
    """One step of one contender on this rank, in seconds from the step's start."""

    step: float
    compute: float
    ready: list[float]
    start: list[float]
    end: list[float]
    algorithms: list[str]


def run_step(stream: Stream, bufs: Buckets, contender: str, *, compute: bool, value: float,
             clock: BucketClock, peer: MPIPeer, compression: Any, barrier: Callable[[], None]) -> Measured:
    """Replay one step and wait for every bucket: the step ``ddl.torch`` would run."""
    import ddl

    n = len(stream.buckets)
    ready, handles = [0.0] * n, [None] * n  # type: list[float], list[Any]
    barrier()
    t0 = time.perf_counter()
    for at, i, k, closes in stream.events():
        if compute:
            delay = t0 + at - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        bufs.land(i, value)
        if closes:
            bufs.close(k)
            ready[k] = time.perf_counter() - t0
            if contender == MPI_PEER:
                peer.jobs.put((k, bufs.buffers[k]))
            else:
                handles[k] = ddl.allreduce_async(bufs.buffers[k], op=ddl.Average, name=f"rehearsal.b{k}",
                                                 algorithm=contender, compression=compression, inplace=True)
    landed = time.perf_counter() - t0
    if contender == MPI_PEER:
        peer.jobs.join()
        spans = [peer.spans[k] for k in range(n)]
        algs = ["MPI"] * n
    else:
        for h in handles:
            h.wait()
        got = [clock.spans[f"rehearsal.b{k}"] for k in range(n)]
        spans, algs = [(s, e) for s, e, _ in got], [a for _, _, a in got]
    step = time.perf_counter() - t0
    return Measured(step, landed, ready, [s - t0 for s, _ in spans], [e - t0 for _, e in spans], algs)


def slowest(comm: Any, m: Measured) -> Measured:
    """Every field's maximum over ranks (a bucket starts when its last rank is ready)."""
    from mpi4py import MPI

    n = len(m.ready)
    mine = np.array([m.step, m.compute, *m.ready, *m.start, *m.end], np.float64)
    worst = np.empty_like(mine)
    comm.Allreduce(mine, worst, op=MPI.MAX)
    w = worst.tolist()
    return Measured(w[0], w[1], w[2 : 2 + n], w[2 + n : 2 + 2 * n], w[2 + 2 * n :], m.algorithms)


def predict(stream: Stream, itemsize: int, contender: str, *, compute: float, backward_fraction: float,
            first_cap: int, cap: int, topology: Any, model: Any) -> dict[str, Any]:
    """``ddl plan``'s step for this contender (MPI's own allreduce priced as ``mpi``)."""
    algorithm = "mpi" if contender == MPI_PEER else contender
    runs = plan.step_schedule(stream.sizes, itemsize, topology, model, step=compute,
                              backward_fraction=backward_fraction, first_cap=first_cap, cap=cap, algorithm=algorithm)
    return {"step_s": max(compute, runs[-1].end), "comm_s": sum(r.end - r.start for r in runs),
            "buckets": [dataclasses.asdict(r) for r in runs]}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ddl bench rehearsal", description=plain(__doc__),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet50", help="resnet50, FILE.onnx, package.module:factory, sizes")
    p.add_argument("--compute-ms", type=amount, help="one rank's step to replay (default: scaled by --like)")
    p.add_argument("--like", default="ddl-p100", choices=sorted(REFERENCES),
                   help="the real cluster whose compute : link time ratio to keep (with --link)")
    p.add_argument("--link", help="this cluster's per-host port rate (1gbit, 200mbit): scales the compute")
    p.add_argument("--backward-fraction", type=float, default=2 / 3)
    p.add_argument("--bucket-mb", type=amount, default=BUCKET_BYTES / MiB)
    p.add_argument("--first-bucket-mb", type=amount, default=FIRST_BUCKET_BYTES / MiB)
    p.add_argument("--contenders", help=f"comma list (default: auto, the fixed algorithms this topology runs, "
                                        f"{MPI_PEER})")
    p.add_argument("--compression", default="none", choices=["none", "fp16", "bf16"])
    p.add_argument("--rounds", type=count(), default=2, help="interleaved rounds of one step per contender")
    p.add_argument("--out", default="bench-results", help="folder for the JSON and the plot")
    p.add_argument("--tag", default="", help="name stem of the output files (default: rehearsal-<dims>)")
    p.add_argument("-np", dest="np", type=count(), help="re-launch on N ranks of this host under ddlrun")
    return p


def main(argv: list[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(args_list)
    if args.np:
        from ddl.launcher.relaunch import relaunch

        i = args_list.index("-np")
        return relaunch(args.np, ["-m", "ddl_bench.rehearsal", *args_list[:i], *args_list[i + 2 :]]).returncode
    try:
        sizes, source = gradient_sizes(args.model)
    except ModelSpecError as exc:
        print(f"ddl bench rehearsal: {exc}", file=sys.stderr)
        return 2
    return _worker(args, sizes, source)


def _worker(args: argparse.Namespace, sizes: list[int], source: str) -> int:
    from mpi4py import MPI

    import ddl
    from ddl.reduction.algorithms import SCHEDULED
    from ddl.runtime import lifecycle

    ddl.init()
    comm = MPI.COMM_WORLD.Dup()
    topology, rank, p = ddl.topology(), ddl.rank(), ddl.size()
    itemsize = 4
    total = sum(sizes) * itemsize
    first_cap, cap = int(args.first_bucket_mb * MiB), int(args.bucket_mb * MiB)
    try:
        compute = args.compute_ms / 1e3 if args.compute_ms is not None else \
            scaled_compute(total, topology.cross_size, args.link or "", REFERENCES[args.like])
    except plan.PlanError as exc:
        if rank == 0:
            print(f"ddl bench rehearsal: {exc} (or give --link, this cluster's per-host port rate)", file=sys.stderr)
        ddl.shutdown()
        return 2
    names = args.contenders.split(",") if args.contenders else \
        ["auto", *[a for a in FIXED if a not in SCHEDULED or SCHEDULED[a].unavailable(topology) is None], MPI_PEER]
    compression = {"none": ddl.Compression.none, "fp16": ddl.Compression.fp16}.get(args.compression) \
        or ddl.Compression.bf16
    if args.compression != "none" and MPI_PEER in names:
        names.remove(MPI_PEER)  # MPI's own allreduce has no compressed form here
    stream = Stream.build(sizes, itemsize, compute=compute, backward_fraction=args.backward_fraction,
                          first_cap=first_cap, cap=cap)
    burst = dataclasses.replace(stream, lands=[0.0] * len(sizes), compute=0.0)
    bufs = Buckets(stream, np.dtype(np.float32))
    eng = lifecycle.engine()
    saved, clock = eng.timeline, BucketClock()
    eng.timeline = clock  # type: ignore[assignment]
    peer = MPIPeer(comm.Dup())
    value, expected = float(rank + 1), (p + 1) / 2
    rtol = 1e-6 if args.compression == "none" else 1e-2
    steps: dict[str, list[Measured]] = {n: [] for n in names}
    bursts: dict[str, Measured] = {}
    correct = True

    def one(name: str, s: Stream, timed: bool) -> Measured:
        nonlocal correct
        m = run_step(s, bufs, name, compute=timed, value=value, clock=clock, peer=peer, compression=compression,
                     barrier=comm.Barrier)
        correct = correct and bool(comm.allreduce(bufs.correct(expected, rtol), op=MPI.LAND))
        return slowest(comm, m)

    for name in names:  # warm-up (connections, schedules) and the communication alone
        one(name, burst, False)
        bursts[name] = one(name, burst, False)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            steps[name].append(one(name, stream, True))
            if rank == 0:
                print(f"round {r + 1}: {name} step {steps[name][-1].step:.3f} s", flush=True)
    peer.stop()
    eng.timeline = saved
    model, calibrated = ddl.context().model, ddl.context().calibration
    record: dict[str, Any] = {
        "model": source, "tensors": len(sizes), "bytes": total, "ranks": p, "dims": list(topology.dims),
        "wire_bytes": total // 2 if args.compression != "none" else total,  # what crosses the links
        "hosts": topology.cross_size, "compute_s": compute, "link": args.link, "like": None if args.compute_ms
        else dataclasses.asdict(REFERENCES[args.like]), "compression": args.compression,
        "backward_fraction": args.backward_fraction, "rounds": args.rounds, "correct": correct,
        "buckets": [sum(stream.sizes[i] for i in m) * itemsize for m in stream.buckets],
        "calibration": calibrated.describe() if calibrated is not None else "",
        "contenders": {},
    }
    for name in names:
        pred, pred_burst = (predict(s, itemsize, name, compute=s.compute, backward_fraction=args.backward_fraction,
                                    first_cap=first_cap, cap=cap, topology=topology, model=model)
                            for s in (stream, burst))
        record["contenders"][name] = {
            "steps": [dataclasses.asdict(m) for m in steps[name]],
            "burst": dataclasses.asdict(bursts[name]),
            "predicted": pred, "predicted_burst": pred_burst,
        }
    if args.link and topology.cross_size > 1:
        record["link_bound_s"] = link_bound(record["wire_bytes"], topology.cross_size, plan.parse_bandwidth(args.link))
    if rank == 0:
        from ddl_bench import rehearsal_report

        out = Path(args.out)
        stem = args.tag or f"rehearsal-{'x'.join(map(str, topology.dims))}"
        print("\n".join(rehearsal_report.table(record)))
        rehearsal_report.write(record, out, stem)
    ddl.shutdown()
    return 0 if correct else 1


if __name__ == "__main__":
    raise SystemExit(main())
