"""``ddl bench torch --memory``: optimizer-state bytes and peak RSS per rank, sharded and not.

A model of about 59 M parameters (five linear layers up to 4096 wide, 235 MB of float32)
trains ``--steps`` Adam steps at each world size in ``--ranks``: once with ddl.torch's
``DistributedOptimizer`` and once with ``shard_optimizer_state=True``, each in a job of its
own (a process's peak RSS only grows). Per rank it reports the bytes of the optimizer's
state tensors, the bound ZeRO-1 should meet (the unsharded state / N plus the state of the
largest bucket), and the peak resident set size (``ru_maxrss``). The table compares the
RSS saved with the state saved; it is printed with the load average and written to
``memory.json``.

Example:
    ddl bench torch --memory --ranks 1,2,4 --out bench-results
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ddl.launcher.relaunch import parse_rank_counts, relaunch
from ddl.tools.arg_types import count
from ddl.tools.helptext import plain
from ddl_bench.reports import publish

MODES = ("unsharded", "sharded")


def model_59m() -> nn.Module:
    """58.7 M parameters in tensors of 4.2 M and 16.8 M elements (and their biases)."""
    return nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                         nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 1024))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ddl bench torch --memory", description=plain(__doc__),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", default="1,2,4", help="world sizes, e.g. 1,2,4")
    parser.add_argument("--steps", type=count(), default=3, help="Adam steps per job")
    parser.add_argument("--batch", type=count(), default=8, help="samples per rank and step")
    parser.add_argument("--out", default="bench-results")
    parser.add_argument("--worker", metavar="JSON", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return _worker(args)
    try:
        ranks = parse_rank_counts(args.ranks, "--ranks")
    except ValueError as exc:
        parser.error(str(exc))
    runs = []
    for p in ranks:
        for mode in MODES:
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / "result.json"
                proc = relaunch(p, ["-m", "ddl_bench.torch_memory", "--worker", str(out), "--mode", mode,
                                    "--steps", str(args.steps), "--batch", str(args.batch)])
                if proc.returncode != 0 or not out.exists():
                    print(f"ddl bench torch --memory: the {p}-rank {mode} run failed (exit {proc.returncode})",
                          file=sys.stderr)
                    return 1
                runs.append(json.loads(out.read_text()))
    report = summarize(runs)
    report["load_average"] = list(os.getloadavg())
    publish(report, format_table(report), args.out, "memory.json")
    return 0


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per world size and mode: the largest rank's state and peak RSS, the bound, and the
    RSS saved over the state saved against the unsharded run of the same size."""
    by = {(r["size"], r["mode"]): r for r in runs}
    rows = []
    for (size, mode), r in sorted(by.items(), key=lambda kv: (kv[0][0], MODES.index(kv[0][1]))):
        base = by.get((size, "unsharded"))
        state, rss = max(r["state_bytes"]), max(r["peak_rss_bytes"])
        row = {"ranks": size, "mode": mode, "params": r["params"], "state_bytes_per_rank": state,
               "peak_rss_bytes_per_rank": rss, "state_bytes_by_rank": r["state_bytes"],
               "peak_rss_bytes_by_rank": r["peak_rss_bytes"], "bound_bytes": None, "within_bound": None,
               "state_saved_bytes": None, "rss_saved_bytes": None, "rss_saved_over_state_saved": None}
        if mode == "sharded" and base is not None:
            total = max(base["state_bytes"])  # every unsharded rank holds the whole state
            per_param = total / max(1, r["param_bytes"])
            bound = total / size + per_param * r["largest_bucket_bytes"]
            saved_state = total - state
            saved_rss = max(base["peak_rss_bytes"]) - rss
            row.update(bound_bytes=bound, within_bound=state <= bound, state_saved_bytes=saved_state,
                       rss_saved_bytes=saved_rss,
                       rss_saved_over_state_saved=saved_rss / saved_state if saved_state else None)
        rows.append(row)
    return {"rows": rows, "model": "model_59m", "optimizer": "Adam", "date": time.strftime("%Y-%m-%d"),
            "torch": torch.__version__}


def format_table(report: dict[str, Any]) -> str:
    mib = 1 << 20
    load = report.get("load_average")
    lines = [f"memory per rank (the largest rank), {report['model']} with {report['optimizer']} (torch {report['torch']})"
             + (f"; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}" if load else ""),
             f"{'ranks':>5} {'mode':10} {'state MiB':>10} {'bound MiB':>10} {'peak RSS MiB':>13} "
             f"{'state saved':>12} {'RSS saved':>10} {'RSS/state saved':>16}"]
    for r in report["rows"]:
        def cell(key: str, scale: float = mib, fmt: str = ".1f", row: dict[str, Any] = r) -> str:
            value = row.get(key)
            return "" if value is None else format(value / scale, fmt)

        lines.append(f"{r['ranks']:5d} {r['mode']:10} {cell('state_bytes_per_rank'):>10} {cell('bound_bytes'):>10} "
                     f"{cell('peak_rss_bytes_per_rank'):>13} {cell('state_saved_bytes'):>12} "
                     f"{cell('rss_saved_bytes'):>10} {cell('rss_saved_over_state_saved', 1, '.3f'):>16}")
    lines.append("bound: the unsharded state / N + the state of the largest bucket; RSS/state saved: how much of "
                 "the state no longer held shows in the peak RSS (ZeRO-1's target: >= 0.7)")
    return "\n".join(lines)


def _worker(args: argparse.Namespace) -> int:
    import ddl.torch as dt

    torch.set_num_threads(1)
    dt.init()
    torch.manual_seed(0)
    model = model_59m()
    gen = torch.Generator().manual_seed(dt.rank())
    x = torch.randn(args.batch, 1024, generator=gen)
    y = torch.randn(args.batch, 1024, generator=gen)
    opt = dt.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-4),
                                  named_parameters=model.named_parameters(),
                                  shard_optimizer_state=args.mode == "sharded")
    for _ in range(args.steps):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()  # type: ignore[no-untyped-call]
        opt.step()
    state = sum(t.numel() * t.element_size() for s in opt.optimizer.state.values() for t in s.values()
                if isinstance(t, torch.Tensor))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    buckets = [sum(p.numel() * p.element_size() for p in b.params) for b in opt._reducer.buckets]
    everyone = dt.allgather_object((state, peak))
    if dt.rank() == 0:
        Path(args.worker).write_text(json.dumps({
            "size": dt.size(), "mode": args.mode, "params": sum(p.numel() for p in model.parameters()),
            "param_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
            "largest_bucket_bytes": max(buckets), "state_bytes": [s for s, _ in everyone],
            "peak_rss_bytes": [r for _, r in everyone]}))
    dt.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
