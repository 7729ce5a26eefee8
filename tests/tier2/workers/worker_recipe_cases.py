"""The five cases of issue 44, each against one plain torch process (or the continuous run) on the same batches.

Run under mpiexec at 2 or 3 ranks with ``--folder DIR`` (or through ``run_cases(folder)``, as
the recipe matrix's worker does with ``--cases``). Each case prints
``CASE <name> ranks=<P> <figure>=<value> ... ok=<yes|no>`` and the worker fails at the end
if any case is not ok, so a run shows every case's figure before it fails.

1. ``broadcast_optimizer_state`` of a sharded optimizer (and ZeroRedundancyOptimizer) after a
   scheduler or a learning rate set after wrapping: the root's current hyperparameters.
2. ``ddl.torch.checkpoint`` of LocalSGD/DiLoCo mid-period: a file some rank really holds, the
   wrapper accepted, and a resume equal to the continuous run.
3. PowerSGD with ``torch.amp.GradScaler``: one rank's overflow is skipped like without PowerSGD,
   and a scale that changes keeps the error memory in step (equal to the unscaled run).
4. PowerSGD through ``ddl.torch.checkpoint``: a resume equal to the continuous run.
5. A model whose parameters are registered in another order loads by name.
"""

from __future__ import annotations

import copy
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import ddl
import ddl.torch as dt

torch.set_num_threads(1)
dt.init()
R, P = dt.rank(), dt.size()
B = 12
TOLERANCE = 1e-6
FOLDER = Path(".")  # run_cases() sets it
failed: list[str] = []


def report(name: str, ok: bool, **figures: Any) -> None:
    ok = all(dt.allgather_object(ok))  # every rank's verdict; rank 0's figures
    shown = " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={str(v)[:160]}" for k, v in figures.items())
    if R == 0:
        print(f"CASE {name} ranks={P} {shown} ok={'yes' if ok else 'no'}", flush=True)
    if not ok:
        failed.append(name)


def mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(700 + step)
    return torch.randn(B, 8, generator=g), torch.randn(B, 4, generator=g)


def local(t: torch.Tensor) -> torch.Tensor:
    n = B // P
    return t[R * n : (R + 1) * n]


def diff(a: nn.Module, b: nn.Module) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def identical(model: nn.Module) -> bool:
    flat = torch.cat([t.detach().reshape(-1) for t in model.state_dict().values()])
    return len({bytes(f.numpy().tobytes()) for f in dt.allgather_object(flat)}) == 1


def attempt(fn: Callable[..., Any], *args: Any, **kw: Any) -> tuple[Any, str]:
    """``fn(*args, **kw)``'s result and '', or None and the error's one-line description."""
    try:
        return fn(*args, **kw), ""
    except Exception as exc:  # the case reports what it got
        return None, f"{type(exc).__name__}: {exc}".replace(" ", "_")


def sgd_steps(model: nn.Module, opt: torch.optim.Optimizer, steps: range, *, shard: bool,
              sched: Any = None) -> None:
    for step in steps:
        x, y = batch(step)
        if shard:
            x, y = local(x), local(y)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if sched is not None:
            sched.step()


