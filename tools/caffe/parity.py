"""``python -m tools.caffe.parity --peer DEST``: ddl-caffe against real BVLC Caffe, blob for blob, both directions.

For each net (the zoo job's: ``--dir`` a folder of prototxt files, else ``tools.caffe.zoo_nets``) and each phase
where the net differs by phase (TEST always; TRAIN too with BatchNorm, Dropout or phase rules), ddl-caffe writes
random weights as a .caffemodel; real Caffe (pycaffe, from ``--peer``) and ddl-caffe load them and the same input:

- whole net: every top blob after forward, every blob diff and parameter diff after backward (from the loss, or
  from random diffs of the outputs of a net without one, under ``force_backward``);
- layer by layer, the decisive form: each layer given Caffe's own bottom data and random top diffs, its tops,
  bottom diffs and parameter diffs compared.

A difference is ``max |ddl - caffe| / max |caffe|`` per blob. Whole-net backward through ReLUs amplifies forward
rounding (an input within 1e-6 of zero flips a mask), so its column is reported, not judged; the judged targets are
forward tops and layer-by-layer diffs within ``--tolerance`` (1e-4). Prints a table, writes JSON, exits 1 when a
layer differs (each named, with its blob and difference).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ddl.caffe.export.onnx_export import sample_inputs
from ddl.caffe.formats import schema
from ddl.caffe.formats.errors import CaffeFormatError
from ddl.caffe.formats.protofile import parse_text
from ddl.caffe.layers.base import LayerError
from ddl.caffe.net.net import Net
from ddl.caffe.net.weights import load_weights
from tools.caffe import zoo_nets
from tools.caffe.parity_nets import (
    calm_logits,
    comparable,
    has_loss,
    phases_of,
    prototxt,
    randomize,
)
from tools.caffe.real_caffe import Peer, PeerError

PHASES = {schema.TRAIN: "TRAIN", schema.TEST: "TEST"}
# How much further from float64 than Caffe ddl may be on a blob over the tolerance before it is called a difference:
# float32 rounding through an ill-conditioned net (TRAIN-phase BatchNorm over 2x2 maps at batch 1) leaves the two
# sides up to 2.1x apart in their distance from the exact value (MobileNet-SSD, measured).
SPREAD = 4.0


@dataclass
class Row:
    net: str
    phase: str
    layers: int = 0
    forward: float = float("nan")            # whole net, worst top blob
    backward: float = float("nan")           # whole net, worst blob or parameter diff (reported, not judged)
    layer_forward: float = float("nan")      # layer by layer, worst top
    layer_backward: float = float("nan")     # layer by layer, worst bottom or parameter diff
    status: str = "ok"
    differs: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def rel(ours: np.ndarray, theirs: np.ndarray) -> float:
    """max |ours - theirs| / max |theirs| (0 when both are all zeros)."""
    if ours.shape != theirs.shape:
        if ours.size != theirs.size:
            return float("inf")
        ours = ours.reshape(theirs.shape)
    scale = float(np.abs(theirs).max()) if theirs.size else 0.0
    diff = float(np.abs(ours.astype(np.float64) - theirs).max()) if theirs.size else 0.0
    return diff / scale if scale > 0 else (0.0 if diff == 0 else float("inf"))


def _np(t: torch.Tensor | None) -> np.ndarray:
    assert t is not None
    return t.detach().cpu().numpy()


def whole_net(net: Net, inputs: dict[str, torch.Tensor], output_diffs: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """ddl's forward and backward of the whole net: (blob data by name, blob diffs by name, parameter diffs by
    ``layer/i``). A blob's diff is that of its first version (Caffe's in-place layers write their bottom diff into
    the top's, so after backward a blob holds the diff of what its first producer made)."""
    first: dict[str, torch.Tensor] = {}
    last: dict[str, torch.Tensor] = {}
    loss = torch.zeros(())
    for i, la in enumerate(net.layers):
        if la.type == "Input":
            tops = [inputs[t].clone().requires_grad_(net.force_backward) for t in la.top]
        else:
            tops = net.run_layer(i, [last[b] for b in la.bottom])
        for j, (name, t) in enumerate(zip(la.top, tops, strict=True)):
            if t.requires_grad and name not in first:
                t.retain_grad()
            first.setdefault(name, t)
            last[name] = t
            if la.loss_weight(j):
                loss = loss + la.loss_weight(j) * t.sum()
    for name, g in output_diffs.items():
        loss = loss + (last[name] * torch.from_numpy(g)).sum()
    if loss.requires_grad:
        loss.backward()
    data = {n: _np(t) for n, t in last.items()}
    diffs = {n: _np(t.grad) for n, t in first.items() if t.grad is not None}
    params = {f"{la.name}/{i}": _np(b.grad) for la in net.layers for i, b in enumerate(la.blobs) if b.grad is not None}
    return data, diffs, params


