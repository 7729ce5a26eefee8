"""``ddl conformance``: train the reference models in every framework at 1, 2, 4 ranks; print the table.

One job per world size (each framework starts once per rank), run one after the other
under ``ddlrun``; then the recorded weights are compared here and the table printed.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ddl.launcher.relaunch import parse_rank_counts, relaunch_argv
from ddl.tools.arg_types import amount

from .adapter_hooks import ADAPTERS, RECIPES, available
from .models import MODELS
from .report import Row, build_rows, format_table


def _command(out: Path, p: int, frameworks: list[str], models: list[str], optimizers: list[str],
             timeout: float) -> list[str]:
    # A rank may start a framework a minute later than another on a loaded host: the
    # stall watchdog waits up to 5 minutes rather than its 60 s default. Calibration
    # (the cost model's measurements) changes no result here, only the start-up time.
    return relaunch_argv(p, ["-m", "ddl.tools.conformance.run", "--out", str(out), "--frameworks", ",".join(frameworks),
                             "--models", ",".join(models), "--optimizers", ",".join(optimizers)],
                         settings={"stall_timeout": int(min(timeout, 300)), "calibration": "off"})


def _wait(proc: subprocess.Popen[str], seconds: float) -> int | None:
    """The job's exit status, or None after stopping it when it ran past ``seconds``."""
    try:
        return proc.wait(timeout=max(1.0, seconds))
    except subprocess.TimeoutExpired:
        proc.terminate()  # ddlrun passes it on to mpiexec and its ranks
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return None


def run_suite(out: Path, *, ranks: list[int], frameworks: list[str], models: list[str], optimizers: list[str],
              timeout: float = 600.0, concurrent: bool = False, echo: bool = True) -> tuple[list[Row], str]:
    """Run the worker at every world size in ``ranks``; returns the rows and the table text.

    Args:
        concurrent: start the jobs of all world sizes at once (on a host shared with
            other work they then get a larger share of it) instead of one after another.

    Raises:
        RuntimeError: a job failed or ran past ``timeout`` (its output's tail is in the message).
    """
    t0 = time.perf_counter()
    groups = [ranks] if concurrent else [[p] for p in ranks]
    for group in groups:
        with contextlib.ExitStack() as files:
            logs = {p: files.enter_context(tempfile.TemporaryFile("w+")) for p in group}
            procs = {p: subprocess.Popen(_command(out, p, frameworks, models, optimizers, timeout), stdout=logs[p],
                                         stderr=subprocess.STDOUT, text=True) for p in group}
            failed: list[str] = []
            for p, proc in procs.items():
                code = _wait(proc, timeout - (time.perf_counter() - t0))
                logs[p].seek(0)
                text = logs[p].read()
                if code != 0:
                    why = "ran past the timeout" if code is None else f"failed (exit {code})"
                    failed.append(f"the conformance job at -np {p} {why}:\n{text[-6000:]}")
                elif echo:
                    for line in text.splitlines():
                        if line.startswith("conformance:"):
                            print(line, flush=True)
                    print(f"conformance: -np {p} done at {time.perf_counter() - t0:.1f} s", flush=True)
        if failed:
            raise RuntimeError("\n".join(failed))
    rows, notes = build_rows(out, ranks)
    return rows, format_table(rows, notes)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ddl conformance",
                                 description="Train the reference ONNX models in every installed framework at "
                                             "several world sizes and compare them; prints one table.")
    ap.add_argument("-np", "--ranks", dest="np", default="1,2,4", help="world sizes (must include 1), default 1,2,4")
    ap.add_argument("--frameworks", default=",".join(available()),
                    help=f"default: those installed of {','.join(ADAPTERS)}")
    ap.add_argument("--models", default=",".join(MODELS), help=f"default {','.join(MODELS)}")
    ap.add_argument("--optimizers", default=",".join(RECIPES), help=f"default {','.join(RECIPES)}")
    ap.add_argument("--out", type=Path, help="keep the trained weights and records here (default: a temp dir)")
    ap.add_argument("--timeout", type=amount, default=900.0, help="seconds for all jobs together")
    ap.add_argument("--one-at-a-time", action="store_true",
                    help="run the world sizes one after another (default: all at once)")
    a = ap.parse_args(argv)
    try:
        ranks = sorted(set(parse_rank_counts(a.np)))
    except ValueError as exc:
        print(f"ddl conformance: {exc}", file=sys.stderr)
        return 2
    lists: dict[str, tuple[str, list[str]]] = {"frameworks": (a.frameworks, list(ADAPTERS)),
                                               "models": (a.models, list(MODELS)),
                                               "optimizers": (a.optimizers, list(RECIPES))}
    for what, (given, known) in lists.items():
        bad = [x for x in given.split(",") if x not in known]
        if bad:
            print(f"ddl conformance: unknown {what} {bad}; choose from {sorted(known)}", file=sys.stderr)
            return 2
    if 1 not in ranks or any(r < 1 for r in ranks):
        print(f"ddl conformance: -np must include 1 (the reference), got {ranks}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="ddl-conformance-") as tmp:
        out = a.out or Path(tmp)
        try:
            rows, table = run_suite(out, ranks=ranks, frameworks=a.frameworks.split(","), models=a.models.split(","),
                                    optimizers=a.optimizers.split(","), timeout=a.timeout,
                                    concurrent=not a.one_at_a_time)
        except (RuntimeError, subprocess.TimeoutExpired, FileNotFoundError) as exc:
            print(f"ddl conformance: {exc}", file=sys.stderr)
            return 1
    print(table)
    return 0 if all(r.ok() for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
