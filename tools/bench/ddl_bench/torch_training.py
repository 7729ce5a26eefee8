"""``ddl bench torch``: training-step time of ddl.torch, DDP with gloo and no distribution.

With ``--zero`` ddl.torch with sharded optimizer state (``shard_optimizer_state=True``)
runs beside them, with its step time over the unsharded one's (``vs ddl``); ``--optimizer
adam`` trains with Adam, whose update the sharded mode divides among the ranks. With
``--memory`` it measures memory instead (:mod:`ddl_bench.torch_memory`).

Two models, an MLP of about 5 M parameters and a CNN whose single-process step computes
for about ``--cnn-step-ms``, are trained on synthetic batches at each world size in
``--ranks`` (default 1 and 2), one thread per process. ``--hook fp16,powersgd:4`` adds
ddl.torch with those communication hooks (``ddl.torch+HOOK``). Contenders run in interleaved
rounds so machine noise hits them alike; a round's time is the slowest rank's. Prints a
table with the step-time ratio ddl/DDP, the scaling efficiency (throughput at p ranks
over p times the throughput of one undistributed process) and ddl.torch against its
floor: the no-communication step plus one allreduce of the model's gradient bytes, both
measured in the same rounds. Writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ddl.launcher.relaunch import parse_rank_counts, relaunch
from ddl.tools.arg_types import amount, count
from ddl.tools.helptext import plain
from ddl_bench.reports import publish
from ddl_bench.torch_resnet import resnet50

CONTENDERS = ["none", "ddl.torch", "DDP-gloo"]
#: The sharded contender ``--zero`` adds.
ZERO = "ddl.torch-zero"
OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params, lr=1e-4),
}


def mlp() -> nn.Module:
    """About 4.7 M parameters."""
    return nn.Sequential(nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 1024), nn.ReLU(),
                         nn.Linear(1024, 512), nn.ReLU(), nn.Linear(512, 10))


def cnn() -> nn.Module:
    """A small VGG-style network on 3x32x32 inputs (about 0.6 M parameters)."""
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(128 * 4 * 4, 256), nn.ReLU(), nn.Linear(256, 10),
    )


MODELS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "mlp": (mlp, (1024,)),
    "cnn": (cnn, (3, 32, 32)),
    "resnet50": (resnet50, (3, 224, 224)),  # for --device cuda (a CPU step takes seconds)
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ddl bench torch", description=plain(__doc__))
    parser.add_argument("-np", "--ranks", dest="np", default="1,2", help="world sizes to run, e.g. 1,2")
    parser.add_argument("--models", default="mlp,cnn")
    parser.add_argument("--mlp-batch", type=count(), default=64, help="per rank")
    parser.add_argument("--cnn-batch", type=count(0), default=0, help="per rank; 0: tuned to --cnn-step-ms")
    parser.add_argument("--cnn-step-ms", type=amount, default=100.0)
    parser.add_argument("--rounds", type=count(), default=5)
    parser.add_argument("--steps", type=count(), default=8, help="timed steps per round and contender")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="where models train (cuda: every rank on GPU local_rank %% GPUs; ddl stages through "
                             "pinned host memory, DDP-gloo through host memory too)")
    parser.add_argument("--optimizer", default="sgd", choices=sorted(OPTIMIZERS),
                        help="sgd (with momentum) or adam")
    parser.add_argument("--zero", action="store_true",
                        help="also time ddl.torch with sharded optimizer state (shard_optimizer_state=True)")
    parser.add_argument("--memory", action="store_true",
                        help="measure optimizer-state bytes and peak RSS per rank, sharded and not, instead "
                             "(see python -m ddl_bench.torch_memory --help)")
    parser.add_argument("--hook", default="", metavar="LIST",
                        help="also time ddl.torch with these communication hooks, e.g. fp16,powersgd:4 (PowerSGD "
                             "from its first step; contenders ddl.torch+HOOK); auto[:HOOK]: compression=\"auto\" "
                             "(the hook only where it pays)")
    parser.add_argument("--out", default="bench-results")
    parser.add_argument("--worker", metavar="JSON", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args(argv)
    if args.memory:
        from ddl_bench.torch_memory import main as memory

        return memory(["--ranks", args.np, "--out", args.out, *rest])
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.worker:
        return _worker(args)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible here (torch.cuda.is_available() is False)")
    try:
        ranks = parse_rank_counts(args.np)
    except ValueError as exc:
        parser.error(str(exc))
    unknown = set(args.models.split(",")) - set(MODELS)
    if unknown:
        parser.error(f"unknown model(s) {sorted(unknown)}; choose from {sorted(MODELS)}")
    try:
        _hooks(args.hook)
    except ValueError as exc:
        parser.error(str(exc))
    runs: list[dict[str, Any]] = []
    batch = args.cnn_batch
    for p in ranks:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "result.json"
            proc = relaunch(p, ["-m", "ddl_bench.torch_training", "--worker", str(out), "--models", args.models, "--mlp-batch", str(args.mlp_batch),
                             "--cnn-batch", str(batch), "--cnn-step-ms", str(args.cnn_step_ms),
                                "--rounds", str(args.rounds), "--steps", str(args.steps), "--device", args.device,
                                "--optimizer", args.optimizer, *(["--zero"] if args.zero else []),
                                *(["--hook", args.hook] if args.hook else [])])
            if proc.returncode != 0 or not out.exists():
                print(f"ddl bench torch: the {p}-rank run failed (exit {proc.returncode})", file=sys.stderr)
                return 1
            result = json.loads(out.read_text())
        batch = result["batch"].get("cnn", batch)  # later world sizes reuse the tuned batch
        runs.append(result)
    report = summarize(runs)
    report["optimizer"] = args.optimizer
    report["load_average"] = list(os.getloadavg())
    publish(report, format_table(report), args.out, "torch.json")
    return 0


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per model, world size and contender: step time, throughput, efficiency, ddl/DDP."""
    rows = []
    base: dict[str, float] = {}
    for run in runs:
        for model, per in run["step_s"].items():
            if run["size"] == 1:
                base[model] = per["none"]
    for run in runs:
        p = run["size"]
        for model, per in run["step_s"].items():
            batch = run["batch"][model]
            for c in [c for c in [*CONTENDERS, ZERO] if c in per] + [c for c in per if c.startswith("ddl.torch+")]:
                t = per[c]
                rows.append({
                    "model": model, "params": run["params"][model], "ranks": p, "contender": c,
                    "batch_per_rank": batch, "step_ms": t * 1e3, "samples_per_s": p * batch / t,
                    "scaling_efficiency": base[model] / t if model in base else None,
                    "vs_ddp": t / per["DDP-gloo"],
                    "vs_floor": t / (per["none"] + run["allreduce_s"][model]) if c == "ddl.torch" and p > 1 else None,
                    "vs_ddl": t / per["ddl.torch"] if c == ZERO or c.startswith("ddl.torch+") else None,
                })
    return {"rows": rows, "threads_per_process": 1, "date": time.strftime("%Y-%m-%d"),
            "torch": torch.__version__}


