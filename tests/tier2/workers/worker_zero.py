"""Sharded optimizer state (ZeRO-1) in ddl.torch under mpiexec: N ranks train what one process trains.

Each case trains a reference in one process on whole batches and the same model on N ranks
with ``shard_optimizer_state=True`` on B/N samples each, then prints
``ZERO <case> ranks=<P> max_abs_diff=<d> identical=<yes|no>`` and fails unless d <= 1e-6
and every rank holds the same bytes (sha256). Besides the four optimizers of the issue:
the drop-in ZeroRedundancyOptimizer, synchronize() with clipping, gradient accumulation,
a group added mid-run (its state moves to new owners), consolidation against one
process's state_dict, and Horovod's recipe with a checkpoint only the root loaded.
"""

from __future__ import annotations

import copy
import hashlib
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

import ddl.torch as dt

torch.set_num_threads(1)
if "--checkpoint" in sys.argv:
    # Elastic commits without ddlrun --elastic: TorchState keeps them in this store across the
    # runs at 4, 3, 2 and 1 ranks (one host: one writer, one whole copy).
    os.environ.setdefault("DDL_ELASTIC_STORE", os.path.join(sys.argv[sys.argv.index("--checkpoint") + 1], "store"))
dt.init()
R, P = dt.rank(), dt.size()
B, STEPS = 24, 12
SAVED_AT = 5  # the step a checkpoint is taken after
TOLERANCE = 1e-6


class Net(nn.Module):
    """Tensors of many sizes (so every rank owns some), a frozen layer, a tied pair, a head
    only some samples use and an embedding with sparse gradients."""

    def __init__(self, sparse: bool = False) -> None:
        super().__init__()
        self.emb = nn.Embedding(12, 6, sparse=sparse)
        self.frozen = nn.Linear(6, 6)
        self.frozen.requires_grad_(False)
        self.a = nn.Linear(6, 32)
        self.b = nn.Linear(32, 16)
        self.c = nn.Linear(16, 16)
        self.d = nn.Linear(16, 16)
        self.d.weight = self.c.weight  # tied
        self.head = nn.Linear(16, 4)
        self.rare = nn.Linear(16, 4)  # used only by samples with token 0
        self.extra = nn.Linear(16, 4)  # joins the optimizer mid-run in one case

    def forward(self, tok: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(torch.tanh(self.frozen(self.emb(tok)))))
        h = torch.relu(self.d(torch.relu(self.c(torch.relu(self.b(h))))))
        out = self.head(h) + self.extra(h)
        use = tok == 0
        if bool(use.any()):
            out = out + torch.where(use[:, None], self.rare(h), torch.zeros_like(out))
        return out


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    tok = torch.randint(1, 12, (B,), generator=g)
    if step % 3 == 0:
        tok[5] = 0  # the rare head: used on one rank only, at some steps
    return tok, torch.randn(B, 4, generator=g)


def local(x: torch.Tensor) -> torch.Tensor:
    n = B // P
    return x[R * n : (R + 1) * n]


OPTIMIZERS: dict[str, Callable[[list[dict[str, object]]], torch.optim.Optimizer]] = {
    "sgd-momentum-wd": lambda g: torch.optim.SGD(g, lr=0.05, momentum=0.9, weight_decay=1e-3),
    "adam": lambda g: torch.optim.Adam(g, lr=0.01),
    "adamw": lambda g: torch.optim.AdamW(g, lr=0.01, weight_decay=0.05),
    "adagrad": lambda g: torch.optim.Adagrad(g, lr=0.05),
}


def groups(model: Net, *, extra: bool = True) -> list[dict[str, object]]:
    """Two groups with different hyperparameters (the head trains slower)."""
    head = [model.head.weight, model.head.bias]
    rest = [p for n, p in model.named_parameters() if not n.startswith(("head", "extra"))]
    out: list[dict[str, object]] = [{"params": rest}, {"params": head, "lr": 0.003}]
    if extra:
        out[0]["params"] = rest + [model.extra.weight, model.extra.bias]  # type: ignore[operator]
    return out


