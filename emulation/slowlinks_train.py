"""One rank of ``python -m emulation.slowlinks``: train to a held-out accuracy with one way of communicating.

A 4.35 M-parameter MLP (64-2048-2048-10) learns scikit-learn's bundled 8x8 digits (1437
train, 360 held out; nothing downloaded). Each rank draws its batches from its own
shard. Modes: ``sync`` (``DistributedOptimizer``, plain or ``--compression fp16``),
``powersgd`` (``DistributedOptimizer(compression=ddl.PowerSGD(rank=R))``), ``localsgd`` and
``diloco`` (period H, pseudo-gradients plain, fp16 or PowerSGD, optionally overlapped).

Rank 0 evaluates the held-out accuracy every ``--eval-every`` steps (periodic modes: at
their outer steps) on its own weights, on a clock that stops while it evaluates. Each
rank reads its own link's byte counters (it runs inside its emulated host's network
namespace) at the start and the end of training. Before training every rank times the
step without communication with the mode's own optimizer (``compute_ms``: the slowest
rank's, step by step; again after training), and, for ``ddl plan``, the rates of the
hooks' own operations at the model's shapes (:mod:`ddl.tools.plan_rates`: PowerSGD's
three products through torch's matmul, the error-feedback passes, the fp16 casts) and an
engine round's cost besides its allreduce (``cycle_s``); for the table's attribution, the
hook's whole work per step with the link taken out (``hook_ms``), the engine's cycles and
forward+backward's time per steady step. Rank 0 writes everything to ``--out``.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import ddl
import ddl.torch as dt
from ddl.reduction.probes import median_time
from ddl.runtime import running


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m emulation.slowlinks_train", description=__doc__)
    p.add_argument("--mode", choices=("sync", "powersgd", "localsgd", "diloco"), required=True)
    p.add_argument("--compression", default="none", help="sync: the wire compression (none, fp16, bf16)")
    p.add_argument("--rank", type=int, default=4, help="powersgd: the approximation rank")
    p.add_argument("--start-iter", type=int, default=10, help="powersgd: plain steps first")
    p.add_argument("--period", type=int, default=20, help="localsgd/diloco: inner steps per outer step")
    p.add_argument("--pseudo", default="none", help="localsgd/diloco: none, fp16, bf16 or powersgd:R")
    p.add_argument("--overlap", type=int, default=0, help="localsgd/diloco: inner steps the average may take")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--batch", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.05, help="SGD (momentum 0.9): sync, powersgd, localsgd")
    p.add_argument("--inner-lr", type=float, default=1e-3, help="diloco: AdamW's")
    p.add_argument("--outer-lr", type=float, default=0.7, help="diloco: Nesterov SGD's (momentum 0.9)")
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--schedule", choices=("cosine", "constant"), default="cosine",
                   help="the (inner) learning rate over --steps: cosine decay to 0, or constant")
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    return p


def model_factory(width: int = 2048) -> nn.Module:
    """The benchmark's MLP (64-2048-2048-10: 4,349,962 parameters at the default width)."""
    return nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))


def digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """scikit-learn's digits: 1437 training and 360 held-out images, the same split everywhere."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data / 16.0, dtype=torch.float32)
    y = torch.tensor(d.target, dtype=torch.int64)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(1234))
    test, train = order[:360], order[360:]
    return x[train], y[train], x[test], y[test]


def link_bytes() -> tuple[int, int]:
    """(sent, received) bytes of this network namespace's interfaces but loopback."""
    tx = rx = 0
    for dev in Path("/sys/class/net").iterdir():
        if dev.name == "lo":
            continue
        tx += int((dev / "statistics" / "tx_bytes").read_text())
        rx += int((dev / "statistics" / "rx_bytes").read_text())
    return tx, rx


def hook_of(text: str) -> Any:
    if text.startswith("powersgd"):
        _, _, r = text.partition(":")
        return ddl.PowerSGD(rank=int(r or 4), start_iter=0)
    return text


def build_optimizer(args: argparse.Namespace, model: nn.Module) -> Any:
    sgd = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    if args.mode == "sync":
        return dt.DistributedOptimizer(sgd, named_parameters=model.named_parameters(), compression=args.compression)
    if args.mode == "powersgd":
        hook = ddl.PowerSGD(rank=args.rank, start_iter=args.start_iter)
        return dt.DistributedOptimizer(sgd, named_parameters=model.named_parameters(), compression=hook)
    if args.mode == "localsgd":
        return dt.LocalSGD(sgd, period=args.period, compression=hook_of(args.pseudo), overlap=args.overlap)
    inner = torch.optim.AdamW(model.parameters(), lr=args.inner_lr, weight_decay=0.0)
    outer = torch.optim.SGD(model.parameters(), lr=args.outer_lr, momentum=0.9, nesterov=True)
    return dt.DiLoCo(model, inner, outer, period=args.period, compression=hook_of(args.pseudo), overlap=args.overlap)