# -- 1. the sharded broadcast after a scheduler or a learning rate set after wrapping --------
def case_sharded_broadcast() -> None:
    steps = range(8)
    for wrapper in ("sharded", "zero", "unsharded"):
        for recipe in ("linear-warmup-after-wrap", "lr-set-after-wrap", "onecycle-before-broadcast"):
            def schedule(opt: torch.optim.Optimizer, recipe: str = recipe) -> Any:
                if recipe == "linear-warmup-after-wrap":
                    return torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=6)
                if recipe == "onecycle-before-broadcast":
                    return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.2, total_steps=len(steps))
                for g in opt.param_groups:
                    g["lr"] = 0.05
                return None

            ref = mlp()
            ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
            ref_sched = schedule(ref_opt)
            first_lr = ref_opt.param_groups[0]["lr"]
            sgd_steps(ref, ref_opt, steps, shard=False, sched=ref_sched)

            model = mlp(0 if R == 0 else 100 + R)  # the root holds what one process starts from
            if wrapper == "zero":
                opt: Any = dt.ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.1,
                                                      momentum=0.9)
            else:
                opt = dt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                              named_parameters=model.named_parameters(),
                                              shard_optimizer_state=wrapper != "unsharded")
            sched = schedule(opt)
            dt.broadcast_parameters(model.state_dict(), root_rank=0)
            _, error = attempt(dt.broadcast_optimizer_state, opt, root_rank=0)
            got_lr = opt.param_groups[0]["lr"]
            if not error:
                _, error = attempt(sgd_steps, model, opt, steps, shard=True, sched=sched)
            if error:
                report(f"1-{wrapper}-{recipe}", False, error=error)
                continue
            d = diff(model, ref)
            report(f"1-{wrapper}-{recipe}", d <= TOLERANCE and identical(model), first_lr=float(got_lr),
                   one_process_first_lr=float(first_lr), max_abs_diff=d)


# -- 2. checkpoints of LocalSGD / DiLoCo mid-period --------------------------------------------
def periodic(kind: str, model: nn.Module) -> Any:
    inner = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if kind == "localsgd":
        return dt.LocalSGD(inner, period=4)
    return dt.DiLoCo(model, inner, torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True),
                     period=4)


def case_periodic_checkpoint() -> None:
    saved_at, total = 6, 11  # a round at 4 and 8: the save falls between them
    for kind in ("localsgd", "diloco"):
        cont = mlp()
        cont_opt = periodic(kind, cont)
        sgd_steps(cont, cont_opt, range(total), shard=True)

        model = mlp()
        opt = periodic(kind, model)
        sgd_steps(model, opt, range(saved_at), shard=True)
        root = dt.broadcast_object(model.state_dict(), 0)
        spread = max(dt.allgather_object(max((v - root[k]).abs().max().item() for k, v in model.state_dict().items())))
        folder = FOLDER / f"case2-{kind}-model-only"
        _, error = attempt(dt.checkpoint.save, folder, model=model)
        if error:  # a refusal is right if it says what to do instead
            refused = "CheckpointError" in error and "optimizer=opt" in error and "synchronize()" in error
            report(f"2-{kind}-save-model-mid-period", refused, replicas_spread=spread,
                   refused="yes" if refused else error)
        else:
            # What the file holds against what each rank holds: some rank must hold it all.
            dt.checkpoint.consolidate(folder, FOLDER / f"case2-{kind}-{R}.pt") if R == 0 else None
            ddl.barrier()
            from_file = torch.load(FOLDER / f"case2-{kind}-0.pt")
            mine = max((from_file[k] - v).abs().max().item() for k, v in model.state_dict().items())
            closest = min(dt.allgather_object(mine))
            report(f"2-{kind}-save-model-mid-period", closest == 0.0, replicas_spread=spread,
                   file_vs_closest_rank=closest)
        folder = FOLDER / f"case2-{kind}-with-optimizer"
        _, error = attempt(dt.checkpoint.save, folder, model=model, optimizer=opt)
        if error:
            report(f"2-{kind}-resume-same-world", False, error=error)
            continue
        again = mlp(50 + R)
        again_opt = periodic(kind, again)
        _, error = attempt(dt.checkpoint.load, folder, model=again, optimizer=again_opt)
        if not error:
            _, error = attempt(sgd_steps, again, again_opt, range(saved_at, total), shard=True)
        if error:
            report(f"2-{kind}-resume-same-world", False, error=error)
            continue
        d = max(dt.allgather_object(diff(again, cont)))
        report(f"2-{kind}-resume-same-world", d <= TOLERANCE, max_abs_diff_from_continuous=d)


# -- 3. PowerSGD with a GradScaler ---------------------------------------------------------------
OVERFLOW_AT = 4


