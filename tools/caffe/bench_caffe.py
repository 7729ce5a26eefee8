"""``python -m tools.caffe.bench --peer DEST``: ddl-caffe against real BVLC Caffe, side by side, at each thread count.

Two tables, every figure from fresh processes of each tool, interleaved (Caffe, then ddl-caffe, then ddl-caffe, then
Caffe, ...) so load from others on a shared machine falls on both alike:

- forward+backward: ``caffe time`` and ``ddl-caffe time`` on each zoo net (batch 1, ``force_backward: true``, TRAIN
  phase as both tools default to): the median over rounds of each tool's "Average Forward-Backward" (wall clock),
  and of its CPU time per iteration, and each process's peak resident memory;
- solver throughput: ``caffe train`` and ``ddl-caffe train`` on a solver as published (its net, its data layers
  reading local LMDBs of random images, its update rule): iterations per second between the log lines of two
  iterations after a warm-up (wall clock), and per CPU second; peak memory.

CPU time per iteration is the difference of two processes' CPU time (``wait4``), one running twice the iterations
of the other, divided by the extra iterations: start-up and warm-up cancel. On one thread it is the work done, and
a machine shared with other jobs (which deschedule a process and stretch its wall clock) does not count against
either tool; on two threads it adds the threads' time, so the wall clock is the figure to read on a quiet machine.

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
from tools.caffe.real_caffe import Peer
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
# Timed solver iterations: a few seconds of work each, so start-up's spread (importing torch: +-0.5 s of CPU)
# stays small beside the difference of the two runs.
TRAIN_ITERATIONS = {"cifar10_full": 30, "googlenet_quick": 3}
WORK_MS = 4000.0        # ``time``: iterations per run chosen to make about this much work
_STAMP = re.compile(r"^[IWEF](?:\d{4})?\d{4} (\d\d):(\d\d):(\d\d\.\d+)")   # glog: [YYYY]MMDD hh:mm:ss.us
_ITER = re.compile(r"Iteration (\d+)[ ,(].*loss = ")
_FB = re.compile(r"Average Forward-Backward: ([0-9.e+-]+) ms")


@dataclass
class Run:
    """One measure of one tool (two processes, n and 2n iterations): its wall-clock figure (ms or iterations/s),
    CPU ms per iteration, peak memory (MB), and what it said on failure."""

    value: float | None
    peak_mb: float
    error: str = ""
    cpu_ms: float | None = None


@dataclass
class Row:
    what: str
    threads: int
    caffe: list[Run] = field(default_factory=list)
    ddl: list[Run] = field(default_factory=list)
    load: tuple[float, float] = (0.0, 0.0)   # the machine's 1-minute load average when the row began and ended

    def median(self, side: str, what: str = "value") -> float | None:
        vals = [getattr(r, what) for r in getattr(self, side) if getattr(r, what) is not None]
        return statistics.median(vals) if vals else None

    def peak(self, side: str) -> float:
        return max((r.peak_mb for r in getattr(self, side)), default=0.0)


def _run(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float) -> tuple[str, float, int, float]:
    """(stdout+stderr, peak RSS in MB, exit status, CPU seconds) of one process, its resources from wait4."""
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
        return out.read(), usage.ru_maxrss / 1024, proc.returncode, usage.ru_utime + usage.ru_stime


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


def _command(tool: str, peer: Peer, args: list[str], threads: int) -> tuple[list[str], dict[str, str]]:
    if tool == "caffe":
        env = peer.env(threads)
        env["GLOG_minloglevel"], env["GLOG_logtostderr"] = "0", "1"
        return [str(peer.caffe), *args], env
    return [*_ddl_caffe(), *args], _ddl_env(threads)


def iterations_for(peer: Peer, model: Path, threads: int, least: int, timeout: float) -> int:
    """Iterations that make about ``WORK_MS`` of Caffe's work on ``model`` (at least ``least``), from a short run."""
    cmd, env = _command("caffe", peer, ["time", "-model", str(model), "-iterations", "2"], threads)
    text, _, code, _ = _run(cmd, env, model.parent, timeout)
    m = _FB.search(text)
    return max(least, min(200, round(WORK_MS / float(m.group(1))))) if code == 0 and m and float(m.group(1)) > 0 else least


