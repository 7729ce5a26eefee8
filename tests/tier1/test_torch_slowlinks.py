"""ddl.torch's PowerSGD, LocalSGD and DiLoCo in one process: arguments, state, and what one rank computes."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import ddl  # noqa: E402
import ddl.torch as dt  # noqa: E402
from ddl.torch.elastic import TorchState  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _world() -> None:
    dt.init()


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(2, 6, 3), nn.ReLU(), nn.Flatten(), nn.Linear(6 * 4 * 4, 20), nn.ReLU(),
                         nn.Linear(20, 3))


def step(m: nn.Module, opt: torch.optim.Optimizer, i: int) -> None:
    g = torch.Generator().manual_seed(i)
    x, y = torch.randn(5, 2, 6, 6, generator=g), torch.randint(0, 3, (5,), generator=g)
    opt.zero_grad()
    nn.functional.cross_entropy(m(x), y).backward()
    opt.step()


def weights(m: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()])


def trained(make_opt, steps: int = 7) -> tuple[nn.Module, torch.optim.Optimizer]:
    m = model()
    opt = make_opt(m)
    for i in range(steps):
        step(m, opt, i)
    return m, opt


def plain(m: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)


def test_one_rank_diloco_with_outer_sgd_at_lr_1_is_its_inner_training_at_any_period() -> None:
    ref, _ = trained(plain)
    got, opt = trained(lambda m: dt.DiLoCo(m, plain(m), torch.optim.SGD(m.parameters(), lr=1.0), period=3))
    assert opt.steps == 7
    torch.testing.assert_close(weights(got), weights(ref), rtol=0, atol=1e-6)
    nesterov, opt = trained(lambda m: dt.DiLoCo(m, plain(m), period=3))
    outer = opt.outer_optimizer.param_groups[0]
    assert (outer["lr"], outer["momentum"], outer["nesterov"]) == (0.7, 0.9, True)  # the paper's
    assert not torch.allclose(weights(nesterov), weights(ref))


def test_one_rank_local_sgd_is_its_own_training_and_fp16_rounds_only_the_changes() -> None:
    ref, _ = trained(plain)
    got, _ = trained(lambda m: dt.LocalSGD(plain(m), period=2))
    torch.testing.assert_close(weights(got), weights(ref), rtol=0, atol=1e-6)
    half, _ = trained(lambda m: dt.LocalSGD(plain(m), period=2, compression=ddl.Compression.fp16))
    torch.testing.assert_close(weights(half), weights(ref), rtol=0, atol=2e-3)


def test_bad_arguments_are_clear_errors() -> None:
    m = model()
    with pytest.raises(ValueError, match="period must be an integer >= 1"):
        dt.LocalSGD(plain(m), period=0)
    with pytest.raises(ValueError, match="overlap must be an integer from 0"):
        dt.DiLoCo(m, plain(m), period=4, overlap=5)
    with pytest.raises(TypeError, match="wraps a torch.optim.Optimizer"):
        dt.LocalSGD(m, period=2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="inner_optimizer must hold exactly the model's trainable parameters"):
        dt.DiLoCo(m, torch.optim.SGD(list(m.parameters())[:2], lr=0.1), period=2)
    ints = nn.Parameter(torch.zeros(3, dtype=torch.int64), requires_grad=False)
    with pytest.raises(TypeError, match="floating-point parameters"):
        dt.LocalSGD(torch.optim.SGD([ints], lr=0.1), period=2)
    with pytest.raises(ValueError, match="unknown compression or communication hook"):
        dt.LocalSGD(plain(m), period=2, compression="topk")
    with pytest.raises(TypeError, match="not a DistributedOptimizer"):
        dt.LocalSGD(dt.DistributedOptimizer(plain(m), named_parameters=m.named_parameters()), period=2)
    with pytest.raises(ValueError, match="cannot take a communication hook"):
        dt.DistributedOptimizer(plain(m), compression=ddl.PowerSGD(rank=2), shard_optimizer_state=True)


def test_diloco_state_dict_round_trips_mid_period() -> None:
    m, opt = trained(lambda m: dt.DiLoCo(m, plain(m), period=3, compression=ddl.PowerSGD(rank=2, start_iter=0)), 5)
    saved = copy.deepcopy(opt.state_dict())
    assert saved["steps"] == 5 and saved["unsent"] == 2 and saved["hook"]["buckets"]
    step(m, opt, 5)  # a round: the anchor moves
    assert not all(torch.equal(a, b) for a, b in zip(opt._anchor, saved["anchor"], strict=True))
    opt.load_state_dict(saved)
    assert opt.steps == 5 and all(torch.equal(a, b) for a, b in zip(opt._anchor, saved["anchor"], strict=True))


def test_powersgd_optimizer_statistics_hook_registration_and_elastic_state() -> None:
    m = model()
    opt = dt.DistributedOptimizer(plain(m), named_parameters=m.named_parameters(),
                                  compression=ddl.PowerSGD(rank=1, start_iter=2))
    state = TorchState(model=m, optimizer=opt)
    for i in range(4):
        step(m, opt, i)
    stats = opt.compression_stats()
    assert stats["iteration"] == 4 and stats["compressed_calls"] >= 2 and stats["compression_rate"] > 1
    state.commit()
    memories = list(opt.hook_state.buckets.values())
    calls = [mem.calls for mem in memories]
    q = [x.copy() for x in memories[0].qs]
    for i in range(4, 6):
        step(m, opt, i)
    state.restore()  # the commit's counts and Q; each rank's error starts at zero
    assert [mem.calls for mem in memories] == calls and all(mem.errors is None for mem in memories)
    assert all((a == b).all() for a, b in zip(memories[0].qs, q, strict=True))
    hook = ddl.PowerSGD(rank=3)
    opt.register_comm_hook(None, hook)
    assert opt.hook_state.hook is hook and opt.hook_state.iteration == 0
    opt.register_comm_hook(None, ddl.Compression.none)
    with pytest.raises(RuntimeError, match="keeps no statistics"):
        opt.compression_stats()