def scaled_steps(model: nn.Module, opt: Any, steps: range, *, scaler: torch.amp.GradScaler | None,
                 overflow: bool) -> list[float]:
    """The documented recipe: reduce, unscale, step without reducing again. With ``overflow``,
    rank 1's gradient is infinite once (at OVERFLOW_AT)."""
    scales = []
    for step in steps:
        x, y = batch(step)
        x, y = local(x), local(y)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        if overflow and step == OVERFLOW_AT and R == 1:
            loss = loss + model[0].weight.sum() * float("inf")
        (scaler.scale(loss) if scaler is not None else loss).backward()
        if scaler is None:
            opt.step()
            continue
        opt.synchronize()
        scaler.unscale_(opt)
        with opt.skip_synchronize():
            scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    return scales


def scaler_kw(scaler: torch.amp.GradScaler) -> dict[str, Any]:
    """``grad_scaler=scaler`` where the optimizer takes it (not before issue 44)."""
    return {"grad_scaler": scaler} if "grad_scaler" in dt.DistributedOptimizer.__init__.__code__.co_varnames else {}


def powersgd_opt(model: nn.Module, **kw: Any) -> Any:
    return dt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=model.named_parameters(),
                                   compression=ddl.PowerSGD(rank=1, start_iter=2), **kw)


def case_powersgd_scaler() -> None:
    steps = range(10)
    # Without PowerSGD the scaler skips rank 1's overflow and goes on.
    plain = mlp()
    opt = dt.DistributedOptimizer(torch.optim.SGD(plain.parameters(), lr=0.05, momentum=0.9),
                                  named_parameters=plain.named_parameters())
    plain_scales = scaled_steps(plain, opt, steps, scaler=torch.amp.GradScaler("cpu", init_scale=1024.0), overflow=True)
    # The reference for PowerSGD: the same job without a scaler, with the overflowing step left out.
    ref = mlp()
    ref_opt = powersgd_opt(ref)
    scaled_steps(ref, ref_opt, range(OVERFLOW_AT), scaler=None, overflow=False)
    scaled_steps(ref, ref_opt, range(OVERFLOW_AT + 1, len(steps)), scaler=None, overflow=False)

    model = mlp()
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    popt = powersgd_opt(model, **scaler_kw(scaler))
    before = copy.deepcopy(model)
    scales = scaled_steps(model, popt, steps, scaler=scaler, overflow=True)
    moved = diff(model, before)
    finite = all(torch.isfinite(p).all() for p in model.parameters())
    d = diff(model, ref)
    report("3-powersgd-gradscaler-one-overflow", finite and d <= TOLERANCE and identical(model),
           scale_without_powersgd=plain_scales[-1], scale_with_powersgd=scales[-1], weights_moved=moved,
           max_abs_diff_from_run_without_the_step=d)
    # DDP's recipe (scaler.step(opt), no grad_scaler=): the optimizer finds its scaler itself.
    model = mlp()
    popt = powersgd_opt(model)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    for step in steps:
        x, y = batch(step)
        popt.zero_grad()
        loss = nn.functional.mse_loss(model(local(x)), local(y))
        if step == OVERFLOW_AT and R == 1:
            loss = loss + model[0].weight.sum() * float("inf")
        scaler.scale(loss).backward()
        scaler.step(popt)
        scaler.update()
    d = diff(model, ref)
    report("3-powersgd-gradscaler-ddp-recipe-one-overflow", d <= TOLERANCE and identical(model),
           scale_with_powersgd=scaler.get_scale(), max_abs_diff_from_run_without_the_step=d)
    # A step left out by hand (no scaler): its hook state is dropped, and that is said once.
    model = mlp()
    popt = powersgd_opt(model)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for step in steps:
            x, y = batch(step)
            popt.zero_grad()
            nn.functional.mse_loss(model(local(x)), local(y)).backward()
            if step == OVERFLOW_AT:
                popt.synchronize()  # reduced, then not taken
                continue
            popt.step()
    told = any("optimizer.step()" in str(w.message) and "left out" in str(w.message) for w in seen)
    d = diff(model, ref)
    report("3-powersgd-step-left-out-by-hand", told and d <= TOLERANCE and identical(model),
           warned="yes" if told else "no", max_abs_diff_from_run_without_the_step=d)

    # A scale that grows every step: PowerSGD must equal the unscaled run.
    ref = mlp()
    scaled_steps(ref, powersgd_opt(ref), steps, scaler=None, overflow=False)
    model = mlp()
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0, growth_interval=1)
    scales = scaled_steps(model, powersgd_opt(model, **scaler_kw(scaler)), steps, scaler=scaler, overflow=False)
    d = diff(model, ref)
    report("3-powersgd-gradscaler-growing-scale", d <= TOLERANCE and identical(model), final_scale=scales[-1],
           max_abs_diff_from_unscaled=d)