def float64_run(text: str, phase: int, weights: Path, inputs: dict[str, torch.Tensor],
                output_diffs: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """ddl's whole-net forward and backward in float64 on the same weights, inputs and output diffs: (blob data,
    blob diffs), the reference that tells which float32 side (ddl's or Caffe's) a whole-net difference comes from."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        net = Net(parse_text(text, schema.NetParameter()), phase, quiet=True)
        load_weights(net, str(weights))
        for la in net.layers:
            la.blobs = [b.detach().double().requires_grad_(b.requires_grad) for b in la.blobs]
        data, diffs, _ = whole_net(net, {k: v.double() for k, v in inputs.items()},
                                   {k: v.astype(np.float64) for k, v in output_diffs.items()})
        return data, diffs
    finally:
        torch.set_default_dtype(old)


def _learned(net: Net) -> set[tuple[str, int]]:
    """(layer, blob index) of the parameters Caffe computes diffs for (lr_mult != 0)."""
    return {(p.layer, p.index) for p in net.params if p.lr_mult != 0}


def compare_whole(row: Row, net: Net, caffe: Any, inputs: dict[str, torch.Tensor], output_diffs: dict[str, np.ndarray],
                  tol: float, reference: Any) -> None:
    """Whole-net forward and backward; a forward blob over ``tol`` is judged against ``reference()`` (float64 data
    and diffs): it differs when ddl is over ``tol`` from float64 and more than ``SPREAD`` times as far as Caffe is;
    otherwise both float32 results are that far apart by the net's conditioning (Caffe's no closer to the exact
    value). The backward is reported, with the same float64 distances for its worst blob diff."""
    data, diffs, params = whole_net(net, inputs, output_diffs)
    worst_f, worst_b = 0.0, 0.0
    exact: tuple[dict[str, np.ndarray], dict[str, np.ndarray]] | None = None
    conditioned = []
    for name, value in data.items():
        key = f"data/{name}"
        if key in caffe.files:
            r = rel(value, caffe[key])
            worst_f = max(worst_f, r)
            if r > tol:
                exact = reference() if exact is None else exact
                ours, theirs = rel(value, exact[0][name]), rel(caffe[key], exact[0][name])
                if ours > tol and ours > SPREAD * theirs:
                    row.differs.append(f"whole-net forward: blob '{name}' {r:.1e} (from float64: ddl {ours:.1e}, Caffe {theirs:.1e})")
                else:
                    conditioned.append((name, r, ours, theirs))
    if conditioned:
        name, r, ours, theirs = max(conditioned, key=lambda c: c[1])
        row.notes.append(f"whole-net forward over the tolerance in {len(conditioned)} blobs, worst '{name}' {r:.1e}: "
                         f"conditioning, not an error: from a float64 run ddl is {ours:.1e} off and Caffe {theirs:.1e}")
    worst_diff = ("", 0.0)
    for name, value in diffs.items():
        key = f"diff/{name}"
        if key in caffe.files:
            r = rel(value, caffe[key])
            worst_b = max(worst_b, r)
            worst_diff = max(worst_diff, (name, r), key=lambda w: w[1])
    if worst_diff[1] > tol:
        exact = reference() if exact is None else exact
        name = worst_diff[0]
        if name in exact[1]:
            row.notes.append(f"whole-net backward: worst blob diff '{name}' {worst_diff[1]:.1e}; from a float64 run ddl is "
                             f"{rel(diffs[name], exact[1][name]):.1e} off and Caffe {rel(caffe[f'diff/{name}'], exact[1][name]):.1e}")
    learned = _learned(net)
    for key, value in params.items():
        layer, i = key.rsplit("/", 1)
        if (layer, int(i)) in learned and f"param/{key}" in caffe.files:
            worst_b = max(worst_b, rel(value, caffe[f"param/{key}"]))
    row.forward, row.backward = worst_f, worst_b
    if diffs and all(not v.any() for v in diffs.values()):
        row.notes.append("whole-net backward: every blob diff is zero")


def compare_layers(row: Row, net: Net, folder: Path, listing: list[tuple[int, str, str]], tol: float) -> None:
    """Each of ddl's layers run alone on Caffe's bottoms with Caffe's top diffs; tops, bottom and parameter diffs."""
    layer_need, bottom_need = net.backward_needs()
    index = {la.name: i for i, la in enumerate(net.layers)}
    learned = _learned(net)
    worst_f, worst_b, compared = 0.0, 0.0, 0
    caffe_only = []
    for ci, name, typ in listing:
        i = index.get(name)
        if i is None:
            if typ != "Split":                          # Caffe's automatic splits have no layer in ddl
                caffe_only.append(name)
            continue
        la = net.layers[i]
        if la.type == "Input":
            continue
        saved = np.load(folder / f"{ci}.npz")
        xs = [torch.from_numpy(saved[f"bottom/{j}"]).clone().requires_grad_(bottom_need[i][j] and saved[f"bottom/{j}"].dtype == np.float32)
              for j in range(len(la.bottom))]
        for b in la.blobs:
            b.grad = None
        tops = net.run_layer(i, xs)
        compared += 1
        for j, t in enumerate(tops):
            r = rel(_np(t), saved[f"top/{j}"])
            worst_f = max(worst_f, r)
            if r > tol:
                row.differs.append(f"layer {name} ({typ}) top {j} '{la.top[j]}': {r:.1e}")
        if not layer_need[i]:
            continue
        outs = [(t, torch.from_numpy(saved[f"top_diff/{j}"])) for j, t in enumerate(tops) if t.requires_grad]
        if not outs:
            continue
        torch.autograd.backward([t for t, _ in outs], [g.reshape(t.shape) for t, g in outs])
        for j, x in enumerate(xs):
            if bottom_need[i][j] and x.grad is not None:
                r = rel(_np(x.grad), saved[f"bottom_diff/{j}"])
                worst_b = max(worst_b, r)
                if r > tol:
                    row.differs.append(f"layer {name} ({typ}) bottom diff {j} '{la.bottom[j]}': {r:.1e}")
        for k, b in enumerate(la.blobs):
            if (name, k) in learned and b.grad is not None and f"param/{k}" in saved.files:
                r = rel(_np(b.grad), saved[f"param/{k}"])
                worst_b = max(worst_b, r)
                if r > tol:
                    row.differs.append(f"layer {name} ({typ}) param diff {k}: {r:.1e}")
    if caffe_only:
        row.notes.append(f"in Caffe only: {', '.join(caffe_only)}")
    row.layers, row.layer_forward, row.layer_backward = compared, worst_f, worst_b


