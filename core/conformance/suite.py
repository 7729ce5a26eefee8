"""``ddl conformance``: train the reference models in every framework at 1, 2, 4 ranks; print the table.

One job per world size (each framework starts once per rank), run one after the other
under ``ddlrun``; then the recorded weights are compared here and the table printed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .hooks import ADAPTERS, RECIPES, available
from .models import MODELS
from .report import Row, build_rows, format_table


def run_suite(out: Path, *, ranks: list[int], frameworks: list[str], models: list[str], optimizers: list[str],
              timeout: float = 600.0, echo: bool = True) -> tuple[list[Row], str]:
    """Run the worker at every world size in ``ranks``; returns the rows and the table text.

    Raises:
        RuntimeError: a job failed (its output's tail is in the message).
    """
    for p in ranks:
        t0 = time.perf_counter()
        # A rank may start a framework a minute later than another on a loaded host: the
        # stall watchdog waits up to 5 minutes rather than its 60 s default. Calibration
        # (the cost model's measurements) changes no result here, only the start-up time.
        cmd = [sys.executable, "-m", "ddl.launcher.cli", "-np", str(p), "--stall-timeout", str(int(min(timeout, 300))),
               "--calibration", "off",
               sys.executable, "-m", "ddl.conformance.run",
               "--out", str(out), "--frameworks", ",".join(frameworks), "--models", ",".join(models),
               "--optimizers", ",".join(optimizers)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"the conformance job at -np {p} failed (exit {proc.returncode}):\n"
                               f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
        if echo:
            for line in proc.stdout.splitlines():
                if line.startswith("conformance:"):
                    print(line, flush=True)
            print(f"conformance: -np {p} done in {time.perf_counter() - t0:.1f} s", flush=True)
    rows, notes = build_rows(out, ranks)
    return rows, format_table(rows, notes)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ddl conformance",
                                 description="Train the reference ONNX models in every installed framework at "
                                             "several world sizes and compare them; prints one table.")
    ap.add_argument("--ranks", default="1,2,4", help="world sizes (must include 1), default 1,2,4")
    ap.add_argument("--frameworks", default=",".join(available()),
                    help=f"default: those installed of {','.join(ADAPTERS)}")
    ap.add_argument("--models", default=",".join(MODELS), help=f"default {','.join(MODELS)}")
    ap.add_argument("--optimizers", default=",".join(RECIPES), help=f"default {','.join(RECIPES)}")
    ap.add_argument("--out", type=Path, help="keep the trained weights and records here (default: a temp dir)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per world size")
    a = ap.parse_args(argv)
    try:
        ranks = sorted({int(x) for x in a.ranks.split(",")})
    except ValueError:
        print(f"ddl conformance: --ranks takes whole numbers, e.g. 1,2,4; got {a.ranks!r}", file=sys.stderr)
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
        print(f"ddl conformance: --ranks must include 1 (the reference) and be positive, got {ranks}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="ddl-conformance-") as tmp:
        out = a.out or Path(tmp)
        try:
            rows, table = run_suite(out, ranks=ranks, frameworks=a.frameworks.split(","), models=a.models.split(","),
                                    optimizers=a.optimizers.split(","), timeout=a.timeout)
        except (RuntimeError, subprocess.TimeoutExpired, FileNotFoundError) as exc:
            print(f"ddl conformance: {exc}", file=sys.stderr)
            return 1
    print(table)
    return 0 if all(r.ok() for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
