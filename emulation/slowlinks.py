"""``python -m emulation.slowlinks``: time to accuracy over slow links, plain against PowerSGD, local SGD and DiLoCo.

Brings up ``--hosts`` emulated hosts (one rank each) whose ports are shaped to ``--link``
(the rehearsal's 100 ms tbf queue), and trains :mod:`emulation.slowlinks_train`'s MLP
once per mode. For each mode it reports the bytes per step over a host's link (the
ranks' own veth counters, in steady state: after PowerSGD's plain steps, whole periods of
local SGD and DiLoCo; the busiest host's), the training wall time to ``--target``
held-out accuracy, the final accuracy, and ``ddl plan``'s predicted step (priced with the
calibration ``init`` measured on these links, the step's measured compute and the
rates of the hooks' own operations, timed at the model's shapes) beside the measured steady-state step. Writes
``slowlinks.json`` and ``slowlinks.png`` (accuracy against wall time) into ``--out``;
``--report`` redoes the table and plot from the saved runs.

Modes: ``sync``, ``fp16``, ``powersgd:R``, ``localsgd:H[:HOOK][+overlap]``,
``diloco:H[:HOOK][+overlap]`` (HOOK: none, fp16, bf16, powersgd-R).

Example:
    python -m emulation.slowlinks --hosts 4 --link 100mbit --modes sync,powersgd:4,diloco:20:fp16
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def trainer_args(mode: str) -> list[str]:
    """``emulation.slowlinks_train``'s arguments for a mode string."""
    name, _, rest = mode.partition(":")
    if name == "sync":
        return ["--mode", "sync"]
    if name in ("fp16", "bf16"):
        return ["--mode", "sync", "--compression", name]
    if name == "powersgd":
        return ["--mode", "powersgd", "--rank", rest or "4"]
    if name in ("localsgd", "diloco"):
        body, plus, flag = rest.partition("+")
        period, _, hook = body.partition(":")
        out = ["--mode", name, "--period", period or "20", "--pseudo", (hook or "none").replace("-", ":")]
        if plus and flag == "overlap":
            out += ["--overlap", period or "20"]
        return out
    raise SystemExit(f"emulation.slowlinks: unknown mode {mode!r}; see --help")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m emulation.slowlinks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--link", default="100mbit", help="each host's port, both directions (tc tbf rate)")
    p.add_argument("--burst", default="128kb")
    p.add_argument("--queue", default="100ms", help="tbf latency (the rehearsal's)")
    p.add_argument("--modes", default="sync,powersgd:4,diloco:20:fp16")
    p.add_argument("--target", type=float, default=0.95, help="held-out accuracy to reach")
    p.add_argument("--steps", type=int, default=150, help="training steps of every mode")
    p.add_argument("--out", default="bench-results")
    p.add_argument("--timeout", type=float, default=3600, help="per mode, seconds")
    p.add_argument("--report", action="store_true", help="only redo the table and plot from the saved runs")
    return p


