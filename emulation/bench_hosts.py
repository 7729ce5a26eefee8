"""``python -m emulation.bench_hosts``: measured vs predicted allreduce on emulated hosts (root only).

For each host count (``--hosts 2,3``, ``--ranks-per-host`` each, 2 by default) and link
rate (``--rates 1gbit,none``) it brings up :class:`emulation.cluster.Cluster`, runs one ``ddlrun -H``
job that times every algorithm, ``auto`` and MPI's own ``Allreduce`` at 8 KiB - 64 MiB
(interleaved rounds, median of the slowest rank), with ``init``'s calibration written
to a file; then prices the same sizes with ``ddl plan``'s model from that file, and
checks that the traffic crossed the veths. Prints a table and writes ``hosts.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

SIZES = (8 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20)
FIXED = ("mpi", "ring", "multiring", "halving_doubling")


def worker(args: argparse.Namespace) -> int:
    """One rank of the measuring job (run under ddlrun by :func:`main`)."""
    from ddl_bench import peers
    from mpi4py import MPI

    import ddl

    ddl.init()
    comm = MPI.COMM_WORLD.Dup()
    rank, p = comm.Get_rank(), comm.Get_size()
    from ddl_bench.allreduce import auto_choice, ddl_allreduce

    from ddl.reduction import cost
    from ddl.reduction.algorithms import SCHEDULED

    shm = ("shm",) if SCHEDULED["shm"].unavailable(ddl.topology()) is None else ()
    fns: dict[str, Callable[[np.ndarray], np.ndarray]] = {a: ddl_allreduce(a) for a in (*FIXED, *shm, "auto")}
    fns["MPI_Allreduce"] = peers.mpi_allreduce(comm)
    from ddl.reduction import calibration
    from ddl.wire.comm import MPIComm

    probe_comm = MPIComm(MPI.COMM_WORLD.Dup())  # its own communicator: the engine keeps ddl's
    rows = []
    for nbytes in [s for s in SIZES if args.min_bytes <= s <= args.max_bytes]:
        # The model again, in the same minute as this size's timings: on a shared machine
        # the load drifts, and init's probes alone may have met a different one.
        cal = calibration.measure(probe_comm, ddl.topology(), segment_bytes=ddl.context().config.segment_bytes)
        if rank == 0:
            calibration.save(f"{args.worker}.{nbytes}.cal", cal, {"world_size": p, "dims": list(ddl.topology().dims)})
        x = np.full(nbytes // 4, rank + 1, np.float32)
        samples: dict[str, list[float]] = {n: [] for n in fns}
        correct = {}
        for name, fn in fns.items():  # warm-up, and the result that is checked
            correct[name] = bool(comm.allreduce(bool(np.all(fn(x) == p * (p + 1) / 2)), op=MPI.LAND))
        trials, key = ddl.context().trials, (cost.size_class(nbytes), 4)
        for _ in range(64):  # auto past its trials: the steady state training sees
            # Agreed: a call the engine thread ran returns before that thread settles the
            # trial, so one rank may read "trying" where the others read "settled".
            if trials is None or comm.allreduce(trials.settled(key), op=MPI.LAND):
                break
            fns["auto"](x)
        for _ in range(args.rounds):  # rounds interleave the contenders: noise hits all alike
            for name, fn in fns.items():
                for _ in range(1 if nbytes >= 4 << 20 else 5):
                    comm.Barrier()  # one allreduce from a common start, as the model prices it
                    t0 = time.perf_counter()
                    fn(x)
                    samples[name].append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
        picked = auto_choice(ddl.context(), nbytes)
        for name in fns:
            rows.append({"bytes": nbytes, "contender": name, "time_s": statistics.median(samples[name]),
                         "correct": correct[name], "auto_picked": picked if name == "auto" else ""})
    if rank == 0:
        Path(args.worker).write_text(json.dumps({"ranks": p, "rows": rows}))
    ddl.shutdown()
    return 0 if all(r["correct"] for r in rows) else 1


def run_config(hosts: int, rate: str | None, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Measure on one emulated cluster and price the same sizes from its calibration."""
    from ddl.tools import plan
    from emulation.cluster import Cluster

    rph = args.ranks_per_host
    tag = f"{hosts}x{rph}-{rate or 'unshaped'}"
    out, cal = tmp / f"{tag}.json", tmp / f"{tag}-calibration.json"
    with Cluster(hosts=hosts, ranks_per_host=rph, rate=rate, latency=args.queue) as cluster:
        before = cluster.counters()
        argv = [sys.executable, "-m", "ddl.launcher.cli", "-np", str(rph * hosts), "-H", cluster.host_list(),
                "--calibration", str(cal), sys.executable, "-m", "emulation.bench_hosts", "--worker", str(out),
                "--rounds", str(args.rounds), "--max-bytes", str(args.max_bytes), "--min-bytes", str(args.min_bytes)]
        t0, load0 = time.monotonic(), os.getloadavg()[0]
        proc = cluster.run(argv, timeout=args.timeout)
        wall, load = time.monotonic() - t0, (load0 + os.getloadavg()[0]) / 2
        after = cluster.counters()
    if proc.returncode != 0:
        raise RuntimeError(f"{tag}: the job failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-12000:]}")
    measured = json.loads(out.read_text())["rows"]
    moved = {h: [after[h][0] - before[h][0], after[h][1] - before[h][1]] for h in after}
    payload = sum(r["bytes"] for r in measured)  # each contender reduced each size several times
    if min(min(v) for v in moved.values()) < payload:
        raise RuntimeError(f"{tag}: only {moved} bytes crossed the links for {payload} bytes reduced: "
                           "the transport bypassed them (UCX_TLS=tcp missing?)")
    topology = plan.plan_topology(f"{rph}x{hosts}")
    model, _ = plan.model_from_calibration(cal, topology, segment_bytes=1 << 20)
    calibration = json.loads(cal.read_text())
    rows = []
    for nbytes in dict.fromkeys(r["bytes"] for r in measured):
        at = {r["contender"]: r for r in measured if r["bytes"] == nbytes}
        count = nbytes // 4
        algs = [a for a in at if a != "MPI_Allreduce"]
        predicted = {a: plan.price(a, topology, count, 4, model) for a in algs}
        same_minute, _ = plan.model_from_calibration(f"{out}.{nbytes}.cal", topology, segment_bytes=1 << 20)
        predicted_now = {a: plan.price(a, topology, count, 4, same_minute) for a in algs}
        rows.append({"bytes": nbytes, "measured_s": {n: r["time_s"] for n, r in at.items()},
                     "predicted_s": predicted, "predicted_same_minute_s": predicted_now, "auto_picked": at["auto"]["auto_picked"],
                     "link_bound_s": plan.link_bound(topology, nbytes, model) if rate else None,
                     "correct": all(r["correct"] for r in at.values())})
    return {"config": tag, "hosts": hosts, "ranks_per_host": rph, "rate": rate, "queue": args.queue, "rows": rows, "veth_bytes": moved,
            "job_seconds": wall, "load_average": load, "calibration": calibration}