# -- 4. PowerSGD resumed from ddl.torch.checkpoint -----------------------------------------------
def case_powersgd_resume() -> None:
    saved_at, total = 5, 12
    cont = mlp()
    sgd_steps(cont, powersgd_opt(cont), range(total), shard=True)
    model = mlp()
    opt = powersgd_opt(model)
    sgd_steps(model, opt, range(saved_at), shard=True)
    folder = FOLDER / "case4-powersgd"
    dt.checkpoint.save(folder, model=model, optimizer=opt)
    again = mlp(50 + R)
    again_opt = powersgd_opt(again)
    dt.checkpoint.load(folder, model=again, optimizer=again_opt)
    sgd_steps(again, again_opt, range(saved_at, total), shard=True)
    d = diff(again, cont)
    report("4-powersgd-resume-same-world", d <= TOLERANCE and identical(again), max_abs_diff_from_continuous=d)


# -- 5. parameters registered in another order ---------------------------------------------------
class AB(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x)))


class BA(AB):
    def __init__(self) -> None:
        nn.Module.__init__(self)
        self.b = nn.Linear(16, 4)
        self.a = nn.Linear(8, 16)


def case_key_order() -> None:
    torch.manual_seed(0)
    saved = AB()
    opt = dt.DistributedOptimizer(torch.optim.Adam(saved.parameters(), lr=0.01),
                                  named_parameters=saved.named_parameters())
    sgd_steps(saved, opt, range(3), shard=True)
    folder = FOLDER / "case5-key-order"
    dt.checkpoint.save(folder, model=saved, optimizer=opt)
    torch.manual_seed(1)
    other = BA()
    other_opt = dt.DistributedOptimizer(torch.optim.Adam(other.parameters(), lr=0.01),
                                        named_parameters=other.named_parameters())
    _, error = attempt(dt.checkpoint.load, folder, model=other, optimizer=other_opt)
    if error:
        report("5-key-order", False, error=error)
        return
    sgd_steps(saved, opt, range(3, 6), shard=True)
    sgd_steps(other, other_opt, range(3, 6), shard=True)
    d = max((p - q).abs().max().item() for n, p in saved.named_parameters() for m, q in other.named_parameters()
            if n == m)
    report("5-key-order", d <= TOLERANCE, max_abs_diff_from_continuous=d)


def run_cases(folder: Path) -> list[str]:
    """Run the five cases (saving under ``folder``); the names of those that failed."""
    global FOLDER
    FOLDER = folder
    for case in (case_sharded_broadcast, case_periodic_checkpoint, case_powersgd_scaler, case_powersgd_resume,
                 case_key_order):
        _, error = attempt(case)
        if error:
            report(case.__name__, False, error=error)
    return list(failed)


if __name__ == "__main__":
    run_cases(Path(sys.argv[sys.argv.index("--folder") + 1]))
    print(f"{'PASS' if not failed else 'FAIL'} cases rank {R}/{P} failed={','.join(failed) or '-'}", flush=True)
    dt.shutdown()
    sys.exit(1 if failed else 0)
