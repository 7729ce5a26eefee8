"""The fail-fast table: how each way a rank fails ends a 2-rank job, under ddlrun and a plain mpiexec.

    python -m tools.fail_fast [--cases exit-3,sigkill] [--aborts 20] [--out DIR]

For each case (tests/tier2/workers/worker_failfast.py, its torch steps by default: rank 1 fails at step 3) and launcher
(``ddlrun -np 2``, the pip MPICH's ``mpiexec -n 2``) it prints the seconds the job took
in all and from the failure (the worker's ``T0`` mark) to its end, the exit status, the
first error line, and the files left in ``/dev/shm`` and the temp dir. As root the whole
run gets a ``/dev/shm`` of its own (a mount namespace: other jobs on the machine neither
count nor are touched), and every job a temp dir of its own. ``--aborts N`` then runs N
jobs that end abnormally (killed rank, MPI_Abort, stall abort, ddlrun stopped by
``timeout`` with SIGTERM and with SIGKILL), and counts what is left after all of them.
Writes ``fail_fast.json`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: The tier-2 tests' fail-fast worker: one table of cases; ``numpy`` or ``torch`` steps (``--worker``).
WORKER = Path(__file__).parents[1] / "tests" / "tier2" / "workers" / "worker_failfast.py"
WORKERS = ("numpy", "torch")
FRAMEWORK = "torch"
CASES = ["before-init", "exit-3", "import-error", "sigkill", "skip-step", "stall"]
#: Settings per case: the stall case with a short stall timeout, so it ends at it.
CASE_ENV = {"stall": {"DDL_STALL_TIMEOUT": "4"}}
ABORTS = ["sigkill", "mpi-abort", "stall", "timeout-TERM", "timeout-KILL"]
#: What a job that ends normally leaves in the temp dir on purpose (torch's compile cache,
#: ``torchinductor_<user>``, reused by the next run): found by a clean run first, not counted.
NORMAL: set[str] = set()
_INSIDE = "DDL_FAIL_FAST_PRIVATE_SHM"


def launchers() -> dict[str, list[str]]:
    python = sys.executable
    return {"ddlrun -np 2": [python, "-m", "ddl.launcher.cli", "-np", "2", python],
            "ddlrun -H localhost:2": [python, "-m", "ddl.launcher.cli", "-np", "2", "-H", "localhost:2", python],
            "mpiexec -n 2": [str(Path(python).parent / "mpiexec"), "-n", "2", python]}


#: --launchers names: the first word, or "ddlrun-H" for ddlrun with a host list.
def launcher_id(launcher: str) -> str:
    return "ddlrun-H" if " -H " in launcher else launcher.split()[0]


def first_error(launcher: str, stderr: str, stdout: str = "") -> str:
    """The line a user reads first: ddlrun's report, or ddl's or Python's or hydra's own
    (hydra writes its BAD TERMINATION banner on stdout)."""
    lines = [x.strip() for x in stderr.splitlines() + stdout.splitlines() if x.strip()]
    if launcher.startswith("ddlrun"):
        found = next((x for x in lines if x.startswith("ddlrun: ")), "")
        if found:
            return found
    pattern = re.compile(r"^(\[\d+\]<stderr>:)?(ddl: .*|[\w.]*(Error|Exception|Interrupt): .*|.*BAD TERMINATION.*|"
                         r".*application called MPI_Abort.*)")
    return next((x for x in lines if pattern.match(x)), lines[0] if lines else "")


def shm_files() -> list[str]:
    return sorted(os.listdir("/dev/shm"))


def worker(case: str) -> list[str]:
    """The worker's argv for ``case``, with the steps ``--worker`` chose."""
    return [str(WORKER), case, FRAMEWORK]


def run_case(launcher: str, argv: list[str], case: str, scratch: Path) -> dict[str, object]:
    tmpdir = Path(tempfile.mkdtemp(prefix=f"{case}-", dir=scratch))
    env = {**os.environ, "TMPDIR": str(tmpdir), "MPIR_CVAR_ENABLE_HEAVY_YIELD": "1", **CASE_ENV.get(case, {})}
    before = set(shm_files())
    load = os.getloadavg()[0]
    start = time.monotonic()
    try:
        done = subprocess.run([*argv, *worker(case)], capture_output=True, text=True, timeout=600, env=env)
        code, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        code, out, err = 124, str(exc.stdout or ""), str(exc.stderr or "")
    ended = time.time()
    took = time.monotonic() - start
    deadline = time.monotonic() + 5  # a plain mpiexec's ranks are cleaned up after by watchers that outlive them
    while set(shm_files()) - before and time.monotonic() < deadline:
        time.sleep(0.1)
    marks = [float(t) for t in re.findall(r"T0 (\d+\.\d{3})", out)]
    left = [f"shm:{n}" for n in sorted(set(shm_files()) - before)] + \
        [f"tmp:{p.name}" for p in tmpdir.iterdir() if p.name not in NORMAL]
    shutil.rmtree(tmpdir, ignore_errors=True)
    done = [float(t) for t in re.findall(r"DONE rank \d+ (\d+\.\d{3})", out)]
    return {"launcher": launcher, "case": case, "seconds": round(took, 2),
            "ending": round(ended - max(done), 2) if done else None,
            "from_failure": round(ended - min(marks), 2) if marks else None, "status": code if code >= 0 else 128 - code,
            "first_error": first_error(launcher, err, out), "left": left, "load": round(load, 1)}


