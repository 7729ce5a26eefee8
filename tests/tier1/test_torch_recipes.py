"""ddl.torch's recipes in one process: checkpoints of hooks and LocalSGD/DiLoCo, key order, GradScaler's protocol."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import ddl  # noqa: E402
import ddl.torch as dt  # noqa: E402
from ddl.checkpoint import CheckpointError, read_manifest  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _world() -> None:
    dt.init()


def mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3))


def train(m: nn.Module, opt: Any, steps: range, scaler: Any = None) -> None:
    for step in steps:
        g = torch.Generator().manual_seed(step)
        opt.zero_grad()
        loss = nn.functional.mse_loss(m(torch.randn(8, 6, generator=g)), torch.randn(8, 3, generator=g))
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()


def powersgd(m: nn.Module) -> dt.DistributedOptimizer:
    return dt.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=m.named_parameters(), compression=ddl.PowerSGD(rank=1, start_iter=2))


def test_powersgd_state_resumes_from_a_checkpoint_as_the_continuous_run(tmp_path: Path) -> None:
    cont = mlp()
    train(cont, powersgd(cont), range(7))
    m = mlp()
    opt = powersgd(m)
    train(m, opt, range(4))
    dt.checkpoint.save(tmp_path, model=m, optimizer=opt)
    info = read_manifest(tmp_path).meta["optimizer"]["hook"]
    assert [b["calls"] for b in info["buckets"]] == [4] and info["order"] is not None
    again = mlp(5)
    again_opt = powersgd(again)
    dt.checkpoint.load(tmp_path, model=again, optimizer=again_opt)
    train(again, again_opt, range(4, 7))
    for p, q in zip(cont.parameters(), again.parameters(), strict=True):
        assert torch.equal(p, q)


@pytest.mark.parametrize("kind", ["localsgd", "diloco"])
def test_local_sgd_and_diloco_save_their_state_and_resume_exactly(tmp_path: Path, kind: str) -> None:
    def build(m: nn.Module) -> Any:
        inner = torch.optim.Adam(m.parameters(), lr=0.01)
        return dt.LocalSGD(inner, period=3) if kind == "localsgd" else dt.DiLoCo(m, inner, period=2, overlap=1)

    cont = mlp()
    train(cont, build(cont), range(7))
    m = mlp()
    opt = build(m)
    train(m, opt, range(4))  # mid-period; DiLoCo: a round in flight
    dt.checkpoint.save(tmp_path, model=m, optimizer=opt)
    meta = read_manifest(tmp_path).meta["optimizer"]
    assert meta["class"].endswith("LocalSGD" if kind == "localsgd" else "DiLoCo") and meta["periodic"]["steps"] == 4
    assert meta["periodic"]["landed"] == (kind == "diloco")
    again = mlp(3)
    again_opt = build(again)
    dt.checkpoint.load(tmp_path, model=again, optimizer=again_opt)
    train(again, again_opt, range(4, 7))
    for p, q in zip(cont.parameters(), again.parameters(), strict=True):
        assert torch.equal(p, q)
    with pytest.raises(CheckpointError, match="meta.optimizer.class is ddl.torch.local_sgd"):
        dt.checkpoint.load(tmp_path, model=again, optimizer=torch.optim.SGD(again.parameters(), lr=0.1))


class AB(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 12)
        self.b = nn.Linear(12, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x)))


class BA(AB):
    def __init__(self) -> None:
        nn.Module.__init__(self)
        self.b = nn.Linear(12, 3)
        self.a = nn.Linear(6, 12)


def test_parameters_registered_in_another_order_load_by_name(tmp_path: Path) -> None:
    torch.manual_seed(0)
    saved = AB()
    opt = torch.optim.Adam([{"params": saved.a.parameters()}, {"params": saved.b.parameters(), "lr": 0.003}], lr=0.01)
    train(saved, opt, range(2))
    dt.checkpoint.save(tmp_path, model=saved, optimizer=opt)
    other = BA()
    other_opt = torch.optim.Adam([{"params": other.a.parameters()}, {"params": other.b.parameters(), "lr": 0.5}],
                                 lr=0.01)
    dt.checkpoint.load(tmp_path, model=other, optimizer=other_opt)
    assert other_opt.param_groups[1]["lr"] == 0.003
    train(saved, opt, range(2, 4))
    train(other, other_opt, range(2, 4))
    for name, p in saved.named_parameters():
        assert torch.equal(p, dict(other.named_parameters())[name])
    swapped = BA()
    groups = [{"params": swapped.b.parameters()}, {"params": swapped.a.parameters()}]  # the groups' names differ
    with pytest.raises(CheckpointError, match=r"meta.optimizer.param_groups has groups .* build the optimizer's"):
        dt.checkpoint.load(tmp_path, model=swapped, optimizer=torch.optim.Adam(groups, lr=0.01))


def test_a_grad_scaler_finds_the_optimizer_reduced_and_its_steps_skip_alike() -> None:
    """DDP's recipe at one rank: scaler.step(opt) works, the scaler becomes PowerSGD's, and a
    fused inner optimizer's own amp flag does not pass through the wrapper."""
    m = mlp()
    opt = powersgd(m)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    train(m, opt, range(3), scaler)
    assert opt.__dict__["_grad_scaler"] is scaler and opt.hook_state.loss_scale == 256.0
    fused = dt.DistributedOptimizer(torch.optim.Adam(mlp().parameters(), lr=0.01, fused=True))
    assert fused.optimizer._step_supports_amp_scaling and not fused._step_supports_amp_scaling
    local = dt.LocalSGD(torch.optim.SGD(m.parameters(), lr=0.1), period=2)
    assert local._step_supports_amp_scaling  # LocalSGD counts a skipped step on every rank
