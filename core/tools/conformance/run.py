"""The conformance worker: every rank trains every model x framework x optimiser once and records it.

Run under ``ddlrun -np N python -m ddl.tools.conformance.run --out DIR``; rank 0 writes
``DIR/np{N}.json`` and the trained weights ``DIR/np{N}/<framework>-<model>-<opt>.npz``.
At one rank it also runs the ONNX checks (weights written back, the framework's exporter)
in onnxruntime.
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

import ddl
from ddl.onnx import ModelSpec, read_model, write_weights

from .adapter_hooks import ADAPTERS, RECIPES, AdapterHooks, load, weights_digest
from .data import digits_batches, shard, test_inputs
from .metrics import rel_diff
from .models import MODELS


def _ort(model: Any, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    data = model.SerializeToString() if not isinstance(model, (str, Path)) else str(model)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
    return np.asarray(sess.run(None, {sess.get_inputs()[0].name: x})[0])


def _onnx_checks(hooks: AdapterHooks, proto: Any, spec: ModelSpec, w: dict[str, np.ndarray],
                 tmp: Path) -> dict[str, Any]:
    x = test_inputs().reshape(-1, *spec.input_shape)
    native = hooks.predict(spec, w, x)
    out: dict[str, Any] = {"onnx_weights": rel_diff(_ort(write_weights(proto, w), x), native)}
    path = tmp / f"{hooks.NAME}-{spec.name}.onnx"
    try:
        hooks.export_onnx(spec, w, path)
        out["onnx_export"] = rel_diff(_ort(path, x), native)
    except Exception as exc:  # the exporter's failure is a row in the table, not a crash
        out["onnx_export_error"] = f"{type(exc).__name__}: {exc}"[:300]
    return out


def run(out: Path, frameworks: list[str], models: list[str], optimizers: list[str]) -> None:
    ddl.init()
    r, p = ddl.rank(), ddl.size()
    wdir = out / f"np{p}"
    if r == 0:
        wdir.mkdir(parents=True, exist_ok=True)
    records: list[dict[str, Any]] = []
    for fw in frameworks:
        t0 = time.perf_counter()
        try:
            hooks = load(fw)
        except ImportError as exc:  # the framework is not installed: a row saying so
            records.append({"framework": fw, "skipped": f"{type(exc).__name__}: {exc}"[:200], "ranks": p})
            continue
        hooks.init()
        for m in models:
            proto = MODELS[m]()
            spec = read_model(proto)
            for o in optimizers:
                if o not in hooks.OPTIMIZERS:
                    continue
                recipe = RECIPES[o]
                shards = [(x.reshape(-1, *spec.input_shape), y)
                          for x, y in (shard(b, r, p) for b in digits_batches(recipe.steps, recipe.batch))]
                rec: dict[str, Any] = {"framework": fw, "model": m, "optimizer": o, "ranks": p}
                w = hooks.train(spec, recipe, shards)
                digests = ddl.allgather_object(weights_digest(spec, w))
                rec["identical"] = len(set(digests)) == 1
                if r == 0:
                    np.savez(wdir / f"{fw}-{m}-{o}.npz", **w)  # type: ignore[arg-type]
                    if p == 1:
                        rec.update(_onnx_checks(hooks, proto, spec, w, wdir))
                records.append(rec)
        if r == 0:
            print(f"conformance: {fw} at {p} rank(s) took {time.perf_counter() - t0:.1f} s", flush=True)
    if r == 0:
        (out / f"np{p}.json").write_text(json.dumps(records, indent=1))
    ddl.barrier()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ddl.tools.conformance.run")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--frameworks", default=",".join(ADAPTERS))
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--optimizers", default=",".join(RECIPES))
    a = ap.parse_args(argv)
    try:
        run(a.out, a.frameworks.split(","), a.models.split(","), a.optimizers.split(","))
    except BaseException:
        traceback.print_exc()
        raise
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