def train(model: Net, opt: torch.optim.Optimizer, steps: range, *, sharded: bool, clip: bool = False,
          passes: int = 1, before_step: Callable[[int], None] | None = None) -> None:
    for step in steps:
        if before_step is not None:
            before_step(step)
        tok, y = batch(step)
        if sharded:
            tok, y = local(tok), local(y)
        opt.zero_grad()
        for k in range(passes):
            part = slice(k * len(tok) // passes, (k + 1) * len(tok) // passes)
            (nn.functional.mse_loss(model(tok[part]), y[part]) / passes).backward()
        if clip:
            if sharded:
                opt.synchronize()  # type: ignore[attr-defined]
            nn.utils.clip_grad_norm_(model.parameters(), 0.05)
            if sharded:
                with opt.skip_synchronize():  # type: ignore[attr-defined]
                    opt.step()
                continue
        opt.step()


def report(case: str, model: nn.Module, ref: nn.Module) -> None:
    diff = max((a - b).abs().max().item() for a, b in zip(model.parameters(), ref.parameters(), strict=True))
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    identical = len(set(dt.allgather_object(digest))) == 1
    print(f"ZERO {case} ranks={P} max_abs_diff={diff:.3g} identical={'yes' if identical else 'no'}", flush=True)
    assert identical, f"{case}: the ranks hold different weights"
    assert diff <= TOLERANCE, f"{case}: {diff:.3g} from one process (tolerance {TOLERANCE})"


def pair(kind: str, **kw: object) -> tuple[Net, torch.optim.Optimizer, Net, torch.optim.Optimizer]:
    torch.manual_seed(0)  # each case from the same start, whatever ran before it
    ref = Net()
    model = copy.deepcopy(ref)
    ref_opt = OPTIMIZERS[kind](groups(ref))
    opt = dt.DistributedOptimizer(OPTIMIZERS[kind](groups(model)), named_parameters=model.named_parameters(),
                                  shard_optimizer_state=True, **kw)  # type: ignore[arg-type]
    return ref, ref_opt, model, opt


def checkpoint_cases(folder: Path, phase: str) -> None:
    """Save at 1 rank (plain Adam) and at 4 (sharded); load either at this world size and
    continue over the same global batches: equal to one uninterrupted process."""
    torch.manual_seed(0)
    ref = Net()
    ref_opt = torch.optim.Adam(groups(ref), lr=0.01)
    start = copy.deepcopy(ref)
    train(ref, ref_opt, range(STEPS), sharded=False)
    if phase == "save" or P == 4:  # one process saves unsharded, four ranks save sharded
        model = copy.deepcopy(start)
        opt: torch.optim.Optimizer = torch.optim.Adam(groups(model), lr=0.01)
        if P > 1:
            opt = dt.DistributedOptimizer(opt, named_parameters=model.named_parameters(), shard_optimizer_state=True)
        train(model, opt, range(SAVED_AT), sharded=P > 1)
        name = "sharded4" if P > 1 else "unsharded1"
        dt.checkpoint.save(folder / name, model=model, optimizer=opt, extra={"step": SAVED_AT, "by": P})
        if phase == "save":
            return
    for name, saved_by in (("sharded4", 4), ("unsharded1", 1)):
        for sharded in ((False, True) if P == 1 else (True,)):
            model = Net()  # another init: everything must come from the checkpoint
            opt = torch.optim.Adam(groups(model), lr=0.01)
            if sharded:
                opt = dt.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                              shard_optimizer_state=True)
            extra = dt.checkpoint.load(folder / name, model=model, optimizer=opt)
            assert extra == {"step": SAVED_AT, "by": saved_by}, extra
            train(model, opt, range(SAVED_AT, STEPS), sharded=P > 1)
            mode = "sharded" if sharded else "plain"
            report(f"checkpoint-saved={saved_by}-loaded={P}-{mode}", model, ref)


def elastic_cases() -> None:
    """TorchState over a sharded Adam: 4 ranks commit after SAVED_AT steps; a fresh state in
    this world syncs from that commit (re-split for its ranks) and trains on."""
    torch.manual_seed(0)
    ref = Net()
    ref_opt = torch.optim.Adam(groups(ref), lr=0.01)
    start = copy.deepcopy(ref)
    train(ref, ref_opt, range(STEPS), sharded=False)

    def sharded_pair(model: Net) -> torch.optim.Optimizer:
        return dt.DistributedOptimizer(torch.optim.Adam(groups(model), lr=0.01),
                                       named_parameters=model.named_parameters(), shard_optimizer_state=True)

    if P == 4:
        model = copy.deepcopy(start)
        opt = sharded_pair(model)
        train(model, opt, range(SAVED_AT), sharded=True)
        dt.elastic.TorchState(model=model, optimizer=opt, step=SAVED_AT).commit()
    model = Net()  # another init: everything must come from the commit
    opt = sharded_pair(model)
    state = dt.elastic.TorchState(model=model, optimizer=opt, step=0)
    state.sync()
    assert state.step == SAVED_AT, state.step
    train(model, opt, range(SAVED_AT, STEPS), sharded=P > 1)
    report(f"elastic-committed=4-synced-at={P}", model, ref)


torch.manual_seed(0)
folder = Path(sys.argv[sys.argv.index("--checkpoint") + 1]) if "--checkpoint" in sys.argv else None
if folder is not None:
    checkpoint_cases(folder, "save" if "--save" in sys.argv else "load")
    if "--save" not in sys.argv:
        elastic_cases()
if P == 1:
    print(f"PASS zero rank {R}/{P}", flush=True)
    dt.shutdown()
    raise SystemExit(0)