def run_one(name: str, param: Any, phase: int, peer: Peer, scratch: Path, *, batch: int, tol: float, seed: int,
            keep: bool = False) -> Row:
    row = Row(name, PHASES[phase])
    work = scratch / name.replace("/", "_") / PHASES[phase]
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    try:
        net_param, notes = comparable(param, phase, batch=batch)
        row.notes += notes
        text = prototxt(net_param)
        (work / "net.prototxt").write_text(text)
        net = Net(parse_text(text, schema.NetParameter()), phase, quiet=True)
        randomize(net, seed)
        inputs = sample_inputs(net, seed=seed)
        calmed = calm_logits(net, inputs)
        if calmed:
            row.notes.append(f"weights of {', '.join(calmed)} scaled to unit logits (a saturated Softmax has zero diffs)")
        net.save(work / "weights.caffemodel")                  # ddl's writer; Caffe reads it
        np.savez(work / "inputs.npz", **{k: v.numpy() for k, v in inputs.items()})
        gen = np.random.default_rng(seed)
        output_diffs = {} if has_loss(net_param) else {
            o: gen.standard_normal(net.shapes[o]).astype(np.float32) for o in net.outputs}
        np.savez(work / "output_diffs.npz", **output_diffs)
    except (CaffeFormatError, LayerError, ValueError, RuntimeError) as e:
        row.status = f"ddl refuses: {e}".splitlines()[0][:200]
        return row
    proc = peer.pycaffe([str(work), PHASES[phase]])
    if proc.returncode != 0:
        lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        # glog's fatal line, or protobuf's parse error that precedes it.
        unknown = next((ln for ln in lines if "has no field named" in ln), None)
        if unknown is not None:
            row.status = "not BVLC's: " + unknown.split("has no field named", 1)[1].strip(' ".') + " is a fork's field"
        else:
            said = [ln for ln in lines if ln.startswith("F") or "Error" in ln] or lines[-2:]
            row.status = "Caffe refuses: " + " | ".join(said[:2])[-300:]
        return row
    caffe = np.load(work / "whole.npz")
    # ddl loads the same file Caffe loaded (its reader, checked against its writer here).
    ours = Net(parse_text(text, schema.NetParameter()), phase, quiet=True)
    load_weights(ours, str(work / "weights.caffemodel"))
    compare_whole(row, ours, caffe, inputs, output_diffs, tol,
                  lambda: float64_run(text, phase, work / "weights.caffemodel", inputs, output_diffs))
    listing = [(int(i), n, t) for i, n, t in (ln.split() for ln in (work / "layers.txt").read_text().splitlines())]
    fresh = Net(parse_text(text, schema.NetParameter()), phase, quiet=True)
    load_weights(fresh, str(work / "weights.caffemodel"))
    compare_layers(row, fresh, work / "layers", listing, tol)
    if row.differs:
        row.status = "DIFFERS"
    if not keep:
        shutil.rmtree(work)
    return row