def time_net(tool: str, peer: Peer, model: Path, threads: int, iterations: int, timeout: float) -> Run:
    """``time`` at ``iterations`` and twice as many: the longer run's Average Forward-Backward (ms), CPU ms per
    iteration from the two processes' difference, and peak memory."""
    results = []
    for n in (iterations, 2 * iterations):
        cmd, env = _command(tool, peer, ["time", "-model", str(model), "-iterations", str(n)], threads)
        results.append(_run(cmd, env, model.parent, timeout))
    (_, peak1, code1, cpu1), (text, peak2, code2, cpu2) = results
    m = _FB.search(text)
    if code1 or code2 or not m:
        return Run(None, max(peak1, peak2), _failure(text if code2 or not m else results[0][0]))
    return Run(float(m.group(1)), max(peak1, peak2), cpu_ms=(cpu2 - cpu1) * 1e3 / iterations)


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


def train(tool: str, peer: Peer, solvers: tuple[Path, Path], threads: int, warmup: int, timeout: float) -> Run:
    """``train`` on two solvers (the second runs twice the timed iterations of the first): iterations per second
    after ``warmup`` (the longer run's log lines), CPU ms per iteration from the two processes' difference, and
    peak memory."""
    results = []
    for solver in solvers:
        cmd, env = _command(tool, peer, ["train", "-solver", str(solver)], threads)
        results.append(_run(cmd, env, solver.parent, timeout))
    (text1, peak1, code1, cpu1), (text, peak2, code2, cpu2) = results
    rate = iterations_per_second(text, warmup)
    if code1 or code2 or not rate:
        return Run(None, max(peak1, peak2), _failure(text if code2 or not rate else text1))
    extra = _max_iter(solvers[1]) - _max_iter(solvers[0])
    return Run(rate, max(peak1, peak2), cpu_ms=(cpu2 - cpu1) * 1e3 / extra)


def _max_iter(solver: Path) -> int:
    return int(read_solver(solver).max_iter)


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


