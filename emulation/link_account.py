"""``python -m emulation.link_account``: where an allreduce's time goes on emulated hosts, per phase (root only).

``bench_hosts`` says what share of the shaped link an allreduce reaches; this says why it
is not more. On one :class:`emulation.cluster.Cluster` (``--hosts`` x ``--ranks-per-host``
at ``--rate``) one ``ddlrun -H`` job times, per size and per algorithm, each phase of the
reduction as the executor reports it (the ranks' mean, median over rounds; the call's
total is the slowest rank's), and beside
them the floor of the traffic between hosts: the same bytes each rank sends in the
algorithm's cross-host phases, sent as bare MPI ``Sendrecv`` between the hosts' matching
ranks (every rank of a host at once, as in the reduction, so they share the port).

The table splits the gap between the link bound (2(H-1)/H x N at the shaped rate) and the
measured time into: what TCP and the shaper take of the bare exchange (the payload
ceiling), what the cross-host phases take beyond the bare exchange, and the phases inside
a host, which the link waits for. A second job times the same in-host work on one host
with a core per rank (the emulation runs every host's ranks on the same two cores).
Writes ``link_account.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ALGORITHMS = ("shm", "multiring", "halving_doubling", "mpi")


def worker(args: argparse.Namespace) -> int:
    """One rank of the measuring job (run under ddlrun by :func:`main`)."""
    from mpi4py import MPI

    import ddl
    from ddl.base.ops import ReduceOp
    from ddl.reduction.algorithms import SCHEDULED

    ddl.init()
    ctx = ddl.context()
    topo = ddl.topology()
    comm = MPI.COMM_WORLD.Dup()
    rank, p = comm.Get_rank(), comm.Get_size()
    local, hosts = topo.local_size, p // topo.local_size
    # The matching rank on the other host (2 hosts: a rank's dim-1 ring partner).
    partner = (rank + local) % p
    # One host (the reference run): the same in-host work with a core per rank.
    algorithms = ["shm"] if hosts == 1 else [a for a in ALGORITHMS if a == "mpi" or SCHEDULED[a].unavailable(topo) is None]
    rows: list[dict[str, Any]] = []
    for nbytes in args.sizes:
        x = np.ones(nbytes // 4, np.float32)
        for algorithm in algorithms:
            ctx.allreduce_flat(x.copy(), ReduceOp.SUM, algorithm)  # warm-up (compiles, maps the windows)
        # Bare cross-host traffic: each rank sends, and receives, 2(H-1)/H x N / local bytes.
        per_rank = int(2 * (hosts - 1) / hosts * nbytes / local)
        send, recv = np.ones(per_rank, np.uint8), np.empty(per_rank, np.uint8)
        bare: list[float] = []
        phases: dict[str, dict[str, list[float]]] = {a: {} for a in algorithms}
        totals: dict[str, list[float]] = {a: [] for a in algorithms}
        for _ in range(args.rounds):
            if hosts > 1:
                comm.Barrier()
                t0 = time.perf_counter()
                comm.Sendrecv(send, partner, 7, recv, partner, 7)
                bare.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
            for algorithm in algorithms:
                seen: list[tuple[str, float, float]] = []
                buf = x.copy()
                comm.Barrier()
                t0 = time.perf_counter()
                ctx.allreduce_flat(buf, ReduceOp.SUM, algorithm, on_phase=seen.append)
                totals[algorithm].append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
                spent: dict[str, float] = {}
                for name, a, b in seen:
                    spent[name] = spent.get(name, 0.0) + (b - a)
                # The ranks' mean per phase: the slowest rank of each phase differs, and
                # their maxima would add up to more than the call took.
                names = comm.allgather(sorted(spent))
                for name in sorted(set().union(*names)):
                    phases[algorithm].setdefault(name, []).append(comm.allreduce(spent.get(name, 0.0)) / p)
        for algorithm in algorithms:
            rows.append({"bytes": nbytes, "algorithm": algorithm, "total_s": statistics.median(totals[algorithm]),
                         "phases_s": {n: statistics.median(v) for n, v in phases[algorithm].items()},
                         "bare_exchange_s": statistics.median(bare) if bare else 0.0, "per_rank_bytes": per_rank})
    if rank == 0:
        Path(args.worker).write_text(json.dumps({"ranks": p, "hosts": hosts, "rows": rows}))
    ddl.shutdown()
    return 0


def measure(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    from emulation.cluster import Cluster

    out = tmp / "account.json"
    with Cluster(hosts=args.hosts, ranks_per_host=args.ranks_per_host, rate=args.rate, latency=args.queue) as cluster:
        argv = [sys.executable, "-m", "ddl.launcher.cli", "-np", str(args.hosts * args.ranks_per_host),
                "-H", cluster.host_list(), sys.executable, "-m", "emulation.link_account", "--worker", str(out),
                "--rounds", str(args.rounds), "--sizes", ",".join(str(s) for s in args.sizes)]
        load0 = _load()
        proc = cluster.run(argv, timeout=args.timeout)
        load = (load0 + _load()) / 2
    if proc.returncode != 0:
        raise RuntimeError(f"the job failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    data: dict[str, Any] = json.loads(out.read_text())
    # The same in-host phases on one host, a core per rank: what they cost without the
    # emulation's other host sharing the two cores.
    alone = tmp / "alone.json"
    argv = [sys.executable, "-m", "ddl.launcher.cli", "-np", str(args.ranks_per_host), sys.executable, "-m",
            "emulation.link_account", "--worker", str(alone), "--rounds", str(args.rounds),
            "--sizes", ",".join(str(s) for s in args.sizes)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=args.timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the one-host job failed ({done.returncode}):\n{done.stderr[-3000:]}")
    data.update(rate=args.rate, ranks_per_host=args.ranks_per_host, load_average=load,
                one_host={r["bytes"]: r["total_s"] for r in json.loads(alone.read_text())["rows"]})
    return data


def _load() -> float:
    import os

    return os.getloadavg()[0]


def account(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Each row's time split against the link bound (see the module docstring)."""
    from ddl.tools.plan import parse_bandwidth

    rate, hosts = parse_bandwidth(data["rate"]), data["hosts"]
    out = []
    for row in data["rows"]:
        bound = 2 * (hosts - 1) / hosts * row["bytes"] / rate
        inside = sum(t for n, t in row["phases_s"].items() if _inside(n))
        across = sum(t for n, t in row["phases_s"].items() if not _inside(n))
        out.append({**row, "bound_s": bound, "inside_s": inside, "across_s": across,
                    "share": bound / row["total_s"], "bare_share": bound / row["bare_exchange_s"]})
    return out


