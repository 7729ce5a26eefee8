"""The rehearsal's table, JSON and plot (:mod:`ddl_bench.rehearsal` measures)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any


def summary(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per contender: medians of its steps beside ``ddl plan``'s prediction of each."""
    out = {}
    for name, c in record["contenders"].items():
        steps = c["steps"]
        step = statistics.median(s["step"] for s in steps) if steps else float("nan")
        compute = statistics.median(s["compute"] for s in steps) if steps else float("nan")
        pred, burst, pred_burst = c["predicted"], c["burst"], c["predicted_burst"]
        algs = sorted(set(steps[-1]["algorithms"])) if steps else sorted(set(burst["algorithms"]))
        out[name] = {
            "step_s": step, "compute_s": compute, "efficiency": compute / step if steps else float("nan"),
            "plan_step_s": pred["step_s"], "plan_efficiency": record["compute_s"] / pred["step_s"],
            "step_ratio": step / pred["step_s"] if steps else float("nan"),
            "tail_s": step - compute, "plan_tail_s": pred["step_s"] - record["compute_s"],
            "comm_s": burst["step"], "plan_comm_s": pred_burst["step_s"],
            "comm_ratio": burst["step"] / pred_burst["step_s"] if pred_burst["step_s"] > 0 else float("nan"),
            "algorithms": algs, "spread": [s["compute"] / s["step"] for s in steps],
        }
    return out


def table(record: dict[str, Any]) -> list[str]:
    """The printed report: one row per contender, then auto's buckets."""
    rows = summary(record)
    like = record.get("like")
    scale = (f"compute : link time of {like['about'].split(':')[0]}" if like else "compute given")
    mib = record["bytes"] / 2**20
    lines = [
        f"rehearsal: {record['model']} ({record['tensors']} tensors, {mib:.1f} MiB, {len(record['buckets'])} buckets) "
        f"on {record['ranks']} ranks, dims {'x'.join(map(str, record['dims']))} ({record['hosts']} hosts), "
        f"links {record['link'] or 'as they are'}; compute {record['compute_s']:.2f} s a step ({scale}); "
        f"compression {record['compression']}; {record['rounds']} round(s); results "
        f"{'correct' if record['correct'] else 'WRONG'}",
        f"{'contender':>16} {'step s':>8} {'eff %':>6} {'plan s':>8} {'plan %':>6} {'m/p':>5} "
        f"{'tail ms':>8} {'plan':>8} {'comm s':>8} {'plan s':>8} {'m/p':>5} {'bound %':>7}  algorithms",
    ]
    bound = record.get("link_bound_s")
    for name, r in rows.items():
        of_bound = f"{bound / r['comm_s'] * 100:7.0f}" if bound else f"{'':>7}"
        lines.append(
            f"{name:>16} {r['step_s']:8.3f} {r['efficiency'] * 100:6.1f} {r['plan_step_s']:8.3f} "
            f"{r['plan_efficiency'] * 100:6.1f} {r['step_ratio']:5.2f} {r['tail_s'] * 1e3:8.0f} "
            f"{r['plan_tail_s'] * 1e3:8.0f} {r['comm_s']:8.3f} {r['plan_comm_s']:8.3f} {r['comm_ratio']:5.2f} "
            f"{of_bound}  {','.join(r['algorithms'])}")
    if "auto" in record["contenders"]:
        lines += buckets_table(record)
    lines.append("step: slowest rank, median of rounds; eff: compute-only step (the last gradient's landing, "
                 "measured in the same step) / step; plan: ddl plan's step from the cost model auto used; m/p: "
                 "measured / plan; tail: step - compute; comm: the buckets back to back without compute (after "
                 "a warm-up pass); bound %: 2(H-1)/H x the gradient bytes on the wire (halved by fp16/bf16) at the link rate / comm")
    if record.get("calibration"):
        lines.append(f"model: {record['calibration']}")
    return lines


def buckets_table(record: dict[str, Any]) -> list[str]:
    c = record["contenders"]["auto"]
    burst, pred = c["burst"], c["predicted_burst"]["buckets"]
    lines = ["auto, buckets back to back (ms): measured start-end (plan start-end)"]
    for k, nbytes in enumerate(record["buckets"]):
        lines.append(f"  b{k} {nbytes / 2**20:8.2f} MiB {burst['algorithms'][k]:>16} "
                     f"{burst['start'][k] * 1e3:9.1f}-{burst['end'][k] * 1e3:9.1f} "
                     f"({pred[k]['start'] * 1e3:9.1f}-{pred[k]['end'] * 1e3:9.1f} {pred[k]['algorithm']})")
    return lines


def write(record: dict[str, Any], out: Path, stem: str) -> None:
    """``<stem>.json`` (the record and its summary) and ``<stem>.png`` into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    data = {**record, "summary": summary(record)}
    (out / f"{stem}.json").write_text(json.dumps(data, indent=1))
    plotted = plot(record, out / f"{stem}.png")
    print(f"wrote {out / stem}.json" + (f" and {out / stem}.png" if plotted else " (matplotlib missing: no plot)"))


def plot(record: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = summary(record)
    names = list(rows)
    fig, (eff, comm) = plt.subplots(1, 2, figsize=(12, 4.5))
    xs = range(len(names))
    eff.bar([x - 0.2 for x in xs], [rows[n]["efficiency"] * 100 for n in names], 0.4, label="measured")
    eff.bar([x + 0.2 for x in xs], [rows[n]["plan_efficiency"] * 100 for n in names], 0.4, label="ddl plan")
    eff.axhline(95, color="k", linestyle=":", linewidth=1, label="95 % (DDL's claim)")
    low = min([95.0] + [rows[n]["efficiency"] * 100 for n in names if rows[n]["efficiency"] == rows[n]["efficiency"]])
    eff.set_ylim(max(0.0, low - 5), 102)  # room above the bars for the legend
    eff.set_xticks(list(xs), names, rotation=20)
    eff.set_ylabel("scaling efficiency (%)")
    eff.set_title("training step, compute overlapped")
    eff.legend(loc="upper center", ncol=3, fontsize=8)
    comm.bar([x - 0.2 for x in xs], [rows[n]["comm_s"] for n in names], 0.4, label="measured")
    comm.bar([x + 0.2 for x in xs], [rows[n]["plan_comm_s"] for n in names], 0.4, label="ddl plan")
    if record.get("link_bound_s"):
        comm.axhline(record["link_bound_s"], color="k", linestyle=":", linewidth=1, label="link bound")
    comm.set_xticks(list(xs), names, rotation=20)
    comm.set_ylabel("seconds")
    comm.set_title("the step's buckets back to back")
    comm.legend(loc="upper left")
    fig.suptitle(f"rehearsal: {record['model']}, {record['ranks']} ranks on {record['hosts']} hosts "
                 f"({'x'.join(map(str, record['dims']))}), links {record['link'] or 'as they are'}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
