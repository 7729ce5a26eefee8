"""The recipe matrix: what users combine, on 2-3 ranks, each against one process on the same global batches.

{plain, sharded, ZeroRedundancyOptimizer, PowerSGD, LocalSGD, DiLoCo} x {scheduler built
before / after the broadcast, a LinearLR warm-up, OneCycleLR, clipping, a GradScaler with
two overflows (rank 1's at step 2, rank 0's at step 6) in DDP's recipe (``scaler.step(opt)``)
and in Horovod's with clipping (``synchronize``, ``unscale_``, clip, ``skip_synchronize``),
accumulation over two passes} x {fresh, resumed at this world size, resumed from a
checkpoint another world size saved}.

References, computed in this process on the same global batches:

- plain, sharded, ZeroRedundancyOptimizer: one plain torch process.
- PowerSGD: one process running it (a DistributedOptimizer over a one-rank process set):
  PowerSGD is linear in the ranks' gradients and errors, so N ranks equal it (the run's
  distance from plain SGD, what compression changes, is printed beside it).
- LocalSGD, DiLoCo: their replicas simulated one after the other in plain torch (each on its
  shard, rounds every ``period`` steps); a resume at another world size continues from what
  ``synchronize()`` gives at the save, with the replicas' mean inner optimizer state.

Every fresh run saves a checkpoint at step K through ``ddl.torch.checkpoint`` (saving
changes nothing); the resumed runs load one into new objects (another init) and continue.
LocalSGD/DiLoCo runs end with ``synchronize()``. Each cell prints
``MATRIX <method> <recipe> <start> ranks=<P> max_abs_diff=<d> identical=<yes|no> ok=<yes|no>``
(PowerSGD adds ``vs_plain=<d>``); ``REFUSED <what> ok=<yes|no>`` lines check combinations
that are refused, and where. ``--cases`` also runs the issue's five cases first.

Usage (every rank): ``worker_recipe_matrix.py --folder DIR [--other N] [--cases] [--skip R1,R2]``:
saves under DIR/p<P>, and with ``--other N`` also resumes from what a run at N ranks saved
there; ``--skip`` leaves recipes out (to see the rest on code where one hangs).
"""

from __future__ import annotations

import copy
import runpy
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

import ddl
import ddl.torch as dt
import ddl.torch.sharded_reducer as sharded_reducer

# The tiny model's sharded buckets would all be allreduced (the cost model's choice at this
# size); real models' are reduce-scattered, so that each rank holds its own gradients only:
# test that path (a GradScaler or clipping must then see every rank's).
sharded_reducer.choose_gradient_exchange = lambda *args: sharded_reducer.REDUCE_SCATTER

torch.set_num_threads(1)
warnings.filterwarnings("ignore", message=".*lr_scheduler.step.*")  # a scaler's skipped first step: as in one process
dt.init()
R, P = dt.rank(), dt.size()
B, STEPS, SAVE_AT = 12, 8, 4
OVERFLOWS = {2: 1, 6: 0}  # step: the rank whose gradient overflows (under the GradScaler recipe)
TOLERANCE = 1e-6
FOLDER = Path(sys.argv[sys.argv.index("--folder") + 1])
OTHER = int(sys.argv[sys.argv.index("--other") + 1]) if "--other" in sys.argv else None
METHODS = ["plain", "sharded", "zero", "powersgd", "localsgd", "diloco"]
RECIPES = ["sched-before", "sched-after", "warmup", "onecycle", "clip", "scaler", "scaler-clip", "accum"]
PERIODIC = {"localsgd": (3, 0), "diloco": (2, 1)}  # (period, overlap): a save mid-period, and one mid-round
SINGLE = [dt.add_process_set([r]) for r in range(P)]  # the one-process PowerSGD reference runs over its own
TAKES_SCALER = "grad_scaler" in dt.DistributedOptimizer.__init__.__code__.co_varnames  # (not before issue 44)
failed: list[str] = []