def nets_of(folder: Path | None, batch: int) -> list[tuple[str, Any]]:
    """(name, NetParameter) of each net file of ``folder`` (solvers skipped: they name these), else the generated nets
    of ``tools.caffe.zoo_nets`` as deploy nets and as train_val nets."""
    out: list[tuple[str, Any]] = []
    if folder is None:
        for name, fn in zoo_nets.NETS.items():
            out.append((name, parse_text(fn(batch), schema.NetParameter())))
            out.append((f"{name}/train_val", parse_text(zoo_nets.train_val(fn(batch)), schema.NetParameter())))
        return out
    for path in sorted(folder.rglob("*.prototxt")):
        text = path.read_text(errors="replace")
        if "base_lr" in text or "lr_policy" in text:
            continue
        try:
            out.append((str(path.relative_to(folder)), parse_text(text, schema.NetParameter(), source=str(path))))
        except CaffeFormatError as e:
            out.append((str(path.relative_to(folder)), e))
    return out


def table(rows: list[Row]) -> str:
    def f(x: float) -> str:
        return "-" if x != x else f"{x:.1e}"
    head = ("| net | phase | layers compared | forward (whole net) | backward (whole net) | layer by layer: tops | "
            "layer by layer: bottom and param diffs | status |\n|---|---|---|---|---|---|---|---|\n")
    return head + "\n".join(f"| {r.net} | {r.phase} | {r.layers} | {f(r.forward)} | {f(r.backward)} | {f(r.layer_forward)} | "
                            f"{f(r.layer_backward)} | {r.status} |" for r in rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.caffe.parity", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer", required=True, help="a BVLC Caffe build with pycaffe (build-caffe.sh --python SRC DEST: DEST)")
    ap.add_argument("--peer-python", default="/usr/bin/python3", help="the Python pycaffe was built for")
    ap.add_argument("--dir", help="a folder of zoo prototxt files; default: the generated nets of tools.caffe.zoo_nets")
    ap.add_argument("--nets", default="", help="comma-separated names (paths under --dir) to run; default all")
    ap.add_argument("--batch", type=int, default=2, help="items per input (2: TRAIN-phase BatchNorm has a batch)")
    ap.add_argument("--tolerance", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--json", default="", help="write the rows as JSON here")
    ap.add_argument("--keep", default="", help="keep each net's files (prototxt, weights, both sides' blobs) under this folder")
    a = ap.parse_args(argv)
    logging.getLogger("ddl.caffe").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    peer = Peer(Path(a.peer), a.peer_python)
    try:
        peer.check(pycaffe=True)
    except PeerError as e:
        print(f"tools.caffe.parity: {e}")
        return 2
    wanted = {n for n in a.nets.split(",") if n}
    rows: list[Row] = []
    print(f"peer: {peer.version()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="ddl-caffe-parity-") as tmp:
        scratch = Path(a.keep) if a.keep else Path(tmp)
        for name, param in nets_of(Path(a.dir) if a.dir else None, a.batch):
            if wanted and name not in wanted:
                continue
            if isinstance(param, Exception):
                rows.append(Row(name, "-", status=f"ddl refuses: {param}".splitlines()[0][:200]))
                continue
            for phase in phases_of(param):
                t0 = time.perf_counter()
                rows.append(run_one(name, param, phase, peer, scratch, batch=a.batch, tol=a.tolerance, seed=a.seed,
                                    keep=bool(a.keep)))
                r = rows[-1]
                print(f"{r.net} {r.phase}: {r.status}; {r.layers} layers; forward {r.forward:.1e}, backward {r.backward:.1e}; "
                      f"layer by layer {r.layer_forward:.1e} / {r.layer_backward:.1e} ({time.perf_counter() - t0:.0f} s)"
                      + "".join(f"\n    {d}" for d in r.differs[:20]) + "".join(f"\n    note: {n}" for n in r.notes), flush=True)
    print()
    print(table(rows))
    if a.json:
        Path(a.json).write_text(json.dumps([asdict(r) for r in rows], indent=2))
    return 1 if any(r.status == "DIFFERS" for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
