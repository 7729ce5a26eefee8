"""``python -m tools.caffe.bench --peer DEST``: ddl-caffe against real BVLC Caffe, side by side, at each thread count.

Two tables, every figure from a fresh process of each tool, interleaved (Caffe, then ddl-caffe, then ddl-caffe, then
Caffe, ...) so load from others on a shared machine falls on both alike:

- forward+backward: ``caffe time`` and ``ddl-caffe time`` on each zoo net (batch 1, ``force_backward: true``, TRAIN
  phase as both tools default to), the median over rounds of each tool's "Average Forward-Backward", and each
  process's peak resident memory;
- solver throughput: ``caffe train`` and ``ddl-caffe train`` on a solver as published (its net, its data layers
  reading local LMDBs of random images, its update rule), iterations per second between the log lines of two
  iterations after a warm-up, and peak memory.

Threads: ``OMP_NUM_THREADS`` and ``OPENBLAS_NUM_THREADS`` for both (Caffe's BLAS, PyTorch's intra-op pool).
"""

from __future__ import annotations

import copy
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import text_format

from ddl.caffe.formats import schema
from ddl.caffe.formats.protofile import parse_text, read_net, read_solver
from tools.caffe import zoo_nets
from tools.caffe.parity_nets import bvlc_fields
from tools.caffe.peer import Peer
from tools.caffe.zoo_data import point_at_synthetic_data, set_input_batch

# The nets of the speed targets: their files in a zoo folder (``--dir``), else the generated copy in zoo_nets.
NET_FILES = {
    "alexnet": "bvlc_alexnet/deploy.prototxt",
    "googlenet": "bvlc_googlenet/deploy.prototxt",
    "squeezenet1.1": "squeezenet_v1.1/deploy.prototxt",
    "resnet50": "resnet/ResNet-50-deploy.prototxt",
    "mobilenet_v1": "mobilenet_v1/mobilenet_deploy.prototxt",
    "vgg16": "vgg16/deploy_vgg16-pytorch.prototxt",
    "densenet121": "densenet/DenseNet_121.prototxt",
    "inception_v3": "inception_v3/deploy_inception-v3.prototxt",
}
SOLVER_FILES = {
    "cifar10_full": "bvlc_cifar10/cifar10_full_solver.prototxt",
    "googlenet_quick": "bvlc_googlenet/quick_solver.prototxt",
}
_STAMP = re.compile(r"^[IWEF](?:\d{4})?\d{4} (\d\d):(\d\d):(\d\d\.\d+)")   # glog: [YYYY]MMDD hh:mm:ss.us
_ITER = re.compile(r"Iteration (\d+)[ ,(].*loss = ")
_FB = re.compile(r"Average Forward-Backward: ([0-9.e+-]+) ms")


@dataclass
class Run:
    """One process of one tool: its measure (ms or iterations/s), peak memory (MB), and what it said on failure."""

    value: float | None
    peak_mb: float
    error: str = ""


@dataclass
class Row:
    what: str
    threads: int
    caffe: list[Run] = field(default_factory=list)
    ddl: list[Run] = field(default_factory=list)

    def median(self, side: str) -> float | None:
        vals = [r.value for r in getattr(self, side) if r.value is not None]
        return statistics.median(vals) if vals else None

    def peak(self, side: str) -> float:
        return max((r.peak_mb for r in getattr(self, side)), default=0.0)


def _run(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float) -> tuple[str, float, int]:
    """(stdout+stderr, peak RSS in MB, exit status) of one process, its memory from wait4."""
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        deadline = time.monotonic() + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.05)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        return out.read(), usage.ru_maxrss / 1024, proc.returncode


def _ddl_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


def _ddl_caffe() -> list[str]:
    exe = Path(sys.executable).with_name("ddl-caffe")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "ddl.caffe.command.cli"]


