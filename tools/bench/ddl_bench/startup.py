"""``ddl bench startup``: a job's start-up with ddl against a bare MPI program, in one run.

Per round, interleaved: a bare job (the interpreter, ``numpy`` and ``mpi4py`` imported,
one barrier) and a ddl job (``import ddl``, ``ddl.init()``, one ``ddl.barrier()``), each
launched by ``ddlrun -np N`` (so both get the same MPI settings, oversubscription
included). Reports the wall time of each launch (median over rounds, and their ratio)
and, inside the processes, the slowest rank's import and init times. Writes JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from ddl.launcher.relaunch import relaunch
from ddl.tools.arg_types import count
from ddl.tools.helptext import plain

# Each rank prints "T <import s> <init or barrier s>"; rank 0 prints the slowest rank's.
_BARE = """
import time; t0 = time.perf_counter()
import numpy
from mpi4py import MPI
t1 = time.perf_counter()
MPI.COMM_WORLD.Barrier()
t2 = time.perf_counter()
worst = MPI.COMM_WORLD.reduce((t1 - t0, t2 - t1), op=MPI.MAX, root=0)
if MPI.COMM_WORLD.Get_rank() == 0: print("T", *worst)
"""
_DDL = """
import time; t0 = time.perf_counter()
import ddl
t1 = time.perf_counter()
ddl.init(); ddl.barrier()
t2 = time.perf_counter()
worst = ddl.allgather_object((t1 - t0, t2 - t1))
if ddl.rank() == 0: print("T", max(w[0] for w in worst), max(w[1] for w in worst))
"""


def launch(ranks: int, code: str) -> tuple[float, float, float]:
    """(wall seconds of the whole launch, slowest import, slowest init/barrier)."""
    t0 = time.perf_counter()
    done = relaunch(ranks, ["-c", code], capture=True, timeout=600)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"ddl bench startup: the {ranks}-rank job failed ({done.returncode}):\n{done.stderr[-2000:]}")
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("T "))
    _, imp, init = line.split()
    return wall, float(imp), float(init)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ddl bench startup", description=plain(__doc__))
    parser.add_argument("-np", dest="np", type=count(), default=2, help="ranks")
    parser.add_argument("--rounds", type=count(), default=5)
    parser.add_argument("--out", default="bench-results", help="folder for the JSON")
    args = parser.parse_args(argv)
    runs: dict[str, list[tuple[float, float, float]]] = {"bare": [], "ddl": []}
    for _ in range(args.rounds):
        runs["bare"].append(launch(args.np, _BARE))
        runs["ddl"].append(launch(args.np, _DDL))
    med = {k: [statistics.median(r[i] for r in v) for i in range(3)] for k, v in runs.items()}
    print(f"start-up, {args.np} ranks, median of {args.rounds} interleaved rounds (seconds)")
    print(f"{'job':>6} {'launch wall':>12} {'slowest import':>15} {'slowest init/barrier':>21}")
    for k, (wall, imp, init) in med.items():
        print(f"{k:>6} {wall:12.2f} {imp:15.3f} {init:21.3f}")
    ratio = med["ddl"][0] / med["bare"][0]
    print(f"ddl job / bare job (launch wall): {ratio:.2f}x "
          f"(per round: {', '.join(f'{d[0] / b[0]:.2f}' for d, b in zip(runs['ddl'], runs['bare'], strict=True))})")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"startup-np{args.np}.json"
    result: dict[str, Any] = {"ranks": args.np, "runs": runs, "median": med, "ratio": ratio}
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