def mlp(seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(900 + step)
    return torch.randn(B, 8, generator=g), torch.randn(B, 4, generator=g)


def shard(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    n = B // world
    return t[rank * n : (rank + 1) * n]


# -- building a job ------------------------------------------------------------------------------
def inner_optimizer(method: str, params: Any) -> torch.optim.Optimizer:
    if method in ("sharded", "diloco"):
        return torch.optim.Adam(params, lr=0.01)
    if method == "zero":
        return torch.optim.AdamW(params, lr=0.01, weight_decay=0.01)
    return torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-3)


def scheduler(recipe: str, opt: torch.optim.Optimizer) -> Any:
    if recipe in ("sched-before", "sched-after"):
        return torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    if recipe == "warmup":
        return torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=5)
    if recipe == "onecycle":
        max_lr = 0.02 if isinstance(getattr(opt, "optimizer", opt), torch.optim.Adam | torch.optim.AdamW) else 0.2
        return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=max_lr, total_steps=STEPS)
    return None


def scaler_for(recipe: str) -> torch.amp.GradScaler | None:
    return torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=3) if recipe.startswith("scaler") else None


class Job:
    """One training job: a model, its optimizer, scheduler and scaler, and how it steps.

    It trains on shard ``rank`` of ``world``: this rank's when distributed, the whole batch
    for a one-process reference; a LocalSGD/DiLoCo replica is given its rank's. Under the
    GradScaler recipe a gradient overflows where OVERFLOWS says: on that rank, and in a
    one-process reference (whose batch holds every rank's samples) at every such step.
    """

    def __init__(self, method: str, recipe: str, *, seed: int, distributed: bool, process_set: Any = None,
                 rank: int | None = None, world: int | None = None) -> None:
        self.method, self.recipe, self.distributed = method, recipe, distributed
        self.model = mlp(seed)
        self.scaler = scaler_for(recipe)
        self.world = world or (P if distributed else 1)
        self.rank = rank if rank is not None else (R if distributed else 0)
        self.whole = self.world == 1
        self.opt = self._optimizer(process_set)
        self.sched = None
        if recipe != "sched-after":
            self.sched = scheduler(recipe, self.opt)
        if distributed:  # Horovod's start-up recipe
            dt.broadcast_parameters(self.model.state_dict(), root_rank=0)
            dt.broadcast_optimizer_state(self.opt, root_rank=0)
        if recipe == "sched-after":
            self.sched = scheduler(recipe, self.opt)

    def _optimizer(self, process_set: Any) -> Any:
        m, method, accum = self.model, self.method, self.recipe == "accum"
        named = m.named_parameters()
        if method == "zero" and (self.distributed or process_set is not None):
            return dt.ZeroRedundancyOptimizer(m.parameters(), optimizer_class=torch.optim.AdamW, lr=0.01,
                                              weight_decay=0.01, named_parameters=named)
        if method == "powersgd" and (self.distributed or process_set is not None):
            # DDP's scaler recipe finds the scaler itself; Horovod's passes it.
            given = {"grad_scaler": self.scaler} if self.recipe == "scaler-clip" and TAKES_SCALER else {}
            return dt.DistributedOptimizer(inner_optimizer(method, m.parameters()), named_parameters=named,
                                           compression=ddl.PowerSGD(rank=1, start_iter=2), process_set=process_set,
                                           **given)
        if method in ("plain", "sharded") and self.distributed:
            return dt.DistributedOptimizer(inner_optimizer(method, m.parameters()), named_parameters=named,
                                           backward_passes_per_step=2 if accum else 1,
                                           shard_optimizer_state=method == "sharded")
        if method in PERIODIC and self.distributed:
            period, overlap = PERIODIC[method]
            inner = inner_optimizer(method, m.parameters())
            if method == "localsgd":
                return dt.LocalSGD(inner, period=period)
            return dt.DiLoCo(m, inner, period=period, overlap=overlap)
        return inner_optimizer(method, m.parameters())

    @property
    def periodic(self) -> bool:
        return self.method in PERIODIC and self.distributed

    def step(self, step: int) -> None:
        x, y = batch(step)
        x, y = shard(x, self.rank, self.world), shard(y, self.rank, self.world)
        opt, scaler, model = self.opt, self.scaler, self.model
        opt.zero_grad()
        parts = 2 if self.recipe == "accum" else 1
        for k in range(parts):
            xs, ys = x[k * len(x) // parts : (k + 1) * len(x) // parts], y[k * len(y) // parts : (k + 1) * len(y) // parts]
            loss = nn.functional.mse_loss(model(xs), ys) / parts
            if scaler is not None and step in OVERFLOWS and (self.whole or OVERFLOWS[step] == self.rank):
                loss = loss + model[0].weight.sum() * float("inf")  # an overflow in this rank's gradient
            scaled = scaler.scale(loss) if scaler is not None else loss
            no_sync = parts > 1 and k < parts - 1 and self.method in ("zero", "powersgd") and hasattr(opt, "no_sync")
            if no_sync:
                with opt.no_sync():
                    scaled.backward()
            else:
                scaled.backward()
        reduces = hasattr(opt, "skip_synchronize")  # a DistributedOptimizer: reduce, then look at gradients
        if self.recipe == "clip":
            if reduces:
                opt.synchronize()
            nn.utils.clip_grad_norm_(model.parameters(), 0.3)
            self._step(reduces, opt.step)
        elif self.recipe == "scaler":  # DDP's recipe (LocalSGD/DiLoCo: each rank its own scaler)
            scaler.step(opt)
            scaler.update()
        elif self.recipe == "scaler-clip":  # Horovod's, with clipping by the global norm
            if reduces:
                opt.synchronize()
            scaler.unscale_(opt)
            nn.utils.clip_grad_norm_(model.parameters(), 0.3)
            self._step(reduces, lambda: scaler.step(opt))
            scaler.update()
        else:
            opt.step()
        if self.sched is not None:
            self.sched.step()

    def _step(self, reduces: bool, step: Any) -> None:
        if reduces:
            with self.opt.skip_synchronize():
                step()
        else:
            step()

    def extra(self, step: int) -> dict[str, Any]:
        return {"step": step, "sched": None if self.sched is None else self.sched.state_dict(),
                "scaler": None if self.scaler is None else self.scaler.state_dict()}

    def resume(self, extra: dict[str, Any]) -> None:
        if self.sched is not None and extra["sched"] is not None:
            self.sched.load_state_dict(extra["sched"])
        if self.scaler is not None and extra["scaler"] is not None:
            self.scaler.load_state_dict(extra["scaler"])


# -- LocalSGD / DiLoCo simulated in one process -----------------------------------------------------
class Replicas:
    """``world`` replicas of a LocalSGD or DiLoCo job, each a one-process job on its shard, with
    the rounds done here: the reference, written in plain torch."""

    def __init__(self, method: str, recipe: str, world: int) -> None:
        self.method, self.recipe = method, recipe
        self.period, self.overlap = PERIODIC[method]
        self.jobs = [self._job(r, world) for r in range(world)]
        self.anchor = [p.detach().clone() for p in self.jobs[0].model.parameters()]
        self.outer_model = mlp(0)
        self.outer = torch.optim.SGD(self.outer_model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
        self.steps = self.unsent = self.merge_at = 0
        self.landed: list[torch.Tensor] | None = None
        self.boundary: list[list[torch.Tensor]] = []

    def _job(self, rank: int, world: int) -> Job:
        return Job(self.method, self.recipe, seed=0, distributed=False, rank=rank, world=world)

    def step(self, step: int) -> None:
        for job in self.jobs:
            job.step(step)
        self.steps += 1
        self.unsent += 1
        if self.landed is not None and self.steps >= self.merge_at:
            self.merge()
        if self.steps % self.period == 0:
            self.start_round()
            if self.overlap == 0:
                self.merge()

    def weights(self, job: Job) -> list[torch.Tensor]:
        return list(job.model.parameters())

    def start_round(self) -> None:
        n = len(self.jobs)
        self.landed = [sum((a - self.weights(j)[i].detach() for j in self.jobs), torch.zeros_like(a)) / n
                       for i, a in enumerate(self.anchor)]
        self.boundary = [[p.detach().clone() for p in self.weights(j)] for j in self.jobs]
        self.merge_at = self.steps + self.overlap
        self.unsent = 0

    def merge(self) -> None:
        assert self.landed is not None
        averaged, self.landed = self.landed, None
        self.outer_update(averaged)
        with torch.no_grad():
            for j, bounds in zip(self.jobs, self.boundary, strict=True):
                for p, a, b in zip(self.weights(j), self.anchor, bounds, strict=True):
                    moved = p - b
                    p.copy_(a + moved if self.overlap else a)
        self.boundary = []

    def outer_update(self, averaged: list[torch.Tensor]) -> None:
        with torch.no_grad():
            if self.method == "localsgd":
                for a, d in zip(self.anchor, averaged, strict=True):
                    a.sub_(d)
                return
            for p, a, d in zip(self.outer_model.parameters(), self.anchor, averaged, strict=True):
                p.copy_(a)
                p.grad = d.clone()
        self.outer.step()
        with torch.no_grad():
            for p, a in zip(self.outer_model.parameters(), self.anchor, strict=True):
                a.copy_(p)

    def synchronize(self) -> None:
        if self.landed is not None:
            self.merge()
        if self.unsent:
            self.start_round()
            self.merge()

    def regroup(self, world: int) -> None:
        """Go on at another world size from the synchronized weights, with the replicas' mean
        inner optimizer state and rank 0's scheduler and scaler (what a checkpoint gives)."""
        self.synchronize()
        states = [j.opt.state_dict() for j in self.jobs]
        mean = copy.deepcopy(states[0])
        for i, slots in mean["state"].items():
            for k, v in slots.items():
                if isinstance(v, torch.Tensor) and v.is_floating_point():
                    slots[k] = torch.stack([s["state"][i][k].double() for s in states]).mean(0).to(v.dtype)
        extra = self.jobs[0].extra(self.steps)
        self.jobs = [self._job(r, world) for r in range(world)]
        for j in self.jobs:
            with torch.no_grad():
                for p, a in zip(j.model.parameters(), self.anchor, strict=True):
                    p.copy_(a)
            j.opt.load_state_dict(copy.deepcopy(mean))
            j.resume(extra)

    def model(self) -> nn.Module:
        return self.jobs[0].model


# -- running a cell ---------------------------------------------------------------------------------
def diff(a: nn.Module, b: nn.Module) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def identical(model: nn.Module) -> bool:
    flat = torch.cat([t.detach().reshape(-1) for t in model.state_dict().values()])
    return len({f.numpy().tobytes() for f in dt.allgather_object(flat)}) == 1


def reference(method: str, recipe: str, resumed_from: int | None = None) -> nn.Module:
    """One process's weights after STEPS (for LocalSGD/DiLoCo: this world's replicas,
    synchronized; resumed from ``resumed_from`` ranks at SAVE_AT)."""
    if method in PERIODIC:
        sim = Replicas(method, recipe, resumed_from or P)
        for step in range(STEPS):
            if step == SAVE_AT and resumed_from is not None:
                sim.regroup(P)
            sim.step(step)
        sim.synchronize()
        return sim.model()
    job = Job(method, recipe, seed=0, distributed=False, process_set=SINGLE[R] if method == "powersgd" else None)
    for step in range(STEPS):
        job.step(step)
    return job.model


def finish(job: Job) -> nn.Module:
    if job.periodic:
        job.opt.synchronize()
    return job.model


def cell(method: str, recipe: str, start: str, model: nn.Module, ref: nn.Module, extra: str = "") -> None:
    d = diff(model, ref)
    same = identical(model)
    ok = all(dt.allgather_object(d <= TOLERANCE and same))
    if R == 0:
        print(f"MATRIX {method} {recipe} {start} ranks={P} max_abs_diff={d:.3g} identical={'yes' if same else 'no'}"
              f"{extra} ok={'yes' if ok else 'no'}", flush=True)
    if not ok:
        failed.append(f"{method}/{recipe}/{start}")


def run_cell(method: str, recipe: str) -> None:
    """Every start of one cell; an error is that start's result (all ranks meet it alike)."""
    try:
        _run_cell(method, recipe)
    except Exception as exc:  # the cell reports what it got and the matrix goes on
        if R == 0:
            print(f"MATRIX {method} {recipe} error ranks={P} max_abs_diff=nan identical=no "
                  f"error={type(exc).__name__}:{str(exc)[:100].replace(' ', '_')} ok=no", flush=True)
        failed.append(f"{method}/{recipe}/error")


def _run_cell(method: str, recipe: str) -> None:
    ref = reference(method, recipe)
    vs_plain = ""
    if method == "powersgd":
        plain = reference("plain", recipe)
        vs_plain = f" vs_plain={diff(ref, plain):.3g}"
    # fresh, saving at SAVE_AT on the way (a save changes nothing)
    job = Job(method, recipe, seed=0 if R == 0 else 100 + R, distributed=True)
    folder = FOLDER / f"p{P}" / f"{method}-{recipe}"
    for step in range(STEPS):
        if step == SAVE_AT:
            dt.checkpoint.save(folder, model=job.model, optimizer=job.opt, extra=job.extra(step))
        job.step(step)
    cell(method, recipe, "fresh", finish(job), ref, vs_plain)
    # resumed at this world size, and from the other world's checkpoint
    starts = [("resumed-same", folder, None)]
    if OTHER is not None:
        starts.append((f"resumed-from-{OTHER}", FOLDER / f"p{OTHER}" / f"{method}-{recipe}", OTHER))
    for start, saved, other in starts:
        again = Job(method, recipe, seed=50 + R, distributed=True)
        extra = dt.checkpoint.load(saved, model=again.model, optimizer=again.opt)
        assert extra["step"] == SAVE_AT, extra
        again.resume(extra)
        for step in range(SAVE_AT, STEPS):
            again.step(step)
        expected = ref if other is None or method not in PERIODIC else reference(method, recipe, resumed_from=other)
        cell(method, recipe, start, finish(again), expected, vs_plain)


# -- refused combinations: where, and with what advice ----------------------------------------------
def refusals() -> None:
    def expect(what: str, words: tuple[str, ...], fn: Any) -> None:
        try:
            fn()
        except Exception as exc:  # the refusal under test
            ok = all(w in str(exc) for w in words)
            message = str(exc)
        else:
            ok, message = False, "(not refused)"
        ok = all(dt.allgather_object(ok))
        if R == 0:
            print(f"REFUSED {what} ranks={P} ok={'yes' if ok else 'no'} message={message[:150]!r}", flush=True)
        if not ok:
            failed.append(f"refused/{what}")

    model = mlp(0)
    expect("sharded+PowerSGD-at-construction", ("cannot take a communication hook", "drop one of the two"),
           lambda: dt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), shard_optimizer_state=True,
                                           compression=ddl.PowerSGD(rank=1)))
    expect("LocalSGD-over-DistributedOptimizer-at-construction", ("wraps a plain optimizer", "pass the optimizer"),
           lambda: dt.LocalSGD(dt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                                       named_parameters=model.named_parameters()), period=2))
    expect("ZeroRedundancyOptimizer-overlap_with_ddp-at-construction", ("overlap_with_ddp",),
           lambda: dt.ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.1,
                                              overlap_with_ddp=True))
    for method in ("plain", "sharded", "powersgd"):
        def clip_first(method: str = method) -> None:
            job = Job(method, "clip", seed=0, distributed=True)
            x, y = batch(0)
            job.opt.zero_grad()
            nn.functional.mse_loss(job.model(shard(x, R, P)), shard(y, R, P)).backward()
            nn.utils.clip_grad_norm_(job.model.parameters(), 0.3)  # before the reduction finished
            job.opt.step()
        expect(f"{method}+clip-before-synchronize-at-its-step", ("optimizer.synchronize()", "skip_synchronize"),
               clip_first)

    job = Job("localsgd", "sched-before", seed=0, distributed=True)
    for step in range(SAVE_AT):
        job.step(step)
    expect("LocalSGD-save-model-alone-mid-period", ("optimizer=opt", "synchronize()"),
           lambda: dt.checkpoint.save(FOLDER / f"p{P}" / "refused-model-alone", model=job.model))
    if OTHER is not None:
        expect(f"LocalSGD-checkpoint-of-{OTHER}-loaded-without-optimizer", ("LocalSGD/DiLoCo", "synchronize()"),
               lambda: dt.checkpoint.load(FOLDER / f"p{OTHER}" / "localsgd-sched-before", model=mlp(1)))


started = time.perf_counter()
if "--cases" in sys.argv:
    cases = runpy.run_path(str(Path(__file__).with_name("worker_recipe_cases.py")), run_name="cases")
    failed += cases["run_cases"](FOLDER / f"p{P}" / "cases")
skipped = sys.argv[sys.argv.index("--skip") + 1].split(",") if "--skip" in sys.argv else []  # for exploring
for method in METHODS:
    for recipe in RECIPES:
        if recipe not in skipped:
            run_cell(method, recipe)
refusals()
if R == 0:
    print(f"TOOK matrix ranks={P} seconds={time.perf_counter() - started:.1f}", flush=True)
print(f"{'PASS' if not failed else 'FAIL'} matrix rank {R}/{P} failed={','.join(failed) or '-'}", flush=True)
dt.shutdown()
sys.exit(1 if failed else 0)