def run_abort(kind: str, scratch: Path) -> list[str]:
    """One abnormally ended ddlrun job; the files it left."""
    ddlrun = launchers()["ddlrun -np 2"]
    tmpdir = Path(tempfile.mkdtemp(prefix=f"abort-{kind}-", dir=scratch))
    env = {**os.environ, "TMPDIR": str(tmpdir), "STALL_SECONDS": "600", "DDL_STALL_TIMEOUT": "3"}
    before = set(shm_files())
    if kind.startswith("timeout-"):
        argv = ["timeout", "-s", kind.split("-")[1], "8", *ddlrun, *worker("stall")]
    else:
        argv = [*ddlrun, *worker(kind)]
    subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
    deadline = time.monotonic() + 10
    while set(shm_files()) - before and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [f"shm:{n}" for n in sorted(set(shm_files()) - before)] + \
        [f"tmp:{p.name}" for p in tmpdir.iterdir() if p.name not in NORMAL]
    shutil.rmtree(tmpdir, ignore_errors=True)
    return left


def table(rows: list[dict[str, object]]) -> str:
    out = ["| case | launcher | seconds (all) | seconds from the failure | exit status | first error line | left behind "
           "| load |",
           "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: |"]
    for r in rows:
        line = str(r["first_error"]).replace("|", "\\|")
        if len(line) > 150:
            line = line[:147] + "..."
        out.append(f"| {r['case']} | {r['launcher']} | {r['seconds']} | {r['from_failure']} | {r['status']} | "
                   f"`{line}` | {len(r['left'])} | {r.get('load', '')} |")  # type: ignore[arg-type]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.fail_fast", description=__doc__.splitlines()[0])
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--launchers", default="ddlrun,mpiexec",
                   help="of ddlrun (-np 2), ddlrun-H (-np 2 -H localhost:2), mpiexec (-n 2)")
    p.add_argument("--aborts", type=int, default=0, help="then run this many abnormally ended ddlrun jobs")
    p.add_argument("--worker", choices=WORKERS, default="torch",
                   help="torch: a DistributedOptimizer on every rank (the default); numpy: ddl.allreduce alone, "
                        "whose processes start and end in a fraction of torch's time")
    p.add_argument("--out", default=".")
    args = p.parse_args(argv)
    global FRAMEWORK
    FRAMEWORK = args.worker
    if os.geteuid() == 0 and not os.environ.get(_INSIDE) and shutil.which("unshare"):
        # A /dev/shm of our own: count only what these jobs leave, touch nothing of anyone else's.
        inner = ("mount -t tmpfs -o size=1g ddl-fail-fast /dev/shm && exec \"$@\"")
        return subprocess.call(["unshare", "-m", "sh", "-c", inner, "sh", sys.executable, "-m", "tools.fail_fast",
                                *(argv if argv is not None else sys.argv[1:])], env={**os.environ, _INSIDE: "1"})
    scratch = Path(tempfile.mkdtemp(prefix="ddl-fail-fast-"))
    clean = run_case("ddlrun -np 2", launchers()["ddlrun -np 2"], "none", scratch)
    NORMAL.update(name.split(":", 1)[1] for name in clean["left"] if str(name).startswith("tmp:"))  # type: ignore[attr-defined]
    print(f"a clean job: {clean['seconds']} s, status {clean['status']}; {clean['ending']} s from its ranks' last "
          f"line to its end (the processes' own ending: the program's teardown and MPI_Finalize); it leaves in the "
          f"temp dir, on purpose: {sorted(NORMAL) or 'nothing'} (not counted below)", flush=True)
    wanted = [w.strip() for w in args.launchers.split(",")]
    rows = []
    load = os.getloadavg()[0]
    for case in [c.strip() for c in args.cases.split(",") if c.strip()]:
        for launcher, cmd in launchers().items():
            if launcher_id(launcher) in wanted:
                rows.append(run_case(launcher, cmd, case, scratch))
                print(f"{case:>14} {launcher:>21}: {rows[-1]['seconds']:>6} s, status {rows[-1]['status']} "
                      f"(load {rows[-1]['load']})", flush=True)
    print(f"\nload average {load:.1f} -> {os.getloadavg()[0]:.1f}, {time.strftime('%Y-%m-%d %H:%M')}\n")
    print(table(rows))
    record: dict[str, object] = {"rows": rows, "load": os.getloadavg()[0], "date": time.strftime("%Y-%m-%d %H:%M"),
                                 "clean_job": clean, "normal_temp_files": sorted(NORMAL)}
    if args.aborts:
        left: list[str] = []
        for i in range(args.aborts):
            kind = ABORTS[i % len(ABORTS)]
            got = run_abort(kind, scratch)
            left += got
            print(f"abort {i + 1:>2}/{args.aborts} ({kind}): {len(got)} file(s) left "
                  f"(load {os.getloadavg()[0]:.1f})", flush=True)
        print(f"\nafter {args.aborts} aborted jobs: {len(left)} file(s) left in /dev/shm and the temp dirs {left}")
        record["aborts"] = {"jobs": args.aborts, "left": left}
    shutil.rmtree(scratch, ignore_errors=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "fail_fast.json").write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
