"""Elastic training while the host discovery script misbehaves: each case one job on this host, and its table.

    python -m emulation.discovery_cases                  # 6 s, 30 s, hanging, failing, garbage
    python -m emulation.discovery_cases --cases hanging --discovery-timeout 10

Each job runs :mod:`emulation.chaos_train` under ``ddlrun --elastic`` on ``localhost:2``
(no root needed) with a discovery script that answers at once, then misbehaves as the case
says for one run (``slow 6``: sleeps 6 s; ``hang``: never ends; ``fail``: exits 1;
``garbage``: prints lines that are not ``host:slots`` before its list), then answers at
once again; the job is told to finish once that run is over. Before ddl 0.1's issue 39 a
6-s discovery held the supervisor's loop, the agents fenced themselves after 5 s without a
ping, and the job failed. Each row says: the exit status, the job's seconds, its steps,
how many worlds (1: the discovery never disturbed the training), whether every rank's
weights are identical and equal to the one-process replay, and ddlrun's line about it.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from emulation.chaos_train import replay

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "emulation" / "chaos_train.py"
#: Case name -> the discovery script's mode for its one misbehaving run.
CASES = {"6 s": "slow 6", "30 s": "slow 30", "hanging": "hang", "failing": "fail", "garbage": "garbage"}
_STEP = re.compile(r"STEP (\d+) world (\d+) size (\d+)")
_FINAL = re.compile(r"FINAL rank (\d+) size (\d+) step (\d+) digest ([0-9a-f]{16})")
_LOGGED = re.compile(r"ddlrun: elastic \[\s*[\d.]+ s\] (host discovery[^\n]*)")

SCRIPT = """#!/bin/sh
# the next mode from the queue file (one a line; none left: answer at once)
queue={queue}
mode=$(head -n 1 "$queue" 2>/dev/null); [ -n "$mode" ] && sed -i 1d "$queue"
case "$mode" in
  slow*) sleep "${{mode#slow }}" ;;
  hang) touch {folder}/hung; exec sleep 100000 ;;
  fail) echo "the discovery API answered 503" >&2; touch {folder}/answered; exit 1 ;;
  garbage) echo "<html><body>503 Service Unavailable</body></html>"; echo "localhost:two" ;;
esac
touch {folder}/answered
echo localhost:2
"""


@dataclasses.dataclass
class CaseResult:
    case: str
    rc: int
    seconds: float
    steps: int
    worlds: int
    identical: bool
    replay_diff: float | None
    lines: list[str]
    tracebacks: int
    output: str

    @property
    def ok(self) -> bool:
        return (self.rc == 0 and self.worlds == 1 and self.identical and self.tracebacks == 0
                and self.replay_diff is not None and self.replay_diff <= 1e-6)


def run_case(case: str, modes: list[str], *, discovery_timeout: float | None = None, step_seconds: float = 0.05,
             timeout: float = 300.0) -> CaseResult:
    """One job whose discovery runs ``modes`` one after another (after a first run that answers), then answers."""
    with tempfile.TemporaryDirectory(prefix="ddl-discovery-case-") as tmp:
        folder = Path(tmp)
        queue = folder / "queue"
        queue.write_text("".join(f"{m}\n" for m in ["ok", *modes]))
        script = folder / "discover.sh"
        script.write_text(SCRIPT.format(queue=queue, folder=folder))
        script.chmod(0o755)
        out = folder / "weights.npz"
        argv = [sys.executable, "-m", "ddl.launcher.cli", "--elastic", "--min-np", "1", "--max-np", "2",
                "--host-discovery-script", str(script), "--calibration", "off",
                *(["--discovery-timeout", f"{discovery_timeout:g}"] if discovery_timeout is not None else []),
                sys.executable, str(TRAIN), "--control", str(folder), "--out", str(out),
                "--step-seconds", str(step_seconds)]
        start = time.monotonic()
        job = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "MPIR_CVAR_ENABLE_HEAVY_YIELD": "1"})
        try:
            # Finish once every queued run is over (the queue empty, and the run after it answered).
            deadline = start + timeout
            while time.monotonic() < deadline and job.poll() is None:
                if not queue.read_text().strip():
                    (folder / "answered").unlink(missing_ok=True)
                    while not (folder / "answered").exists() and time.monotonic() < deadline and job.poll() is None:
                        time.sleep(0.2)
                    time.sleep(1.0)
                    (folder / "finish").write_text("")
                    break
                time.sleep(0.2)
            output, _ = job.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            job.kill()
            output, _ = job.communicate()
        seconds = time.monotonic() - start
        saved = dict(np.load(out)) if out.exists() else None
    worlds = {int(m[2]) for m in _STEP.finditer(output)}
    finals = {int(m[1]): (int(m[3]), m[4]) for m in _FINAL.finditer(output)}
    steps = max((s for s, _ in finals.values()), default=0)
    diff = None
    if saved is not None and len(saved["sizes"]) == steps:
        diff = float(np.max(np.abs(replay([int(n) for n in saved["sizes"]], 0) - saved["weights"])))
    return CaseResult(case=case, rc=job.returncode, seconds=seconds, steps=steps, worlds=len(worlds),
                      identical=len(finals) == 2 and len({d for _, d in finals.values()}) == 1, replay_diff=diff,
                      lines=_LOGGED.findall(output), tracebacks=output.count("Traceback"), output=output)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of: {', '.join(CASES)}")
    parser.add_argument("--discovery-timeout", type=float, default=None, help="ddlrun's (default: its own, 60 s)")
    args = parser.parse_args(argv)
    results = []
    for case in [c.strip() for c in args.cases.split(",") if c.strip()]:
        if case not in CASES:
            parser.error(f"unknown case {case!r}; known: {', '.join(CASES)}")
        result = run_case(case, [CASES[case]], discovery_timeout=args.discovery_timeout)
        results.append(result)
        print(f"{case}: rc {result.rc}, {result.seconds:.1f} s" + ("" if result.ok else "\n" + result.output[-3000:]),
              flush=True)
    print(f"\nload average (1 min) {os.getloadavg()[0]:.1f}\n")
    print("| discovery | rc | job | steps | worlds | weights identical, = replay | tracebacks | ddlrun says |")
    print("| --- | ---: | ---: | ---: | ---: | --- | ---: | --- |")
    for r in results:
        said = " / ".join(dict.fromkeys(r.lines)) or "-"
        print(f"| {r.case} | {r.rc} | {r.seconds:.1f} s | {r.steps} | {r.worlds} | "
              f"{'yes' if r.identical else 'NO'}, {'-' if r.replay_diff is None else f'{r.replay_diff:.2g}'} | "
              f"{r.tracebacks} | {said} |")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
