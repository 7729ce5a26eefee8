"""Horovod's start-up recipe under mpiexec must train what one process trains.

The recipe: ``broadcast_parameters(model.state_dict())`` then
``broadcast_optimizer_state(opt)`` (and the scheduler's state by ``broadcast_object``),
then N ranks each train on B/N samples of every global batch. The reference is one
process on the whole batches, computed on every rank. Four starts, as real jobs have
them:

fresh             every rank builds its own model (different seeds) and a fresh optimizer
resumed-root      rank 0 alone loads a checkpoint taken after RESUME steps of the reference
resumed-all       rank 0 loads that checkpoint, the others an older one of their own
fresh-root        rank 0 is fresh, the others hold stale state from an old checkpoint

Each case prints ``RECIPE <optimizer> <start> ranks=<P> max_abs_diff=<d> identical=<yes|no>``
and fails unless d <= 1e-6 and every rank holds the same bytes.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import sys

import torch
from torch import nn

import ddl.torch as dt

torch.set_num_threads(1)
dt.init()
R, P = dt.rank(), dt.size()
B, STEPS, RESUME, STALE = 24, 15, 5, 3
TOLERANCE = 1e-6


DTYPE = torch.float32


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    layers = nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))
    return layers.to(DTYPE)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(500 + step)
    return torch.randn(B, 10, generator=g).to(DTYPE), torch.randn(B, 4, generator=g).to(DTYPE)


def make_optimizer(kind: str, model: nn.Module) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler | None]:
    if kind == "sgd-momentum-wd-steplr":
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
        return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    if kind == "adam":
        return torch.optim.Adam(model.parameters(), lr=0.01), None
    if kind == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01), None
    cls = getattr(torch.optim, kind)  # the sweep: every torch.optim class Horovod's test sweeps
    wanted = dict(lr=0.05, momentum=0.9, weight_decay=1e-3, centered=True)
    accepted = inspect.signature(cls.__init__).parameters
    params = [p for p in model.parameters() if p.ndim == 2 or kind != "Muon"]  # Muon takes matrices only
    return cls(params, **{k: v for k, v in wanted.items() if k in accepted}), None


def train_steps(model: nn.Module, opt: torch.optim.Optimizer, sched: object, steps: range, shard: bool) -> None:
    for step in steps:
        x, y = batch(step)
        if shard:
            n = B // P
            x, y = x[R * n : (R + 1) * n], y[R * n : (R + 1) * n]
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if sched is not None:
            sched.step()


def checkpoint(kind: str, steps: int, seed: int) -> dict[str, object]:
    """One process's model, optimizer and scheduler after ``steps`` steps from ``seed``."""
    model = make_model(seed)
    opt, sched = make_optimizer(kind, model)
    train_steps(model, opt, sched, range(steps), shard=False)
    return copy.deepcopy({"model": model.state_dict(), "opt": opt.state_dict(),
                          "sched": None if sched is None else sched.state_dict()})


def run(kind: str, start: str, steps: int, tolerance: float = TOLERANCE) -> None:
    root_resumes = start in ("resumed-root", "resumed-all")
    # The reference: one process from seed 0; where the root resumed, the same process
    # resumed from the same checkpoint (torch's load_state_dict casts some state, e.g.
    # NAdam's mu_product, to the parameters' dtype: a one-process resume does the same).
    ref = make_model(0)
    ref_opt, ref_sched = make_optimizer(kind, ref)
    if root_resumes:
        saved = checkpoint(kind, RESUME, seed=0)
        ref.load_state_dict(saved["model"])
        ref_opt.load_state_dict(saved["opt"])
        if ref_sched is not None:
            ref_sched.load_state_dict(saved["sched"])
    train_steps(ref, ref_opt, ref_sched, range(RESUME if root_resumes else 0, steps), shard=False)

    others_resume = start in ("resumed-all", "fresh-root")
    model = make_model(0 if R == 0 else 100 + R)
    opt, sched = make_optimizer(kind, model)
    saved = None
    if R == 0 and root_resumes:
        saved = checkpoint(kind, RESUME, seed=0)
    elif R != 0 and others_resume:
        saved = checkpoint(kind, STALE, seed=200 + R)  # another run's, older: must be replaced
    if saved is not None:
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        if sched is not None:
            sched.load_state_dict(saved["sched"])

    opt = dt.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    dt.broadcast_parameters(model.state_dict(), root_rank=0)
    dt.broadcast_optimizer_state(opt, root_rank=0)
    if sched is not None:
        sched.load_state_dict(dt.broadcast_object(sched.state_dict(), root_rank=0))
    first = RESUME if root_resumes else 0
    train_steps(model, opt, sched, range(first, steps), shard=True)

    diff = max((a - b).abs().max().item() for a, b in zip(model.parameters(), ref.parameters(), strict=True))
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    identical = len(set(dt.allgather_object(digest))) == 1
    print(f"RECIPE {kind} {start} ranks={P} max_abs_diff={diff:.3g} identical={'yes' if identical else 'no'}",
          flush=True)
    assert identical, f"{kind} {start}: the ranks hold different weights"
    assert diff <= tolerance, f"{kind} {start}: {diff:.3g} from one process (tolerance {tolerance})"


MAIN = ["sgd-momentum-wd-steplr", "adam", "adamw"]
STARTS = ["fresh", "resumed-root", "resumed-all", "fresh-root"]
# Horovod's own test sweeps every torch.optim class but LBFGS (needs a closure) and SparseAdam.
SWEEP = sorted(c.__name__ for c in torch.optim.Optimizer.__subclasses__()
               if c.__module__.startswith("torch.optim") and c.__name__ not in ("LBFGS", "SparseAdam"))

for kind in MAIN:
    for start in STARTS:
        run(kind, start, STEPS)
if "--sweep" in sys.argv:
    # In float64, so that rounding (centered RMSprop amplifies float32's to ~3e-6) cannot hide
    # a real difference (a dummy step or a lost state is >= 1e-4 here; centered RMSprop
    # amplifies float64 rounding to ~1e-11).
    DTYPE = torch.float64
    for kind in SWEEP:
        for start in ("resumed-root", "fresh-root"):
            run(kind, start, RESUME + 3, tolerance=1e-9)
print(f"PASS recipe rank {R}/{P} sweep={','.join(SWEEP) if '--sweep' in sys.argv else '-'}", flush=True)
dt.shutdown()