def _failure(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    said = [ln for ln in lines if ln.startswith("F") or "Error" in ln or "error" in ln]
    return (said or lines or ["(no output)"])[-1][-200:]


def time_net(tool: str, peer: Peer, model: Path, threads: int, iterations: int, timeout: float) -> Run:
    """One ``time`` process: its Average Forward-Backward (ms) and peak memory."""
    args = ["time", "-model", str(model), "-iterations", str(iterations)]
    if tool == "caffe":
        env = peer.env(threads)
        env["GLOG_minloglevel"], env["GLOG_logtostderr"] = "0", "1"
        text, peak, code = _run([str(peer.caffe), *args], env, model.parent, timeout)
    else:
        text, peak, code = _run([*_ddl_caffe(), *args], _ddl_env(threads), model.parent, timeout)
    m = _FB.search(text)
    return Run(float(m.group(1)), peak) if code == 0 and m else Run(None, peak, _failure(text))


def _seconds(stamp: re.Match[str]) -> float:
    h, m, s = stamp.groups()
    return int(h) * 3600 + int(m) * 60 + float(s)


def iterations_per_second(text: str, start: int) -> float | None:
    """From glog lines ``Iteration N ... loss = ...`` (Caffe's and ddl-caffe's alike): iterations per second between the
    line of iteration ``start`` and the last one."""
    marks = []
    for line in text.splitlines():
        stamp, it = _STAMP.match(line), _ITER.search(line)
        if stamp and it:
            marks.append((int(it.group(1)), _seconds(stamp)))
    marks = [m for m in marks if m[0] >= start]
    if len(marks) < 2:
        return None
    (i0, t0), (i1, t1) = marks[0], marks[-1]
    return (i1 - i0) / (t1 - t0) if t1 > t0 else None


def train(tool: str, peer: Peer, solver: Path, threads: int, warmup: int, timeout: float) -> Run:
    """One ``train`` process: iterations per second after ``warmup`` iterations, and peak memory."""
    args = ["train", "-solver", str(solver)]
    if tool == "caffe":
        env = peer.env(threads)
        env["GLOG_minloglevel"], env["GLOG_logtostderr"] = "0", "1"
        text, peak, code = _run([str(peer.caffe), *args], env, solver.parent, timeout)
    else:
        text, peak, code = _run([*_ddl_caffe(), *args], _ddl_env(threads), solver.parent, timeout)
    rate = iterations_per_second(text, warmup)
    return Run(rate, peak) if code == 0 and rate else Run(None, peak, _failure(text))


def timing_model(name: str, folder: Path | None, scratch: Path, batch: int) -> Path:
    """The net both ``time`` commands load: the zoo file (or zoo_nets' copy) at ``batch``, force_backward, BVLC fields."""
    if folder is not None and (folder / NET_FILES[name]).is_file():
        param = read_net(folder / NET_FILES[name])
    elif name in zoo_nets.NETS:
        param = parse_text(zoo_nets.NETS[name](batch), schema.NetParameter())
    else:
        raise FileNotFoundError(f"{name}: no {NET_FILES[name]} under --dir {folder} and no generated copy in zoo_nets")
    param = copy.deepcopy(param)
    set_input_batch(param, batch)
    param.force_backward = True
    for lp in param.layer:
        bvlc_fields(lp)
    path = scratch / f"{name}.prototxt"
    path.write_text(text_format.MessageToString(param))
    return path


def solver_files(name: str, folder: Path, scratch: Path, *, iterations: int, warmup: int) -> Path:
    """The published solver and its net, for both ``train`` commands: max_iter ``warmup + iterations``, a log line
    per iteration, no tests, no snapshots, CPU; data layers reading local LMDBs of random images with enough records
    that no record repeats (no reader's cache helps)."""
    src = folder / SOLVER_FILES[name]
    sp = read_solver(src)
    net_path = Path(sp.net or sp.train_net)
    candidates = [src.parent / net_path, src.parent / net_path.name]
    net_file = next((c for c in candidates if c.is_file()), None)
    if net_file is None:
        raise FileNotFoundError(f"{src}: its net {net_path} is not beside it")
    net = read_net(net_file)
    batch = max((lp.data_param.batch_size for lp in net.layer if lp.type == "Data"), default=1)
    point_at_synthetic_data(net, scratch / "data", records=(warmup + iterations + 2) * batch, keep_batch=True)
    out = scratch / name
    out.mkdir(parents=True, exist_ok=True)
    (out / "train_val.prototxt").write_text(text_format.MessageToString(net))
    sp.net = str(out / "train_val.prototxt")
    sp.ClearField("train_net")
    sp.max_iter = warmup + iterations
    sp.display = 1
    sp.average_loss = 1
    sp.test_interval = sp.max_iter + 1
    sp.test_initialization = False
    sp.snapshot = 0
    sp.snapshot_after_train = False
    sp.snapshot_prefix = str(out / "snap")
    sp.solver_mode = 0                                  # CPU
    path = out / "solver.prototxt"
    path.write_text(text_format.MessageToString(sp))
    return path


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def tables(time_rows: list[Row], train_rows: list[Row]) -> str:
    out = ["forward+backward, batch 1 (median ms of each tool's Average Forward-Backward; peak MB; target ddl/Caffe <= 0.8)",
           "| net | threads | Caffe ms | ddl-caffe ms | ddl / Caffe | Caffe peak MB | ddl peak MB |", "|---|---|---|---|---|---|---|"]
    for r in time_rows:
        c, d = r.median("caffe"), r.median("ddl")
        ratio = d / c if c and d else None
        out.append(f"| {r.what} | {r.threads} | {_fmt(c, '.1f')} | {_fmt(d, '.1f')} | {_fmt(ratio, '.2f')} | "
                   f"{r.peak('caffe'):.0f} | {r.peak('ddl'):.0f} |")
    out += ["", "solver throughput (median iterations/s after the warm-up; peak MB; target ddl/Caffe >= 1.25)",
            "| solver | threads | Caffe it/s | ddl-caffe it/s | ddl / Caffe | Caffe peak MB | ddl peak MB |",
            "|---|---|---|---|---|---|---|"]
    for r in train_rows:
        c, d = r.median("caffe"), r.median("ddl")
        ratio = d / c if c and d else None
        out.append(f"| {r.what} | {r.threads} | {_fmt(c, '.3f')} | {_fmt(d, '.3f')} | {_fmt(ratio, '.2f')} | "
                   f"{r.peak('caffe'):.0f} | {r.peak('ddl'):.0f} |")
    errors = [f"{r.what} ({r.threads} threads) {side}: {run.error}" for r in time_rows + train_rows
              for side in ("caffe", "ddl") for run in getattr(r, side) if run.error]
    if errors:
        out += ["", "failures:"] + [f"- {e}" for e in dict.fromkeys(errors)]
    return "\n".join(out) + "\n"


def as_json(time_rows: list[Row], train_rows: list[Row], meta: dict[str, Any]) -> dict[str, Any]:
    def row(r: Row) -> dict[str, Any]:
        c, d = r.median("caffe"), r.median("ddl")
        return {"what": r.what, "threads": r.threads, "caffe": c, "ddl": d, "ddl_over_caffe": d / c if c and d else None,
                "caffe_peak_mb": r.peak("caffe"), "ddl_peak_mb": r.peak("ddl"),
                "caffe_runs": [r_.value for r_ in r.caffe], "ddl_runs": [r_.value for r_ in r.ddl],
                "errors": [x.error for x in r.caffe + r.ddl if x.error]}
    return {**meta, "time": [row(r) for r in time_rows], "train": [row(r) for r in train_rows]}


def run(peer: Peer, *, folder: Path | None, nets: list[str], solvers: list[str], threads: list[int], rounds: int,
        iterations: int, train_iterations: int, warmup: int, timeout: float, report: Any = print) -> tuple[list[Row], list[Row]]:
    """Measure every net and solver at every thread count, ``rounds`` times each tool, interleaved."""
    time_rows: list[Row] = []
    train_rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="ddl-caffe-bench-") as tmp:
        scratch = Path(tmp)
        models = {n: timing_model(n, folder, scratch, 1) for n in nets}
        solver_paths = {}
        for s in solvers:
            if folder is None:
                report(f"{s}: skipped (solver throughput needs --dir with {SOLVER_FILES[s]})")
                continue
            solver_paths[s] = solver_files(s, folder, scratch, iterations=train_iterations, warmup=warmup)
        for t in threads:
            for n, model in models.items():
                row = Row(n, t)
                for k in range(rounds):
                    order = ("caffe", "ddl") if k % 2 == 0 else ("ddl", "caffe")
                    for tool in order:
                        getattr(row, tool).append(time_net(tool, peer, model, t, iterations, timeout))
                time_rows.append(row)
                report(f"time {n} threads={t}: Caffe {_fmt(row.median('caffe'), '.1f')} ms, ddl {_fmt(row.median('ddl'), '.1f')} ms")
            for s, path in solver_paths.items():
                row = Row(s, t)
                for k in range(rounds):
                    order = ("caffe", "ddl") if k % 2 == 0 else ("ddl", "caffe")
                    for tool in order:
                        getattr(row, tool).append(train(tool, peer, path, t, warmup, timeout))
                train_rows.append(row)
                report(f"train {s} threads={t}: Caffe {_fmt(row.median('caffe'), '.3f')} it/s, ddl {_fmt(row.median('ddl'), '.3f')} it/s")
    return time_rows, train_rows