def solver_files(name: str, folder: Path, scratch: Path, *, iterations: int, warmup: int) -> tuple[Path, Path]:
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
    point_at_synthetic_data(net, scratch / "data", records=(warmup + 2 * iterations + 2) * batch, keep_batch=True)
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
    paths = []
    for n in (iterations, 2 * iterations):
        sp.max_iter = warmup + n
        sp.test_interval = sp.max_iter + 1
        paths.append(out / f"solver_{n}.prototxt")
        paths[-1].write_text(text_format.MessageToString(sp))
    return paths[0], paths[1]


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def tables(time_rows: list[Row], train_rows: list[Row]) -> str:
    def ratio(r: Row, what: str, invert: bool = False) -> str:
        c, d = r.median("caffe", what), r.median("ddl", what)
        return "-" if not c or not d else format(c / d if invert else d / c, ".2f")
    out = ["forward+backward, batch 1: median over rounds of each tool's Average Forward-Backward (wall ms) and of its "
           "CPU ms per iteration; peak MB (target: ddl / Caffe <= 0.8)",
           "| net | threads | Caffe ms | ddl-caffe ms | ddl / Caffe | Caffe CPU ms | ddl CPU ms | ddl / Caffe, CPU | "
           "Caffe peak MB | ddl peak MB | load |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in time_rows:
        out.append(f"| {r.what} | {r.threads} | {_fmt(r.median('caffe'), '.1f')} | {_fmt(r.median('ddl'), '.1f')} | "
                   f"{ratio(r, 'value')} | {_fmt(r.median('caffe', 'cpu_ms'), '.1f')} | {_fmt(r.median('ddl', 'cpu_ms'), '.1f')} | "
                   f"{ratio(r, 'cpu_ms')} | {r.peak('caffe'):.0f} | {r.peak('ddl'):.0f} | {r.load[0]:.1f}-{r.load[1]:.1f} |")
    out += ["", "solver throughput: median iterations/s after the warm-up (wall) and CPU ms per iteration; peak MB "
            "(target: ddl / Caffe >= 1.25)",
            "| solver | threads | Caffe it/s | ddl-caffe it/s | ddl / Caffe | Caffe CPU ms/it | ddl CPU ms/it | "
            "ddl / Caffe, per CPU second | Caffe peak MB | ddl peak MB | load |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in train_rows:
        out.append(f"| {r.what} | {r.threads} | {_fmt(r.median('caffe'), '.3f')} | {_fmt(r.median('ddl'), '.3f')} | "
                   f"{ratio(r, 'value')} | {_fmt(r.median('caffe', 'cpu_ms'), '.0f')} | {_fmt(r.median('ddl', 'cpu_ms'), '.0f')} | "
                   f"{ratio(r, 'cpu_ms', invert=True)} | {r.peak('caffe'):.0f} | {r.peak('ddl'):.0f} | {r.load[0]:.1f}-{r.load[1]:.1f} |")
    errors = [f"{r.what} ({r.threads} threads) {side}: {run.error}" for r in time_rows + train_rows
              for side in ("caffe", "ddl") for run in getattr(r, side) if run.error]
    if errors:
        out += ["", "failures:"] + [f"- {e}" for e in dict.fromkeys(errors)]
    return "\n".join(out) + "\n"


def as_json(time_rows: list[Row], train_rows: list[Row], meta: dict[str, Any]) -> dict[str, Any]:
    def row(r: Row) -> dict[str, Any]:
        c, d = r.median("caffe"), r.median("ddl")
        cc, dc = r.median("caffe", "cpu_ms"), r.median("ddl", "cpu_ms")
        return {"what": r.what, "threads": r.threads, "caffe": c, "ddl": d, "ddl_over_caffe": d / c if c and d else None,
                "caffe_cpu_ms": cc, "ddl_cpu_ms": dc, "ddl_over_caffe_cpu": dc / cc if cc and dc else None,
                "caffe_peak_mb": r.peak("caffe"), "ddl_peak_mb": r.peak("ddl"), "load": list(r.load),
                "caffe_runs": [r_.value for r_ in r.caffe], "ddl_runs": [r_.value for r_ in r.ddl],
                "caffe_cpu_runs": [r_.cpu_ms for r_ in r.caffe], "ddl_cpu_runs": [r_.cpu_ms for r_ in r.ddl],
                "errors": [x.error for x in r.caffe + r.ddl if x.error]}
    return {**meta, "time": [row(r) for r in time_rows], "train": [row(r) for r in train_rows]}


def run(peer: Peer, *, folder: Path | None, nets: list[str], solvers: list[str], threads: list[int], rounds: int,
        iterations: int, train_iterations: int | None, warmup: int, timeout: float, report: Any = print) -> tuple[list[Row], list[Row]]:
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
            solver_paths[s] = solver_files(s, folder, scratch, iterations=train_iterations or TRAIN_ITERATIONS[s], warmup=warmup)
        for t in threads:
            for n, model in models.items():
                row = Row(n, t)
                load0 = os.getloadavg()[0]
                count = iterations_for(peer, model, t, iterations, timeout)
                for k in range(rounds):
                    order = ("caffe", "ddl") if k % 2 == 0 else ("ddl", "caffe")
                    for tool in order:
                        getattr(row, tool).append(time_net(tool, peer, model, t, count, timeout))
                row.load = (load0, os.getloadavg()[0])
                time_rows.append(row)
                report(f"time {n} threads={t}: Caffe {_fmt(row.median('caffe'), '.1f')} ms, ddl {_fmt(row.median('ddl'), '.1f')} ms; "
                       f"CPU {_fmt(row.median('caffe', 'cpu_ms'), '.1f')} / {_fmt(row.median('ddl', 'cpu_ms'), '.1f')} ms")
            for s, path in solver_paths.items():
                row = Row(s, t)
                load0 = os.getloadavg()[0]
                for k in range(rounds):
                    order = ("caffe", "ddl") if k % 2 == 0 else ("ddl", "caffe")
                    for tool in order:
                        getattr(row, tool).append(train(tool, peer, path, t, warmup, timeout))
                row.load = (load0, os.getloadavg()[0])
                train_rows.append(row)
                report(f"train {s} threads={t}: Caffe {_fmt(row.median('caffe'), '.3f')} it/s, ddl {_fmt(row.median('ddl'), '.3f')} it/s; "
                       f"CPU {_fmt(row.median('caffe', 'cpu_ms'), '.0f')} / {_fmt(row.median('ddl', 'cpu_ms'), '.0f')} ms/it")
    return time_rows, train_rows
