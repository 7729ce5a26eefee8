"""``python -m tools.caffe.zoo``: zoo nets loaded, run forward and backward, trained with their solvers on synthetic data,
exported and checked in onnxruntime down to the logits; prints the table net | loads | fwd+bwd | solver trains | ONNX logits diff.

With ``--dir`` it takes the nets and solvers of a folder (prototxt files as published: deploy nets, train_val nets, solvers
naming them); without, the nets of ``tools.caffe.zoo_nets``. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ddl.caffe.command.memory import reuse_freed_memory
from ddl.caffe.export.onnx_export import export, logits_of
from ddl.caffe.formats import schema
from ddl.caffe.formats.errors import CaffeFormatError
from ddl.caffe.formats.protofile import parse_text
from ddl.caffe.layers.base import LayerError
from ddl.caffe.net.layer_timing import LayerRunner
from ddl.caffe.net.net import Net
from ddl.caffe.solver.solver import Solver
from tools.caffe import zoo_nets
from tools.caffe.zoo_data import point_at_synthetic_data, set_input_batch, shrink_solver

log = logging.getLogger("ddl.caffe")


@dataclass
class Row:
    net: str
    source: str
    loads: str = "-"
    fwd_bwd: str = "-"
    trains: str = "-"
    onnx: str = "-"
    notes: list[str] = field(default_factory=list)


def _short(e: BaseException) -> str:
    # All lines joined: a format error lists the offending fields below its first line.
    text = " ".join(line.strip() for line in f"{type(e).__name__}: {e}".splitlines() if line.strip())
    return text if len(text) < 300 else text[:297] + "..."


def trained_statistics(net: Net) -> None:
    """Give fresh BatchNorm layers (no statistics yet) unit variance, as a trained model has: with Caffe's zero
    sums their TEST-phase output is x / sqrt(eps), which overflows a deep random net."""
    with torch.no_grad():
        for la in net.layers:
            if la.type == "BatchNorm" and float(la.blobs[2].reshape(-1)[0]) == 0:
                la.blobs[1].fill_(1.0)
                la.blobs[2].fill_(1.0)


def _local(param: Any, scratch: Path, batch: int) -> Any:
    """A copy of a net whose data layers read generated files and whose inputs hold ``batch`` items (the user's file is untouched)."""
    p = copy.deepcopy(param)
    point_at_synthetic_data(p, scratch / "data")
    set_input_batch(p, batch)
    return p


def _load(param: Any, phase: int, scratch: Path, batch: int, stages: tuple[str, ...]) -> str:
    Net(_local(param, scratch, batch), phase, quiet=True, stages=stages)
    return "ok"


def random_weights(net: Net, seed: int = 0) -> None:
    """Give all-zero weight blobs (a deploy file without fillers) Gaussian values of He scale, as a trained model has
    non-zero weights: with zeros every output is the bias, and the ONNX comparison compares zeros with zeros."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for la in net.layers:
            if la.type == "BatchNorm" or not la.blobs:
                continue
            w = la.blobs[0]
            if w.dim() >= 2 and not bool(w.any()):
                fan_in = max(1, w.numel() // w.shape[0])
                w.copy_(torch.randn(w.shape, generator=gen) * (2.0 / fan_in) ** 0.5)


def _fwd_bwd(param: Any, phase: int, scratch: Path, batch: int) -> str:
    from ddl.caffe.command.cli import generate_inputs
    net = Net(_local(param, scratch, batch), phase, quiet=True)
    trained_statistics(net)
    generate_inputs(net, torch.Generator().manual_seed(0))
    runner = LayerRunner(net)
    n = len(net.layers)
    fwd, bwd = [0.0] * n, [0.0] * n
    runner.iteration(fwd, bwd)
    fwd, bwd = [0.0] * n, [0.0] * n
    t0 = time.perf_counter()
    runner.iteration(fwd, bwd)
    total = (time.perf_counter() - t0) * 1e3
    return f"ok {total:.0f} ms (fwd {sum(fwd) * 1e3:.0f} + bwd {sum(bwd) * 1e3:.0f})"


def _train(sp: Any, scratch: Path, iters: int) -> str:
    sp = copy.deepcopy(sp)
    shrink_solver(sp, iters=iters, prefix=str(scratch / "snap" / "zoo"))
    for f in ("net_param", "train_net_param"):
        if sp.HasField(f):
            point_at_synthetic_data(getattr(sp, f), scratch / "data")
    for p in sp.test_net_param:
        point_at_synthetic_data(p, scratch / "data")
    losses: list[float] = []
    solver = Solver(sp)
    for tn in solver.test_nets:
        point_at_synthetic_data(tn.param, scratch / "data")
    orig = solver.forward_backward

    def record() -> tuple[float, dict[str, torch.Tensor]]:
        lv, blobs = orig()
        losses.append(lv)
        return lv, blobs
    solver.forward_backward = record                          # type: ignore[method-assign]
    solver.solve()
    fmt = "HDF5" if sp.snapshot_format == 0 else "binary"
    return f"ok {sp.type or 'SGD'} {iters} it, loss {losses[0]:.3g} -> {losses[-1]:.3g}, {fmt} snapshot"


def _onnx(param: Any, scratch: Path, name: str, batch: int, stages: tuple[str, ...]) -> str:
    net = Net(_local(param, scratch, batch), schema.TEST, quiet=True, stages=stages)
    trained_statistics(net)
    random_weights(net)
    rel = export(net, scratch / f"{name}.onnx")
    logits = set(logits_of(net))
    keys = [k for k in rel if k in logits] or list(rel)
    worst = max(rel[k] for k in keys)
    (scratch / f"{name}.onnx").unlink(missing_ok=True)
    return f"{worst:.1e}" + (" (logits)" if logits & set(keys) else "")


def _test_stages(solver: Any | None) -> tuple[str, ...]:
    """The stages of the solver's first test net (a net whose TEST data layers need a stage has none without them)."""
    return tuple(solver.test_state[0].stage) if solver is not None and len(solver.test_state) else ()


def run_one(name: str, source: str, deploy: Any | None, train: Any | None, solver: Any | None, scratch: Path,
            *, iters: int, onnx: bool, batch: int = 1) -> Row:
    row = Row(name, source)
    phase = schema.TRAIN if train is not None else schema.TEST
    stages = _test_stages(solver)
    steps = (("loads", lambda: _load(train or deploy, phase, scratch, batch, ())),
             ("fwd_bwd", lambda: _fwd_bwd(train or deploy, phase, scratch, batch)),
             ("trains", (lambda: _train(solver, scratch, iters)) if solver is not None else None),
             ("onnx", (lambda: _onnx(deploy or train, scratch, name.replace("/", "_"), batch, stages)) if onnx else None))
    for key, fn in steps:
        if fn is None:
            continue
        try:
            setattr(row, key, fn())
        except (CaffeFormatError, LayerError, ValueError, RuntimeError, OSError) as e:
            setattr(row, key, "FAIL")
            row.notes.append(f"{key}: {_short(e)}")
            log.debug("%s", traceback.format_exc())
    return row


def generated(batch: int) -> list[tuple[str, Any, Any, Any]]:
    """(name, deploy, train_val, solver) for each net of ``zoo_nets``, trained on DummyData."""
    out = []
    for name, fn in zoo_nets.NETS.items():
        deploy = parse_text(fn(batch), schema.NetParameter())
        tv = _dummy_train_val(fn(batch), batch)
        sp = parse_text('base_lr: 0.001 momentum: 0.9 weight_decay: 0.0005 lr_policy: "step" gamma: 0.1 stepsize: 1000 '
                        'snapshot_after_train: true type: "SGD"', schema.SolverParameter())
        sp.net_param.CopyFrom(tv)
        out.append((name, deploy, tv, sp))
    return out


def _dummy_train_val(deploy: str, batch: int) -> Any:
    tv = parse_text(zoo_nets.train_val(deploy), schema.NetParameter())
    first = tv.layer[0]
    shape = list(first.input_param.shape[0].dim)
    first.ClearField("input_param")
    first.type = "DummyData"
    p = first.dummy_data_param
    p.shape.add().dim.extend(shape)
    p.shape.add().dim.append(batch)
    p.data_filler.add(type="gaussian", std=1)
    p.data_filler.add(type="constant", value=1)
    return tv


def _net_file_of(solver_path: Path, net_file: str, nets: dict[Path, Any]) -> Path | None:
    """The folder's file a solver's ``net`` names: the path as written relative to the solver, else the same file name
    beside the solver, else (zoo files keep their repository's paths) a file of that name anywhere in the folder."""
    if not net_file:
        return None
    name = Path(net_file).name
    for cand in (solver_path.parent / net_file, solver_path.parent / name):
        if cand in nets:
            return cand
    return next((p for p in nets if p.name == name), None)


def from_folder(folder: Path) -> list[tuple[str, Any, Any, Any]]:
    """(name, deploy, train_val, solver) from the prototxt files of a folder: solvers name their nets; other files are nets."""
    solvers: dict[Path, Any] = {}
    nets: dict[Path, Any] = {}
    bad: list[tuple[str, str]] = []
    for path in sorted(folder.rglob("*.prototxt")):
        text = path.read_text(errors="replace")
        if "base_lr" in text or "lr_policy" in text:
            try:
                from ddl.caffe.formats.protofile import read_solver
                solvers[path] = read_solver(path)
            except (CaffeFormatError, ValueError) as e:
                bad.append((str(path.relative_to(folder)), _short(e)))
            continue
        try:
            nets[path] = parse_text(text, schema.NetParameter(), source=str(path))
        except (CaffeFormatError, ValueError) as e:
            bad.append((str(path.relative_to(folder)), _short(e)))
    out: list[tuple[str, Any, Any, Any]] = [(name, None, None, ("PARSE", err)) for name, err in bad]
    used: set[Path] = set()
    for spath, sp in solvers.items():
        net_file = sp.net or sp.train_net
        target = _net_file_of(spath, net_file, nets)
        if target is not None:
            used.add(target)
            sp = copy.deepcopy(sp)
            sp.ClearField("net")
            sp.ClearField("train_net")
            sp.net_param.CopyFrom(nets[target])
            out.append((str(spath.relative_to(folder)), None, nets[target], sp))
        elif sp.HasField("net_param") or sp.HasField("train_net_param"):
            out.append((str(spath.relative_to(folder)), None, sp.net_param if sp.HasField("net_param") else sp.train_net_param, sp))
        else:
            out.append((str(spath.relative_to(folder)), None, None, ("PARSE", f"its net {net_file} is not in the folder")))
    for path, net in nets.items():
        if path in used:                                   # its solver's row already loads, runs and exports it
            continue
        trainable = any(lp.type not in ("Input",) and LayerRunnerDataTypes.is_data(lp.type) for lp in net.layer)
        out.append((str(path.relative_to(folder)), None if trainable else net, net if trainable else None, None))
    return out


class LayerRunnerDataTypes:
    """Which layer types read data (a net with one is a train_val net)."""

    DATA = frozenset(("Data", "ImageData", "WindowData", "HDF5Data", "MemoryData", "DummyData", "AnnotatedData", "Python"))

    @classmethod
    def is_data(cls, t: str) -> bool:
        return t in cls.DATA


def sources_of(folder: Path) -> dict[str, str]:
    """The origin of each file, from the folder's optional ``SOURCES.txt`` (one ``relative/path origin ...`` line per
    file, e.g. ``alexnet/deploy.prototxt BVLC/caffe@310574f``): the table names where a fetched file came from."""
    path = folder / "SOURCES.txt"
    if not path.is_file():
        return {}
    out = {}
    for line in path.read_text(errors="replace").splitlines():
        parts = line.split()
        if len(parts) >= 2 and not line.startswith("#"):
            out[parts[0]] = parts[1]
    return out


def expected_failures_of(folder: Path) -> dict[str, str]:
    """Failures a folder declares in ``EXPECTED_FAILURES.txt``, one ``relative/path: words of the error`` per line: files
    Caffe itself refuses (a fork's field, a setting Caffe aborts on) that the job should see refused, with that message."""
    path = folder / "EXPECTED_FAILURES.txt"
    if not path.is_file():
        return {}
    out = {}
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        name, sep, words = line.partition(":")
        if not sep or not words.strip():
            raise ValueError(f"{path}:{n}: expected 'relative/path: words of the error', got {line!r}")
        out[name.strip()] = words.strip()
    return out


def verdict(rows: list[Row], expected: dict[str, str]) -> list[str]:
    """What is wrong with a run: failures not declared expected, and declared ones that passed or failed differently."""
    problems = []
    for r in rows:
        failed = "FAIL" in (r.loads, r.fwd_bwd, r.trains, r.onnx)
        words = expected.get(r.net)
        if words is None and failed:
            problems.append(f"{r.net}: failed ({'; '.join(r.notes)})")
        elif words is not None and not failed:
            problems.append(f"{r.net}: expected to fail with '{words}' but passed; remove it from EXPECTED_FAILURES.txt")
        elif words is not None and not any(words in n for n in r.notes):
            problems.append(f"{r.net}: failed, but not with '{words}': {'; '.join(r.notes)}")
    return problems


def table(rows: list[Row]) -> str:
    head = "| net | source | loads | fwd+bwd | solver trains | ONNX logits diff |\n|---|---|---|---|---|---|\n"
    return head + "\n".join(f"| {r.net} | {r.source} | {r.loads} | {r.fwd_bwd} | {r.trains} | {r.onnx} |" for r in rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.caffe.zoo", description=__doc__)
    ap.add_argument("--dir", help="a folder of zoo prototxt files (nets and solvers); default: tools.caffe.zoo_nets")
    ap.add_argument("--nets", default="", help="comma-separated names to run (default all)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--iters", type=int, default=2, help="solver iterations per net")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--no-onnx", action="store_true")
    ap.add_argument("--json", default="", help="write the rows as JSON here")
    a = ap.parse_args(argv)
    reuse_freed_memory()
    if a.threads:
        torch.set_num_threads(a.threads)
    logging.getLogger("ddl.caffe").setLevel(logging.ERROR)
    if a.dir:
        folder = Path(a.dir)
        if not folder.is_dir():
            print(f"tools.caffe.zoo: {folder} is not a folder (skipped: the zoo job runs on prototxt files you fetched there)")
            return 2
        items, source = from_folder(folder), str(folder)
        origins, expected = sources_of(folder), expected_failures_of(folder)
    else:
        items, source = generated(a.batch), "tools.caffe.zoo_nets"
        origins, expected = {}, {}
    wanted = {n for n in a.nets.split(",") if n}
    rows = []
    with tempfile.TemporaryDirectory(prefix="ddl-caffe-zoo-") as tmp:
        for name, deploy, train, sp in items:
            if wanted and name not in wanted:
                continue
            origin = origins.get(name, source)
            if isinstance(sp, tuple):
                rows.append(Row(name, origin, loads="FAIL", notes=[sp[1]]))
            else:
                rows.append(run_one(name, origin, deploy, train, sp, Path(tmp), iters=a.iters, onnx=not a.no_onnx,
                                    batch=a.batch))
            r = rows[-1]
            print(f"{r.net}: loads {r.loads}; fwd+bwd {r.fwd_bwd}; trains {r.trains}; onnx {r.onnx}" + ("".join(f"\n    {n}" for n in r.notes)), flush=True)
    print()
    print(table(rows))
    if a.json:
        Path(a.json).write_text(json.dumps([asdict(r) for r in rows], indent=2))
    problems = verdict(rows, {k: v for k, v in expected.items() if not wanted or k in wanted})
    for line in problems:
        print(f"tools.caffe.zoo: {line}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