for kind in OPTIMIZERS:
    ref, ref_opt, model, opt = pair(kind, bucket_cap_mb=0.002, first_bucket_mb=0.001)
    train(ref, ref_opt, range(STEPS), sharded=False)
    train(model, opt, range(STEPS), sharded=True)
    report(kind, model, ref)
    owned = sum(1 for p in model.parameters() if p.requires_grad and opt.owns(p))  # type: ignore[attr-defined]
    assert len(opt.state) == owned, f"{kind}: rank {R} keeps state of {len(opt.state)} tensors, owns {owned}"

# The drop-in ZeroRedundancyOptimizer: torch's signature, on ddl's ranks.
torch.manual_seed(0)
ref = Net()
model = copy.deepcopy(ref)
ref_opt = torch.optim.Adam(ref.parameters(), lr=0.01)
zero = dt.ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=0.01)
train(ref, ref_opt, range(STEPS), sharded=False)
train(model, zero, range(STEPS), sharded=True)
report("ZeroRedundancyOptimizer-adam", model, ref)
zero.consolidate_state_dict(to=P - 1)
if R == P - 1:
    full, want = zero.state_dict(), ref_opt.state_dict()
    assert full["state"].keys() == want["state"].keys(), (full["state"].keys(), want["state"].keys())
    worst = max((full["state"][i][k] - want["state"][i][k]).abs().max().item()
                for i in want["state"] for k in ("exp_avg", "exp_avg_sq"))
    assert worst <= TOLERANCE, f"consolidated state differs from one process's by {worst}"
    print(f"ZERO consolidate ranks={P} max_abs_diff={worst:.3g} identical=yes", flush=True)
else:
    try:
        zero.state_dict()
    except RuntimeError as exc:
        assert "consolidate_state_dict" in str(exc), exc
    else:
        raise AssertionError("state_dict() on a rank without the consolidated state must raise")
    print(f"ZERO consolidate ranks={P} max_abs_diff=0 identical=yes", flush=True)

# synchronize() gives every rank every reduced gradient: clipping by the global norm.
ref, ref_opt, model, opt = pair("sgd-momentum-wd")
train(ref, ref_opt, range(STEPS), sharded=False, clip=True)
train(model, opt, range(STEPS), sharded=True, clip=True)
report("sgd-synchronize-clip", model, ref)

# Gradient accumulation over two backward passes.
ref, ref_opt, model, opt = pair("adam", backward_passes_per_step=2)
train(ref, ref_opt, range(STEPS), sharded=False, passes=2)
train(model, opt, range(STEPS), sharded=True, passes=2)
report("adam-backward_passes_per_step=2", model, ref)

# A group joins at step 4: the partition is derived again and state moves to new owners.
torch.manual_seed(0)
ref = Net()
model = copy.deepcopy(ref)
ref_opt = torch.optim.Adam(groups(ref, extra=False), lr=0.01)
opt = dt.DistributedOptimizer(torch.optim.Adam(groups(model, extra=False), lr=0.01),
                              named_parameters=model.named_parameters(), shard_optimizer_state=True)


def add_extra(step: int, target: torch.optim.Optimizer, net: Net) -> None:
    if step == 4:
        target.add_param_group({"params": [net.extra.weight, net.extra.bias], "lr": 0.02})


for m, o, sharded in ((ref, ref_opt, False), (model, opt, True)):
    train(m, o, range(STEPS), sharded=sharded, before_step=lambda s, o=o, m=m: add_extra(s, o, m))
report("adam-add_param_group", model, ref)

# Horovod's recipe: only the root resumed a checkpoint; the others start fresh or stale.
RESUME = 5
torch.manual_seed(0)
saved_model = Net()
saved_ref_opt = torch.optim.AdamW(saved_model.parameters(), lr=0.01, weight_decay=0.05)
train(saved_model, saved_ref_opt, range(RESUME), sharded=False)
checkpoint = copy.deepcopy({"model": saved_model.state_dict(), "opt": saved_ref_opt.state_dict()})
ref = Net()
ref.load_state_dict(checkpoint["model"])
ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.01, weight_decay=0.05)
ref_opt.load_state_dict(copy.deepcopy(checkpoint["opt"]))
train(ref, ref_opt, range(RESUME, STEPS), sharded=False)
torch.manual_seed(100 + R)
model = Net()
inner = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.05)
if R == 0:
    model.load_state_dict(checkpoint["model"])
    inner.load_state_dict(copy.deepcopy(checkpoint["opt"]))
else:
    train(model, inner, range(2), sharded=False)  # stale state of another run: must be replaced
opt = dt.DistributedOptimizer(inner, named_parameters=model.named_parameters(), shard_optimizer_state=True)
dt.broadcast_parameters(model.state_dict(), root_rank=0)
dt.broadcast_optimizer_state(opt, root_rank=0)
train(model, opt, range(RESUME, STEPS), sharded=True)
report("adamw-recipe-resumed-root", model, ref)

print(f"PASS zero rank {R}/{P}", flush=True)
dt.shutdown()
