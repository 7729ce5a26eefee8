"""Compare the recorded runs and print the conformance table."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from .adapter_hooks import ADAPTERS, REFERENCE
from .metrics import max_rel_diff

RTOL_RANKS = 1e-5  # N ranks vs one rank on the global batch
RTOL_ONNX = 1e-5   # onnxruntime vs the framework's own outputs
# Frameworks vs each other at one rank, after 20 steps (measured figures in docs/guides/conformance.md).
# torch/TF: different kernels (oneDNN vs Eigen) sum in different orders, ~1e-7 per op,
# grown by training. Adam divides each gradient by its own running magnitude, so a
# gradient that nearly cancels (the bias of a conv feeding a BatchNorm: a sum over batch
# and pixels) turns those rounding differences into differences of a whole step: the bn
# model with Adam reaches ~2e-4 between TF and the torch-kernel frameworks.
# Caffe runs on torch kernels but updates as Caffe does (v = mu v + lr g; w -= v against
# torch's v = mu v + g; w -= lr v: equal at a constant lr up to one rounding per step;
# Adam's delta added before the bias correction, as Keras does, made moot by eps=1e-12).
RTOL_PAIRS: dict[frozenset[str], float] = {
    frozenset({"torch", "tensorflow"}): 1e-4,
    frozenset({"torch", "caffe"}): 1e-5,
    frozenset({"tensorflow", "caffe"}): 1e-4,
}
# (model, optimizer) pairs where a pair involving TensorFlow gets a wider tolerance, and why above.
RTOL_TF_ADAM_BN = 1e-3
WIDER: dict[tuple[str, str], float] = {("bn", "adam"): RTOL_TF_ADAM_BN}
RTOL_OTHER_PAIR = 1e-4


@dataclasses.dataclass
class Row:
    model: str
    framework: str
    optimizer: str
    ranks: int
    checks: dict[str, tuple[float | str, float | None]]  # name -> (value, tolerance or None)

    def ok(self) -> bool:
        for value, tol in self.checks.values():
            if isinstance(value, str):
                if value not in ("yes", "skip"):
                    return False
            elif tol is not None and not value <= tol:
                return False
        return True


def pair_tolerance(a: str, b: str, model: str, optimizer: str) -> float:
    """The tolerance of framework ``a`` against ``b`` at one rank for this model and optimiser."""
    tol = RTOL_PAIRS.get(frozenset({a, b}), RTOL_OTHER_PAIR)
    if "tensorflow" in (a, b) and (model, optimizer) in WIDER:
        tol = max(tol, WIDER[(model, optimizer)])
    return tol


def _weights(out: Path, p: int, fw: str, m: str, o: str) -> dict[str, np.ndarray] | None:
    f = out / f"np{p}" / f"{fw}-{m}-{o}.npz"
    if not f.exists():
        return None
    with np.load(f) as z:
        return {k: z[k] for k in z.files}


def build_rows(out: Path, ranks: list[int]) -> tuple[list[Row], list[str]]:
    """One row per model x framework x optimiser x ranks; notes for skipped frameworks."""
    recs: list[dict[str, Any]] = []
    for p in ranks:
        f = out / f"np{p}.json"
        if not f.exists():
            raise FileNotFoundError(f"no results for {p} rank(s) at {f}; the run at -np {p} failed (see its output)")
        recs += json.loads(f.read_text())
    notes = sorted({f"{r['framework']}: skipped ({r['skipped']})" for r in recs if "skipped" in r})
    recs = [r for r in recs if "skipped" not in r]
    by_key = {(r["framework"], r["model"], r["optimizer"], r["ranks"]): r for r in recs}
    order = [fw for fw in ADAPTERS if any(r["framework"] == fw for r in recs)]
    rows: list[Row] = []
    for (fw, m, o, p), r in sorted(by_key.items(), key=lambda kv: (kv[0][1], order.index(kv[0][0]), kv[0][2], kv[0][3])):
        checks: dict[str, tuple[float | str, float | None]] = {}
        w = _weights(out, p, fw, m, o)
        one = _weights(out, 1, fw, m, o) if 1 in ranks else None
        if p > 1 and w is not None and one is not None:
            checks["vs 1 rank"] = (max_rel_diff(w, one), RTOL_RANKS)
        checks["identical"] = ("yes" if r["identical"] else "NO", None)
        if p == 1:
            if "onnx_weights" in r:
                checks["ort(weights)"] = (r["onnx_weights"], RTOL_ONNX)
            checks["ort(export)"] = (r["onnx_export"], RTOL_ONNX) if "onnx_export" in r else \
                (f"FAILED: {r.get('onnx_export_error', '?')}", None)
            if fw != REFERENCE and w is not None:
                ref = _weights(out, 1, REFERENCE, m, o)
                if ref is not None:
                    checks[f"vs {REFERENCE}"] = (max_rel_diff(w, ref), pair_tolerance(fw, REFERENCE, m, o))
                for other in order:
                    if other not in (fw, REFERENCE) and order.index(other) < order.index(fw):
                        ow = _weights(out, 1, other, m, o)
                        if ow is not None:
                            checks[f"vs {other}"] = (max_rel_diff(w, ow), pair_tolerance(fw, other, m, o))
        rows.append(Row(m, fw, o, p, checks))
    return rows, notes


def format_table(rows: list[Row], notes: list[str]) -> str:
    """The table as Markdown: one row per model x framework x optimiser x ranks."""
    cols: list[str] = []
    for row in rows:
        cols += [c for c in row.checks if c not in cols]
    head = ["model", "framework", "optimizer", "ranks", *cols, "result"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row.model, row.framework, row.optimizer, str(row.ranks)]
        for c in cols:
            v = row.checks.get(c)
            cells.append("" if v is None else (v[0] if isinstance(v[0], str) else f"{v[0]:.1e}"))
        cells.append("pass" if row.ok() else "FAIL")
        lines.append("| " + " | ".join(cells) + " |")
    n_fail = sum(not r.ok() for r in rows)
    lines.append("")
    lines.append(f"max relative difference = max|a-b| / max|b| per weight tensor (outputs for ort), worst tensor; "
                 f"tolerances: N ranks vs 1 rank {RTOL_RANKS:g}, onnxruntime {RTOL_ONNX:g}, "
                 + ", ".join(f"{'/'.join(sorted(k))} {v:g}" for k, v in RTOL_PAIRS.items())
                 + f" (pairs with tensorflow on bn+adam {RTOL_TF_ADAM_BN:g})"
                 + f"; identical = sha256 of every rank's weights equal. {len(rows) - n_fail}/{len(rows)} rows pass.")
    lines += notes
    return "\n".join(lines)
