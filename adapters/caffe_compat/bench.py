"""``python -m ddl.caffe.bench``: ``ddl-caffe time`` vs the same layers in plain PyTorch, one thread, interleaved.

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
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from . import schema
from .cli import _generate_inputs
from .net import Net
from .textio import read_net
from .timing import time_net

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


def _ms(fn: Callable[[], None], iters: int) -> float:
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) * 1e3 / iters


def measure(model: Path, kind: str, *, rounds: int, iters: int) -> dict[str, float]:
    net = Net(read_net(model), schema.TRAIN, gen=torch.Generator().manual_seed(1), quiet=True)
    _generate_inputs(net, torch.Generator().manual_seed(2))
    peer = _peer(net, kind)
    ours, theirs = [], []
    peer()
    time_net(net, 1)
    for _ in range(rounds):                       # interleaved, so load changes hit both alike
        ours.append(time_net(net, iters)["total_ms"])
        theirs.append(_ms(peer, iters))
    o, p = statistics.median(ours), statistics.median(theirs)
    return {"ddl_caffe_ms": o, "torch_peer_ms": p, "ratio_to_peer": o / p}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ddl.caffe.bench", description=__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=0, help="iterations per round (default: 5 CIFAR, 200 LeNet)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default="caffe_bench.json")
    ap.add_argument("--examples", default="examples/caffe")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    logging.getLogger("ddl.caffe").setLevel(logging.WARNING)
    ex = Path(a.examples)
    res = {}
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
    Path(a.json).write_text(json.dumps({"threads": a.threads, "machine_factor": factor, **res}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