def run_modes(args: argparse.Namespace, out: Path, calibration: Path) -> None:
    from emulation.cluster import Cluster, unavailable_reason

    reason = unavailable_reason()
    if reason:
        raise SystemExit(f"emulation.slowlinks: {reason}")
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with Cluster(hosts=args.hosts, ranks_per_host=1, rate=args.link, burst=args.burst, latency=args.queue) as cluster:
        for mode in args.modes.split(","):
            target = out / f"slowlinks-{_stem(mode)}.json"
            argv = [sys.executable, "-m", "ddl.launcher.cli", "-np", str(args.hosts), "-H", cluster.host_list(),
                    "--calibration", str(calibration), sys.executable, "-m", "emulation.slowlinks_train", *trainer_args(mode),
                    "--steps", str(args.steps), "--out", str(target)]
            print(f"== {mode}: {' '.join(trainer_args(mode))}  (load average {os.getloadavg()[0]:.1f})", flush=True)
            before = cluster.counters()
            t0 = time.monotonic()
            proc = subprocess.Popen(cluster.launch_argv(argv), env=cluster.env({**os.environ, **env}), text=True,
                                    cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            assert proc.stdout is not None
            for line in proc.stdout:
                print(line, end="", flush=True)
            code = proc.wait(timeout=args.timeout)
            after = cluster.counters()
            if code != 0:
                raise SystemExit(f"emulation.slowlinks: mode {mode} failed ({code})")
            record = json.loads(target.read_text())
            record["mode"] = mode
            record["job_seconds"] = time.monotonic() - t0
            record["job_veth_bytes"] = {h: [after[h][0] - before[h][0], after[h][1] - before[h][1]] for h in after}
            record["harness"] = {"hosts": args.hosts, "link": args.link, "burst": args.burst, "queue": args.queue}
            target.write_text(json.dumps(record, indent=1))


def _stem(mode: str) -> str:
    return mode.replace(":", "-").replace("+", "-")


def summarise(args: argparse.Namespace, out: Path, calibration: Path) -> dict[str, Any]:
    """The table's rows (with ``ddl plan``'s prediction per mode) from the saved runs."""
    from ddl.tools.plan_hooks import predict_mode

    rows = []
    for mode in args.modes.split(","):
        path = out / f"slowlinks-{_stem(mode)}.json"
        if not path.exists():
            print(f"emulation.slowlinks: no run of {mode} in {out}", file=sys.stderr)
            continue
        r = json.loads(path.read_text())
        steps = len(r["step_times"])
        first, last = r["steady"]
        sent = [p["link_bytes"][0] for p in r["per_rank"]]
        steady_sent = [p["steady_link_bytes"][0] for p in r["per_rank"]]
        reached = next((t for step, t, acc in r["curve"] if acc >= args.target), None)
        compute_ms = max(p["compute_ms"] for p in r["per_rank"])
        # The slowest rank's rates, as its compute: every round of a synchronous step waits for it.
        rate = min(p["flop_rate"] for p in r["per_rank"])
        memory = min(p["memory_rate"] for p in r["per_rank"])
        casts = [p["cast_rate"] for p in r["per_rank"] if p.get("cast_rate")]
        cast = min(casts) if casts else None
        cycles_s = [p["cycle_s"] for p in r["per_rank"] if p.get("cycle_s") is not None]
        cycle = max(cycles_s) if cycles_s else None
        shapes = [tuple(s) for s in r["shapes"]]
        predicted = predict_mode(mode, shapes, topology=f"1x{r['ranks']}", calibration_file=str(calibration),
                                 step_ms=compute_ms, flop_rate=rate, memory_rate=memory, cast_rate=cast,
                                 cycle_s=cycle)
        hooks = [p["hook_ms"] for p in r["per_rank"] if p.get("hook_ms") is not None]
        measured_step = statistics.fmean(r["step_times"][first:last])
        rows.append({
            "mode": mode, "bytes_per_step": max(steady_sent) / (last - first), "bytes_per_step_all": max(sent) / steps,
            "steady_steps": [first, last], "time_to_target_s": reached,
            "final_accuracy": r["final_accuracy"], "train_seconds": r["train_seconds"],
            "measured_step_s": measured_step, "predicted_step_s": predicted["step_s"],
            "predicted_bytes_per_step": predicted["link_bytes"], "compute_ms": compute_ms,
            "compute_after_ms": max((p.get("compute_after_ms") or 0.0) for p in r["per_rank"]) or None,
            "predicted_comm_s": predicted["comm_s"], "predicted_hook_s": predicted["hook_compute_s"],
            "predicted_cycles": predicted.get("cycles"),
            "hook_ms": max(hooks) if hooks else None,
            "cycles_per_step": (r["per_rank"][0]["steady_cycles"] / (last - first)
                                if r["per_rank"][0].get("steady_cycles") is not None else None),
            "flop_rate": rate, "memory_rate": memory, "cast_rate": cast, "cycle_s": cycle, "load_average": r["load_average"], "replica_spread": r["replica_spread"], "curve": r["curve"],
            "compression_stats": r.get("compression_stats"),
        })
    base = next((row for row in rows if row["mode"] == "sync"), None)
    for row in rows:
        if base is not None:
            row["bytes_vs_sync"] = row["bytes_per_step"] / base["bytes_per_step"]
            row["speedup_to_target"] = (base["time_to_target_s"] / row["time_to_target_s"]
                                        if base["time_to_target_s"] and row["time_to_target_s"] else None)
            row["accuracy_vs_sync"] = row["final_accuracy"] - base["final_accuracy"]
        row["plan_error"] = row["predicted_step_s"] / row["measured_step_s"] - 1
    return {"target": args.target, "steps": args.steps, "hosts": args.hosts, "link": args.link, "rows": rows,
            "load_average_now": os.getloadavg()}


def table(summary: dict[str, Any]) -> list[str]:
    lines = [f"time to {summary['target']:.0%} held-out accuracy, {summary['hosts']} emulated hosts x 1 rank at "
             f"{summary['link']}, {summary['steps']} steps each",
             f"{'mode':<24} {'MB/step/host':>12} {'vs sync':>8} {'to target s':>11} {'speedup':>7} {'final acc':>9} "
             f"{'step s':>7} {'plan s':>7} {'plan err':>8} {'load':>5}"]
    for r in summary["rows"]:
        to = f"{r['time_to_target_s']:.1f}" if r["time_to_target_s"] is not None else "not reached"
        speed = f"{r['speedup_to_target']:.1f}x" if r.get("speedup_to_target") else "-"
        lines.append(f"{r['mode']:<24} {r['bytes_per_step'] / 1e6:12.3f} {r.get('bytes_vs_sync', 1):8.4f} {to:>11} "
                     f"{speed:>7} {r['final_accuracy']:9.4f} {r['measured_step_s']:7.3f} {r['predicted_step_s']:7.3f} "
                     f"{r['plan_error']:+8.1%} {r['load_average'][0]:5.1f}")
    lines.append("the plan's parts against measured ones, ms per step (compute: the step without communication, "
                 "timed before and after training; hook: the hooks' own work timed with the link taken out, the "
                 "slowest rank's; rest: the measured step less both)")
    lines.append(f"{'mode':<24} {'compute':>8} {'after':>7} {'hook plan':>9} {'hook meas':>9} {'comm plan':>9} "
                 f"{'rest':>7} {'cycles':>6} {'plan':>5} {'MB plan':>8} {'MB meas':>8} {'GF/s':>5} {'pass GB/s':>9} {'cast GB/s':>9}")
    for r in summary["rows"]:
        hook = r.get("hook_ms")
        after = r.get("compute_after_ms")
        rest = r["measured_step_s"] * 1e3 - (after or r["compute_ms"]) - (hook or 0.0)
        cycles = r.get("cycles_per_step")
        lines.append(f"{r['mode']:<24} {r['compute_ms']:8.1f} {_num(after, 7)} {r.get('predicted_hook_s', 0) * 1e3:9.1f} "
                     f"{_num(hook, 9)} {r.get('predicted_comm_s', 0) * 1e3:9.1f} {rest:7.1f} {_num(cycles, 6)} {_num(r.get('predicted_cycles'), 5)} "
                     f"{r['predicted_bytes_per_step'] / 1e6:8.3f} {r['bytes_per_step'] / 1e6:8.3f} "
                     f"{r['flop_rate'] / 1e9:5.1f} {r['memory_rate'] / 1e9:9.1f} {_num(r.get('cast_rate'), 9, 1e-9)} "
                     f"{_num(r.get('cycle_s'), 8, 1e3)}")
    lines.append(f"load average now {summary['load_average_now'][0]:.1f} {summary['load_average_now'][1]:.1f} "
                 f"{summary['load_average_now'][2]:.1f} on {os.cpu_count()} cores")
    return lines


def _num(value: float | None, width: int, scale: float = 1.0) -> str:
    return f"{value * scale:{width}.1f}" if value is not None else f"{'-':>{width}}"


def plot(summary: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in summary["rows"]:
        ts = [max(t, 0.5) for _, t, _ in r["curve"]]
        ax.plot(ts, [a * 100 for _, _, a in r["curve"]], marker=".", label=r["mode"])
    ax.axhline(summary["target"] * 100, color="k", linestyle=":", linewidth=1, label="target")
    ax.set_xscale("log")
    ax.set_xlabel("training wall time (s, log scale)")
    ax.set_ylabel("held-out accuracy (%)")
    ax.set_ylim(80, 100)
    ax.set_title(f"digits MLP (4.35 M parameters), {summary['hosts']} hosts x 1 rank, links {summary['link']}")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    calibration = out / f"slowlinks-1x{args.hosts}-{args.link}-calibration.json"
    if not args.report:
        run_modes(args, out, calibration)
    summary = summarise(args, out, calibration)
    (out / "slowlinks.json").write_text(json.dumps(summary, indent=1))
    for line in table(summary):
        print(line)
    plotted = plot(summary, out / "slowlinks.png")
    print(f"wrote {out / 'slowlinks.json'}" + (f" and {out / 'slowlinks.png'}" if plotted else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
