"""``python -m tools.caffe.bench``: ddl-caffe vs the same layers in plain PyTorch, one thread, interleaved in one run.

Two tables: CIFAR-10 quick and the digits LeNet (``ddl-caffe time`` against a hand-written peer), and the zoo nets
(AlexNet, GoogLeNet, SqueezeNet 1.1, ResNet-50, MobileNet v1 from ``tools.caffe.zoo_nets``, forward+backward of the
train net) three ways: the solver's step (one autograd pass), ``ddl-caffe time`` (every layer's backward on its
own, as Caffe times it), and the plain-PyTorch peer of ``torch_peer``.

Caffe itself cannot be installed here, so its published times (issue 11: 186 ms CIFAR-10 quick,
0.80 ms digits LeNet, with PyTorch's own kernels at 132 ms on CIFAR-10 quick on that machine) are
carried over through the plain-PyTorch peer measured in the same run:
``estimated ratio to Caffe = (ours / peer) x peer_ms_there / caffe_ms_there`` for CIFAR-10 quick,
and for the LeNet ``ours / (caffe_ms x machine factor)`` with the factor from the CIFAR peer.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from ddl.caffe.command.cli import generate_inputs
from ddl.caffe.command.memory import reuse_freed_memory
from ddl.caffe.formats import schema
from ddl.caffe.formats.protofile import read_net
from ddl.caffe.net.layer_timing import LayerRunner, time_net
from ddl.caffe.net.net import Net

CAFFE_MS = {"cifar10_quick": 186.0, "digits_lenet": 0.80}
TORCH_MS_THERE = 132.0          # PyTorch's kernels on CIFAR-10 quick, same machine as CAFFE_MS


def _peer(net: Net, kind: str) -> Callable[[], None]:
    """The same layers as plain PyTorch code (NCHW, whole-graph backward): what a user would write."""
    vals = {t: v for la in net.layers if la.type == "Input" for t, v in zip(la.top, la.values, strict=True)}  # type: ignore[attr-defined]
    x, y = vals["data"], vals["label"].long()
    ws = [p.tensor.detach().clone().requires_grad_() for p in net.params]

    def cifar() -> None:
        h = F.conv2d(x, ws[0], ws[1], 1, 2)
        h = F.relu(F.max_pool2d(h, 3, 2, ceil_mode=True))
        h = F.avg_pool2d(F.relu(F.conv2d(h, ws[2], ws[3], 1, 2)), 3, 2, ceil_mode=True)
        h = F.avg_pool2d(F.relu(F.conv2d(h, ws[4], ws[5], 1, 2)), 3, 2, ceil_mode=True)
        h = F.linear(F.linear(h.reshape(h.shape[0], -1), ws[6], ws[7]), ws[8], ws[9])
        F.cross_entropy(h, y).backward()  # type: ignore[no-untyped-call]

    def lenet() -> None:
        h = F.max_pool2d(F.relu(F.conv2d(x, ws[0], ws[1])), 2, 2, ceil_mode=True)
        h = F.linear(F.relu(F.linear(h.reshape(h.shape[0], -1), ws[2], ws[3])), ws[4], ws[5])
        F.cross_entropy(h, y).backward()  # type: ignore[no-untyped-call]

    return cifar if kind == "cifar10_quick" else lenet


def _discard(_: object) -> None:
    """Drop a result (so a timed call fits ``Callable[[], None]``)."""


def _ms(fn: Callable[[], None], iters: int) -> float:
    # CPU time of this process: with one thread it is the work done, and a shared machine that
    # deschedules us (load averages of 5-10 on two cores) does not count against either side.
    t0 = time.process_time()
    for _ in range(iters):
        fn()
    return (time.process_time() - t0) * 1e3 / iters


def measure(model: Path, kind: str, *, rounds: int, iters: int) -> dict[str, float]:
    net = Net(read_net(model), schema.TRAIN, gen=torch.Generator().manual_seed(1), quiet=True)
    generate_inputs(net, torch.Generator().manual_seed(2))
    peer = _peer(net, kind)
    ours, theirs = [], []
    peer()
    time_net(net, 1)
    runner = LayerRunner(net)
    zeros = [0.0] * len(net.layers)
    for _ in range(rounds):                       # interleaved, so load changes hit both alike
        ours.append(_ms(lambda: _discard(runner.iteration(zeros[:], zeros[:])), iters))
        theirs.append(_ms(peer, iters))
    o, p = statistics.median(ours), statistics.median(theirs)
    return {"ddl_caffe_ms": o, "torch_peer_ms": p, "ratio_to_peer": o / p}


# One thread, forward+backward, as measured beside ddl-caffe for issue 19 (ms; AlexNet, GoogLeNet, SqueezeNet and
# ResNet-50 at batch 1, MobileNet v1 likewise).
CAFFE_ZOO_MS = {"alexnet": 149.0, "googlenet": 191.0, "squeezenet1.1": 49.0, "resnet50": 461.0, "mobilenet_v1": 159.0}


def measure_zoo(name: str, batch: int, *, rounds: int, iters: int) -> dict[str, float]:
    """Median ms per forward+backward: the solver's step, ``time``'s per-layer run, and the plain-PyTorch peer."""
    from ddl.caffe.export.onnx_export import sample_inputs
    from tools.caffe import zoo_nets
    from tools.caffe.torch_peer import peer
    net = Net(read_net_text(zoo_nets.train_val(zoo_nets.NETS[name](batch))), schema.TRAIN, gen=torch.Generator().manual_seed(1), quiet=True)
    feeds = sample_inputs(net)
    for la in net.layers:
        if la.type == "Input":
            la.values = [feeds[t] for t in la.top]            # type: ignore[attr-defined]
    runner = LayerRunner(net)
    n = len(net.layers)

    def step() -> None:
        loss, _ = net.forward()
        loss.backward()                                      # type: ignore[no-untyped-call]
        for p in net.params:
            p.tensor.grad = None

    def timed() -> None:
        runner.iteration([0.0] * n, [0.0] * n)
        for p in net.params:
            p.tensor.grad = None
    plain = peer(net, feeds)
    fns = {"step_ms": step, "time_ms": timed, "peer_ms": plain}
    for fn in fns.values():
        fn()
    res: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):                                  # interleaved: load changes hit all three alike
        for k, fn in fns.items():
            res[k].append(_ms(fn, iters))
    out = {k: statistics.median(v) for k, v in res.items()}
    out["step_vs_peer"] = out["step_ms"] / out["peer_ms"]
    out["time_vs_peer"] = out["time_ms"] / out["peer_ms"]
    return out


def read_net_text(text: str) -> object:
    from ddl.caffe.formats.protofile import parse_text
    return parse_text(text, schema.NetParameter())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.caffe.bench", description=__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=0, help="iterations per round (default: 5 CIFAR, 200 LeNet)")
    ap.add_argument("--threads", default="1", help="thread counts, e.g. 1,2 (with --peer: each; else the first)")
    ap.add_argument("--peer", default="", help="a BVLC Caffe build (build-caffe.sh SRC DEST: DEST): time and train against it")
    ap.add_argument("--dir", default="", help="with --peer: a zoo folder with the nets' and solvers' published files")
    ap.add_argument("--caffe-core", default="auto",
                    help="with --peer: OPENBLAS_CORETYPE for Caffe (auto: this CPU's real core, e.g. SkylakeX for "
                         "AVX-512; '' leaves OpenBLAS to detect, which Debian 12's 0.3.21 may get wrong)")
    ap.add_argument("--solvers", default="cifar10_full,googlenet_quick", help="with --peer: solvers to train ('' for none)")
    ap.add_argument("--train-iterations", type=int, default=0, help="with --peer: timed solver iterations (default: 30 CIFAR-10, 3 GoogLeNet)")
    ap.add_argument("--warmup", type=int, default=2, help="with --peer: solver iterations before the timed ones")
    ap.add_argument("--timeout", type=float, default=1800, help="with --peer: seconds per process")
    ap.add_argument("--json", default="caffe_bench.json")
    ap.add_argument("--examples", default="examples/caffe")
    ap.add_argument("--nets", default="",
                    help="zoo nets to measure ('' for the default: five against PyTorch, eight against --peer)")
    ap.add_argument("--batches", default="1,4", help="batch sizes for the zoo nets")
    ap.add_argument("--zoo-only", action="store_true", help="skip CIFAR-10 quick and LeNet")
    ap.add_argument("--caffemodel", default="", help="only time writing and reading this zoo net's .caffemodel (e.g. vgg16)")
    ap.add_argument("--protobuf", action="store_true", help="with --caffemodel: also time the same file written by protobuf")
    a = ap.parse_args(argv)
    if a.peer:
        return against_caffe(a)
    a.nets = a.nets or "alexnet,googlenet,squeezenet1.1,resnet50,mobilenet_v1"
    a.threads = int(a.threads.split(",")[0])
    reuse_freed_memory()               # as ddl-caffe's commands do; the peer runs in this process too
    if a.caffemodel:
        from tools.caffe.bench_files import measure as measure_files
        r = measure_files(a.caffemodel, rounds=a.rounds, protobuf=a.protobuf)
        print(f"{a.caffemodel}.caffemodel {r['file_mb']:.0f} MB: write {r['write_s']:.2f} s (+{r['write_extra_mb']:.0f} MB), "
              f"read {r['read_s']:.2f} s (+{r['read_extra_mb']:.0f} MB), cp of the file {r['cp_s']:.2f} s; write/read "
              f"{r['write_over_read']:.2f}, write/cp {r['write_over_cp']:.2f}, "
              f"write extra / file {r['write_extra_over_file']:.2f}; load {os.getloadavg()[0]:.1f}"
              + (f"; protobuf write {r['protobuf_write_s']:.2f} s (+{r['protobuf_write_extra_mb']:.0f} MB)" if a.protobuf else ""))
        Path(a.json).write_text(json.dumps({"caffemodel": a.caffemodel, **r}, indent=2))
        return 0
    torch.set_num_threads(a.threads)
    logging.getLogger("ddl.caffe").setLevel(logging.WARNING)
    ex = Path(a.examples)
    res: dict[str, dict[str, float]] = {}
    zoo: dict[str, dict[str, float]] = {}
    for name in [n for n in a.nets.split(",") if n]:
        for b in [int(x) for x in a.batches.split(",") if x]:
            zoo[f"{name}@{b}"] = measure_zoo(name, b, rounds=a.rounds, iters=a.iters or 2)
    if zoo:
        print(f"threads={a.threads} rounds={a.rounds}: forward+backward CPU ms (median), ratio to the plain-PyTorch peer")
        print(f"{'net@batch':<18}{'step ms':>10}{'time ms':>10}{'peer ms':>10}{'step/peer':>11}{'time/peer':>11}")
        for key, r in zoo.items():
            print(f"{key:<18}{r['step_ms']:>10.1f}{r['time_ms']:>10.1f}{r['peer_ms']:>10.1f}{r['step_vs_peer']:>11.2f}{r['time_vs_peer']:>11.2f}")
    if a.zoo_only:
        Path(a.json).write_text(json.dumps({"threads": a.threads, "zoo": zoo}, indent=2))
        return 0
    for kind, file, iters in (("cifar10_quick", "cifar10_quick_time.prototxt", 5), ("digits_lenet", "digits_lenet_time.prototxt", 200)):
        res[kind] = measure(ex / file, kind, rounds=a.rounds, iters=a.iters or iters)
    factor = res["cifar10_quick"]["torch_peer_ms"] / TORCH_MS_THERE          # this machine vs the issue's
    res["cifar10_quick"]["est_ratio_to_caffe"] = res["cifar10_quick"]["ratio_to_peer"] * TORCH_MS_THERE / CAFFE_MS["cifar10_quick"]
    res["digits_lenet"]["est_ratio_to_caffe"] = res["digits_lenet"]["ddl_caffe_ms"] / (CAFFE_MS["digits_lenet"] * factor)
    print(f"threads={a.threads} rounds={a.rounds} machine factor (peer CIFAR ms / {TORCH_MS_THERE:g}) = {factor:.2f}")
    print(f"{'net':<15}{'ddl-caffe ms':>14}{'torch peer ms':>15}{'ratio':>8}{'est. vs Caffe':>15}{'target':>8}")
    for kind, target in (("cifar10_quick", 0.8), ("digits_lenet", 1.5)):
        r = res[kind]
        print(f"{kind:<15}{r['ddl_caffe_ms']:>14.3f}{r['torch_peer_ms']:>15.3f}{r['ratio_to_peer']:>8.2f}{r['est_ratio_to_caffe']:>15.2f}{target:>8.2f}")
    if zoo:
        print(f"estimated ratio to Caffe (issue 19's one-thread figures x machine factor {factor:.2f}; batch 1):")
        for name, caffe_ms in CAFFE_ZOO_MS.items():
            z = zoo.get(f"{name}@1")
            if z:
                print(f"  {name:<14} step {z['step_ms'] / (caffe_ms * factor):.2f}  time {z['time_ms'] / (caffe_ms * factor):.2f}")
    Path(a.json).write_text(json.dumps({"threads": a.threads, "machine_factor": factor, **res, "zoo": zoo}, indent=2))
    return 0


def against_caffe(a: argparse.Namespace) -> int:
    """``--peer``: forward+backward and solver throughput against real Caffe (see ``tools.caffe.bench_caffe``)."""
    import platform
    import subprocess

    from tools.caffe import bench_caffe
    from tools.caffe.real_caffe import Peer, PeerError, best_core, ddl_side
    core = best_core() if a.caffe_core == "auto" else (a.caffe_core or None)
    peer = Peer(Path(a.peer), core=core)
    try:
        peer.check(pycaffe=False)
    except PeerError as e:
        print(f"tools.caffe.bench: {e}")
        return 2
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    nets = [n for n in (a.nets or ",".join(bench_caffe.NET_FILES)).split(",") if n]
    threads = [int(t) for t in a.threads.split(",") if t]
    caffe_core, ddl_kernels = peer.blas_core(), ddl_side()
    print(f"peer: {peer.version()}; {platform.node()}; {os.cpu_count()} CPUs; before: {uptime}", flush=True)
    print(f"Caffe's OpenBLAS core: {caffe_core} (OPENBLAS_CORETYPE={core or 'unset: detected'}); ddl-caffe: "
          f"{ddl_kernels}", flush=True)
    time_rows, train_rows = bench_caffe.run(
        peer, folder=Path(a.dir) if a.dir else None, nets=nets, solvers=[s for s in a.solvers.split(",") if s],
        threads=threads, rounds=a.rounds, iterations=a.iters or 3, train_iterations=a.train_iterations or None, warmup=a.warmup,
        timeout=a.timeout, report=lambda line: print(line, flush=True))
    after = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print()
    print(bench_caffe.tables(time_rows, train_rows))
    print(f"load: before {uptime}; after {after}")
    print(f"Caffe's OpenBLAS core: {caffe_core}; ddl-caffe: {ddl_kernels}")
    out = Path(a.json if a.json != "caffe_bench.json" else "bench-results/caffe_vs_bvlc.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(bench_caffe.as_json(time_rows, train_rows, {
        "peer": peer.version(), "caffe_openblas_core": caffe_core, "ddl_kernels": ddl_kernels, "threads": threads,
        "rounds": a.rounds, "uptime_before": uptime, "uptime_after": after}), indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