def format_table(report: dict[str, Any]) -> str:
    head = (f"{'model':6} {'params':>8} {'ranks':>5} {'contender':22} {'batch':>5} {'step ms':>9} "
            f"{'samples/s':>10} {'efficiency':>10} {'vs DDP':>7} {'vs floor':>8} {'vs ddl':>7}")
    extra = "".join(f", {k} {report[k]}" for k in ("optimizer",) if k in report)
    load = report.get("load_average")
    lines = [f"training step, one thread per process (torch {report['torch']}{extra})"
             + (f"; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}" if load else ""), head]
    for r in report["rows"]:
        eff = "" if r["scaling_efficiency"] is None else f"{r['scaling_efficiency']:.3f}"
        floor = "" if r.get("vs_floor") is None else f"{r['vs_floor']:.3f}"
        vs_ddl = "" if r.get("vs_ddl") is None else f"{r['vs_ddl']:.3f}"
        lines.append(f"{r['model']:6} {r['params'] / 1e6:7.2f}M {r['ranks']:5d} {r['contender']:22} "
                     f"{r['batch_per_rank']:5d} {r['step_ms']:9.2f} {r['samples_per_s']:10.1f} {eff:>10} "
                     f"{r['vs_ddp']:7.3f} {floor:>8} {vs_ddl:>7}")
    lines.append("efficiency: throughput at p ranks / (p x one undistributed process); "
                 "vs DDP: step time / DDP-gloo step time; vs floor: ddl.torch's step / (the no-communication "
                 "step + one ddl.allreduce of the model's gradient bytes); vs ddl: the sharded (or hooked) step / the "
                 "unsharded ddl.torch step; all in the same rounds")
    return "\n".join(lines)