def rates(args: argparse.Namespace, shapes: list[tuple[int, ...]]) -> dict[str, float]:
    """The rates ``ddl plan`` prices the hooks' own work at, timed on this core at the model's
    shapes through the kernels the hooks use (:mod:`ddl.tools.plan_rates`)."""
    from ddl.tools import plan_rates

    elements = plan_rates.model_elements(shapes)
    return {"flop_rate": plan_rates.product_rate(ddl.PowerSGD(rank=args.rank), shapes, matmul=dt.kernels.matmul),
            "memory_rate": plan_rates.pass_rate(elements), "cast_rate": plan_rates.cast_rate(elements)}


def cycle_seconds() -> float:
    """One engine round with nothing to reduce but its negotiation: a one-element allreduce
    through the engine (it rides in the cycle's records), timed back to back after a barrier."""
    one = np.ones(1, np.float32)
    ddl.allreduce(one, name="slowlinks.cycle")
    dt.barrier()
    times = []
    for _ in range(15):
        t0 = time.perf_counter()
        ddl.allreduce(one, name="slowlinks.cycle")
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


class _Local:
    """A submitter whose allreduce is this rank's own values: a hook's work without the link."""

    def allreduce_async(self, x: Any, **_: Any) -> Any:
        return x


def hook_work_ms(args: argparse.Namespace, shapes: list[tuple[int, ...]]) -> float | None:
    """This rank's own hook work per step, timed on ``ddl.torch``'s buckets of ``shapes`` with
    the link taken out (PowerSGD's products, QR and passes; a compressor's two casts): what
    the plan's hook column is checked against."""
    from ddl.base import kernels
    from ddl.engine.hooks import GradBucket
    from ddl.reduction.buckets import (
        BUCKET_BYTES,
        FIRST_BUCKET_BYTES,
        FLAGS_PER_TENSOR,
        gradient_buckets,
    )

    numels = [math.prod(s) for s in shapes]
    buckets = gradient_buckets(numels, [4] * len(numels), first_cap=FIRST_BUCKET_BYTES, cap=BUCKET_BYTES)
    layouts = [tuple(shapes[i] for i in b.members) + ((FLAGS_PER_TENSOR * len(b.members),),) for b in buckets]
    rng = np.random.default_rng(1)
    grads = [(rng.standard_normal(sum(math.prod(s) for s in lay)) * 1e-3).astype(np.float32) for lay in layouts]
    if args.mode == "powersgd":
        hook = ddl.PowerSGD(rank=args.rank, start_iter=0)
        state = hook.new_state()
        bufs = [g.copy() for g in grads]

        def run() -> None:
            for k, (lay, g, b) in enumerate(zip(layouts, grads, bufs, strict=True)):
                b[...] = g
                hook(state, GradBucket(k, f"b{k}", b, lay, ddl.Average, _Local(), matmul=dt.kernels.matmul)).wait()
        copy_s = _median(lambda: [np.copyto(b, g) for g, b in zip(grads, bufs, strict=True)])
        return max(0.0, _median(run) - copy_s) * 1e3
    wire = {"fp16": np.float16}.get(args.compression if args.mode == "sync" else args.pseudo)
    if wire is None:
        return None
    halves = [np.empty(g.size, wire) for g in grads]

    def casts() -> None:
        for g, h in zip(grads, halves, strict=True):
            kernels.divide_into(h, g, dt.size())
            kernels.cast_into(g, h)
    return _median(casts) * 1e3


def _median(fn: Any, repeats: int = 5) -> float:
    return median_time(fn, repeats, None, math.inf)