def shaped_bound(rate: str, hosts: int, nbytes: int) -> float:
    """2(H-1)/H x N at the shaped rate itself (not the calibrated one)."""
    from ddl.tools.plan import parse_bandwidth

    return 2 * (hosts - 1) / hosts * nbytes / parse_bandwidth(rate)


def report(results: list[dict[str, Any]]) -> list[str]:
    lines = []
    for res in results:
        cols = list(res["rows"][0]["measured_s"])
        lines.append(f"\n{res['config']}: {res['hosts']} hosts x {res['ranks_per_host']} ranks, tbf queue "
                     f"{res.get('queue', '5ms')}; measured ms (predicted ms) — "
                     f"veth GB moved per host {max(max(v) for v in res['veth_bytes'].values()) / 1e9:.2f}, "
                     f"job {res['job_seconds']:.0f} s, load average {res['load_average']:.1f} on "
                     f"{os.cpu_count()} cores")
        head = f"{'size':>7} " + " ".join(f"{c:>18}" for c in cols) + "  picked    auto/best auto/MPI pred/meas now/meas"
        if res["rate"]:
            head += " bound%"
        lines.append(head)
        for r in res["rows"]:
            m, pr = r["measured_s"], r["predicted_s"]
            cells = [f"{m[c] * 1e3:8.2f} ({pr[c] * 1e3:7.2f})" if c in pr else f"{m[c] * 1e3:8.2f}          "
                     for c in cols]
            best = min(t for a, t in m.items() if a not in ("auto", "MPI_Allreduce"))
            line = (f"{human(r['bytes']):>7} " + " ".join(f"{c:>18}" for c in cells) +
                    f"  {r['auto_picked']:<9} {m['auto'] / best:9.2f} {m['auto'] / m['MPI_Allreduce']:8.2f}"
                    f" {pr['auto'] / m['auto']:9.2f} {r['predicted_same_minute_s']['auto'] / m['auto']:8.2f}")
            if res["rate"]:
                line += f" {shaped_bound(res['rate'], res['hosts'], r['bytes']) / m['auto'] * 100:6.0f}"
            lines.append(line + ("" if r["correct"] else "  WRONG RESULT"))
        cal = res["calibration"]["model"]
        links = ", ".join(f"dim{i} alpha {a * 1e6:.0f} us {1e-9 / b:.2f} GB/s" for i, (a, b) in enumerate(cal["links"]))
        lines.append(f"calibrated at init: {links}; step overhead {cal['step_overhead'] * 1e6:.0f} us")
    lines.append("\nauto/best: auto's time / the best fixed algorithm's; auto/MPI: / MPI_Allreduce's; pred/meas: "
                 "ddl plan's auto prediction (init's calibration file) / auto measured; now/meas: the same from probes run "
                 "just before that size's timings; bound%: 2(H-1)/H x N at the shaped rate / auto's time")
    return lines