# -- the worker (one per rank, under ddlrun) ------------------------------------------
def _worker(args: argparse.Namespace) -> int:
    import torch.distributed as dist
    from mpi4py import MPI
    from torch.nn.parallel import DistributedDataParallel

    import ddl.torch as dt
    from ddl_bench.peers import free_port

    torch.set_num_threads(1)
    dt.init()
    device = torch.device("cuda", dt.local_rank() % torch.cuda.device_count()) if args.device == "cuda" \
        else torch.device("cpu")
    comm = MPI.COMM_WORLD.Dup()
    port = comm.bcast(free_port() if comm.Get_rank() == 0 else None, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=dt.rank(), world_size=dt.size())
    result: dict[str, Any] = {"size": dt.size(), "step_s": {}, "batch": {}, "params": {}, "allreduce_s": {},
                              "device": device.type}
    for name in args.models.split(","):
        build, shape = MODELS[name]
        batch = args.mlp_batch if name == "mlp" else args.cnn_batch
        if batch <= 0 and device.type == "cuda":
            batch = 32  # tuning times a CPU step; on a GPU take a common per-GPU batch
        if batch <= 0:
            batch = comm.bcast(_tune_batch(build, shape, args.cnn_step_ms) if dt.rank() == 0 else None, root=0)
        gen = torch.Generator().manual_seed(dt.rank())
        x = torch.randn(batch, *shape, generator=gen).to(device)
        y = torch.randint(0, 10, (batch,), generator=gen).to(device)
        steppers: dict[str, Callable[[], None]] = {}
        hooks = _hooks(args.hook)
        contenders = [*CONTENDERS, *([ZERO] if args.zero else []), *hooks]
        for c in contenders:
            torch.manual_seed(0)
            model = build().to(device)
            opt: torch.optim.Optimizer = OPTIMIZERS[args.optimizer](model.parameters())
            if c in ("ddl.torch", ZERO) or c in hooks:
                opt = dt.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                              shard_optimizer_state=c == ZERO, compression=hooks.get(c))
            elif c == "DDP-gloo":
                model = DistributedDataParallel(model)
            steppers[c] = _stepper(model, opt, x, y)
        grads = np.zeros(sum(p.numel() for p in build().parameters() if p.requires_grad), np.float32)
        flat = torch.from_numpy(grads)

        def allreduce_once(t: torch.Tensor = flat) -> None:  # the model's gradient bytes, one allreduce
            dt.allreduce_(t)

        steppers["allreduce"] = allreduce_once
        times: dict[str, list[float]] = {c: [] for c in steppers}
        for c in steppers:
            steppers[c]()  # warm-up: first-touch allocations, bucket rebuilds
        for r in range(args.rounds):
            order = [*contenders, "allreduce"]
            k = r % len(order)
            for c in order[k:] + order[:k]:  # rotate: no contender always goes first
                comm.Barrier()
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    steppers[c]()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                times[c].append(comm.allreduce((time.perf_counter() - t0) / args.steps, op=MPI.MAX))
        result["allreduce_s"][name] = statistics.median(times.pop("allreduce"))
        result["step_s"][name] = {c: statistics.median(v) for c, v in times.items()}
        result["batch"][name] = batch
        result["params"][name] = sum(p.numel() for p in build().parameters())
    dist.destroy_process_group()
    if dt.rank() == 0:
        Path(args.worker).write_text(json.dumps(result))
    dt.shutdown()
    return 0


def _hooks(text: str) -> dict[str, Any]:
    """``--hook``'s contenders, ``ddl.torch+HOOK`` -> the hook.

    Raises:
        ValueError: an unknown hook.
    """
    from ddl.tools.plan_hooks import parse_hook

    return {f"ddl.torch+{word}": parse_hook(word, "--hook") for word in text.split(",") if word}


def _stepper(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
    def step() -> None:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()  # type: ignore[no-untyped-call]
        opt.step()

    return step


def _tune_batch(build: Callable[[], nn.Module], shape: tuple[int, ...], target_ms: float) -> int:
    """The batch whose undistributed step takes about ``target_ms`` on one thread."""
    model = build()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = 8
    while True:
        x, y = torch.randn(batch, *shape), torch.randint(0, 10, (batch,))
        step = _stepper(model, opt, x, y)
        step()
        t0 = time.perf_counter()
        for _ in range(3):
            step()
        ms = (time.perf_counter() - t0) / 3 * 1e3
        if ms >= target_ms / 2 or batch >= 4096:
            return max(1, round(batch * target_ms / ms))
        batch *= 2


if __name__ == "__main__":
    raise SystemExit(main())
