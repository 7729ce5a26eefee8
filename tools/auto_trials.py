"""auto with and without its trials, on one saved cost model: what re-checking buys.

    python -m tools.auto_trials [-np 2] [--sizes 65536,1048576,4194304] [--calls 300] [--model FILE]

Both jobs read the same calibration file (``DDL_CALIBRATION=FILE``: the first job
measures and writes it when missing, so whatever state the machine was in then is frozen
into both), and run ``--calls`` in-place float32 allreduces per size with ``auto``. The
table gives, per size: init's pick (the model's), the algorithm the trials settled on,
and the median time per call over the last third of the calls in each job (the trials
run in the first few), slowest rank's. Writes ``auto-trials.json`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def worker(sizes: list[int], calls: int, out: Path) -> None:
    import numpy as np
    from mpi4py import MPI

    import ddl
    from ddl.reduction import cost
    from ddl.runtime import lifecycle

    ddl.init()
    comm = MPI.COMM_WORLD
    ctx = lifecycle.engine().ctx
    rows = []
    for nbytes in sizes:
        x = np.zeros(nbytes // 4, np.float32)
        times = []
        for _ in range(calls):
            comm.Barrier()
            t0 = time.perf_counter()
            ddl.allreduce_(x, op=ddl.Sum, name=f"t{nbytes}")
            times.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
        key = (cost.size_class(nbytes), 4)
        init_pick = cost.choose(ctx.topology, x.size, 4, ctx.model)
        settled = ctx.trials.overridden.get(key, init_pick) if ctx.trials is not None else init_pick
        rows.append({"bytes": nbytes, "init_pick": init_pick, "used": settled,
                     "median_s": statistics.median(times[-max(1, calls // 3):]),
                     "trials": ctx.trials.describe() if ctx.trials is not None else ""})
    if comm.rank == 0:
        out.write_text(json.dumps(rows))
    ddl.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.auto_trials", description=__doc__.split("\n\n")[0])
    parser.add_argument("-np", type=int, default=2)
    parser.add_argument("--sizes", default="65536,1048576,4194304")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--model", type=Path, help="calibration file both jobs use (default: a fresh one)")
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.worker:
        worker(sizes, args.calls, Path(args.worker[1]))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="ddl-auto-trials-"))
    model = args.model or tmp / "model.json"
    ddlrun = str(Path(sys.executable).with_name("ddlrun"))
    results = {}
    for mode in ("off", "on"):
        env = dict(os.environ, DDL_CALIBRATION=str(model), DDL_AUTO_TRIALS=mode)
        got = tmp / f"{mode}.json"
        cmd = [ddlrun, "-np", str(args.np), sys.executable, "-m", "tools.auto_trials", "--sizes", args.sizes,
               "--calls", str(args.calls), "--worker", mode, str(got)]
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
        results[mode] = json.loads(got.read_text())
    print(f"auto with and without trials, {args.np} ranks, one saved model ({model}); load "
          f"{os.getloadavg()[0]:.1f}")
    print("| bytes | init's pick | trials settled on | us/call off | us/call on | on/off |")
    print("| ---: | --- | --- | ---: | ---: | ---: |")
    for off, on in zip(results["off"], results["on"], strict=True):
        print(f"| {off['bytes']} | {off['init_pick']} | {on['used']} | {off['median_s'] * 1e6:.0f} | "
              f"{on['median_s'] * 1e6:.0f} | {on['median_s'] / off['median_s']:.2f} |")
    (args.out / "auto-trials.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