def _inside(phase: str) -> bool:
    """Whether a phase stays inside a host (its shared memory, or dim 0's ring: the ranks of a host)."""
    return phase.startswith("shm") or phase.endswith("dim 0")


def report(data: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    lines = [f"{data['hosts']} hosts x {data['ranks_per_host']} ranks at {data['rate']}, load average "
             f"{data['load_average']:.1f} on 2 cores; ms, median of rounds (phases: the ranks' mean; "
             "bare exchange and total: the slowest rank's)",
             "",
             "| size | algorithm | link bound | bare exchange (share) | phases between hosts | phases inside a host "
             "| other | total (share) |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        other = r["total_s"] - r["inside_s"] - r["across_s"]
        lines.append(f"| {r['bytes'] >> 20} MiB | {r['algorithm']} | {r['bound_s'] * 1e3:.1f} | "
                     f"{r['bare_exchange_s'] * 1e3:.1f} ({r['bare_share']:.0%}) | {r['across_s'] * 1e3:.1f} | "
                     f"{r['inside_s'] * 1e3:.1f} | {other * 1e3:.1f} | {r['total_s'] * 1e3:.1f} ({r['share']:.0%}) |")
    lines.append("")
    lines.append("the in-host work alone (one host, a core per rank, shm's reduce-scatter and allgather): " + ", ".join(
        f"{int(n) >> 20} MiB {t * 1e3:.1f} ms" for n, t in data["one_host"].items()))
    lines.append("")
    lines.append("phases, per algorithm and size (ms): " + "; ".join(
        f"{r['algorithm']} {r['bytes'] >> 20} MiB: " + ", ".join(f"{n} {t * 1e3:.1f}" for n, t in r["phases_s"].items())
        for r in rows))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m emulation.link_account", description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--ranks-per-host", type=int, default=2)
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--queue", default="100ms", help="tbf latency (each port's queue)")
    parser.add_argument("--sizes", default=f"{16 << 20},{64 << 20}", help="bytes, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--out", default="build/link_account")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.sizes = [int(s) for s in str(args.sizes).split(",")]
    if args.worker:
        return worker(args)
    if args.hosts != 2:
        parser.error("--hosts: the bare exchange pairs each rank with its partner on the other host; use 2")
    from emulation.cluster import unavailable_reason

    reason = unavailable_reason()
    if reason:
        print(f"link_account: {reason}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        data = measure(args, Path(tmp))
    rows = account(data)
    lines = report(data, rows)
    print("\n".join(lines))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "link_account.json").write_text(json.dumps({**data, "rows": rows}, indent=1))
    (out / "link_account.txt").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'link_account.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