def main() -> int:
    args = parser().parse_args()
    dt.init()
    torch.set_num_threads(1)  # one core per rank: the emulated hosts share the machine
    rank, size = dt.rank(), dt.size()
    xtr, ytr, xte, yte = digits()
    shard = torch.arange(rank, len(ytr), size)
    torch.manual_seed(args.seed)
    model = model_factory(args.width)
    loss_fn = nn.functional.cross_entropy

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(args.seed * 100003 + step * 101 + rank)
        idx = shard[torch.randint(len(shard), (args.batch,), generator=g)]
        return xtr[idx], ytr[idx]

    # The step without communication, on a copy, every rank at once as in training: a
    # synchronous step waits for the slowest rank, so each step's time is the slowest's.
    # The step's own optimizer (DiLoCo's inner AdamW makes more passes than SGD), with lr 0.
    alone = copy.deepcopy(model)
    alone_opt = (torch.optim.AdamW(alone.parameters(), lr=0.0, weight_decay=0.0) if args.mode == "diloco"
                 else torch.optim.SGD(alone.parameters(), lr=0.0, momentum=0.9))

    def compute_alone() -> float:
        mine = []
        for step in range(14):
            x, y = batch(step)
            dt.barrier()
            t0 = time.perf_counter()
            alone_opt.zero_grad()
            loss_fn(alone(x), y).backward()
            alone_opt.step()
            mine.append(time.perf_counter() - t0)
        slowest = np.max(np.array(dt.allgather_object(mine[2:])), axis=0)
        return float(np.median(slowest)) * 1e3

    compute_ms = compute_alone()
    shapes = [tuple(p.shape) for p in model.parameters()]
    dt.barrier()
    probed = rates(args, shapes)
    dt.barrier()
    hook_ms = hook_work_ms(args, shapes)
    cycle_s = cycle_seconds()
    if hook_ms is not None and args.mode in ("localsgd", "diloco"):
        hook_ms /= args.period  # one round's work a period: per step

    dt.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = build_optimizer(args, model)
    periodic = args.mode in ("localsgd", "diloco")
    eval_every = args.period if periodic else args.eval_every
    scheduled = opt.optimizer if args.mode == "diloco" else opt
    scheduler = None
    if args.schedule == "cosine":
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            scheduled, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, args.steps) / args.steps)))
    # Steady state, where bytes and step times are compared with ddl plan: after PowerSGD's plain
    # steps and the first step's set-up; whole periods for local SGD and DiLoCo.
    if periodic:
        steady = (args.period, args.steps - args.steps % args.period)
    else:
        steady = ((args.start_iter if args.mode == "powersgd" else 0) + 1, args.steps)
    if not steady[0] < steady[1]:
        raise SystemExit(f"--steps {args.steps} leaves no steady steps (from {steady[0]} to {steady[1]})")

    def evaluate() -> float:
        with torch.no_grad():
            return float((model(xte).argmax(1) == yte).float().mean())

    curve: list[tuple[int, float, float]] = [(0, 0.0, evaluate())]
    step_times: list[float] = []
    backward_s: list[float] = []
    engine = running.engine()
    dt.barrier()
    counters0 = link_bytes()
    clock = 0.0
    steady_counters = [counters0, counters0]
    steady_cycles = 0
    for step in range(args.steps):
        x, y = batch(10_000 + step)
        if step == steady[0]:
            steady_counters[0] = link_bytes()
            steady_cycles = engine.cycles
        t0 = time.perf_counter()
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        t1 = time.perf_counter()
        opt.step()
        if scheduler is not None:
            scheduler.step()
        spent = time.perf_counter() - t0
        backward_s.append(t1 - t0)  # forward and backward, with the hooks' work started in it
        if step + 1 == steady[1]:
            steady_counters[1] = link_bytes()
            steady_cycles = engine.cycles - steady_cycles
        step_times.append(spent)
        clock += spent
        if rank == 0 and ((step + 1) % eval_every == 0 or step + 1 == args.steps):
            curve.append((step + 1, clock, evaluate()))
            print(f"step {step + 1:4d}  {clock:8.2f} s  held-out accuracy {curve[-1][2]:.4f}", flush=True)
    if periodic:
        t0 = time.perf_counter()
        opt.synchronize()  # every rank to the same weights (a round if steps were left over)
        clock += time.perf_counter() - t0
    counters1 = link_bytes()
    compute_after_ms = compute_alone()  # the same probe after training: how far the machine's load moved it
    moved = (counters1[0] - counters0[0], counters1[1] - counters0[1])
    final = evaluate()
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    spread = float((dt.allgather(weights[None]) - weights).abs().max())  # 0: identical replicas
    steady_moved = [b - a for a, b in zip(steady_counters[0], steady_counters[1], strict=True)]
    everyone = dt.allgather_object({"rank": rank, "host": os.uname().nodename, "link_bytes": moved,
                                    "steady_link_bytes": steady_moved,
                                    "compute_ms": compute_ms, "compute_after_ms": compute_after_ms, **probed,
                                    "hook_ms": hook_ms, "steady_cycles": steady_cycles, "cycle_s": cycle_s,
                                    "steady_backward_s": statistics.fmean(backward_s[steady[0]:steady[1]]),
                                    "mean_step_s": statistics.fmean(step_times)})
    if rank == 0:
        stats = opt.compression_stats() if args.mode == "powersgd" else None
        record = {"args": vars(args), "ranks": size, "parameters": sum(p.numel() for p in model.parameters()),
                  "shapes": [list(p.shape) for p in model.parameters()], "curve": curve, "train_seconds": clock,
                  "step_times": step_times, "steady": steady, "final_accuracy": final, "replica_spread": spread, "per_rank": everyone,
                  "compression_stats": stats, "load_average": os.getloadavg()}
        Path(args.out).write_text(json.dumps(record, indent=1))
        print(f"done: {args.steps} steps in {clock:.1f} s, final held-out accuracy {final:.4f}, replicas differ by "
              f"{spread:g}", flush=True)
    dt.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