def human(n: int) -> str:
    return f"{n >> 20}MiB" if n >= 1 << 20 else f"{n >> 10}KiB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m emulation.bench_hosts", description=__doc__)
    parser.add_argument("--hosts", default="2,3", help="host counts")
    parser.add_argument("--ranks-per-host", type=int, default=2)
    parser.add_argument("--queue", default="100ms", help="tbf latency, each port's queue (5 ms dropped packets "
                        "by the thousand when a host's ranks shared its port)")
    parser.add_argument("--min-bytes", type=int, default=0)
    parser.add_argument("--rates", default="1gbit,none", help="link rates ('none': unshaped)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-bytes", type=int, default=64 << 20)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--out", default="bench-results")
    parser.add_argument("--worker", metavar="JSON", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    from emulation.cluster import unavailable_reason

    reason = unavailable_reason()
    if reason:
        print(f"emulation.bench_hosts: {reason}", file=sys.stderr)
        return 2
    results = []
    with tempfile.TemporaryDirectory(prefix="ddl-bench-hosts-") as tmp:
        for hosts in (int(h) for h in args.hosts.split(",")):
            for rate in args.rates.split(","):
                results.append(run_config(hosts, None if rate == "none" else rate, args, Path(tmp)))
                print("\n".join(report(results[-1:])[:-1]), flush=True)
    lines = report(results)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "hosts.json").write_text(json.dumps(results, indent=1))
    (out / "hosts.txt").write_text("\n".join(lines) + "\n")
    print(lines[-1])
    print(f"wrote {out / 'hosts.json'} and {out / 'hosts.txt'}")
    return 0 if all(r["correct"] for res in results for r in res["rows"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
