"""ddl.torch's sharded optimizer and checkpoints in one process: the contract, the refusals, the files."""

from __future__ import annotations

import copy
import inspect
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import ddl.torch as dt  # noqa: E402
from ddl.checkpoint import CheckpointError, read_manifest  # noqa: E402
from ddl.tools import checkpoint as cli  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _world() -> None:
    dt.init()


def model(seed: int = 0, width: int = 8) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 3))


def train(m: nn.Module, opt: torch.optim.Optimizer, steps: int = 3) -> None:
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        opt.zero_grad()
        nn.functional.mse_loss(m(torch.randn(6, 4, generator=g)), torch.randn(6, 3, generator=g)).backward()
        opt.step()


def sharded(m: nn.Module, cls: type = torch.optim.Adam, **kw: object) -> dt.DistributedOptimizer:
    return dt.DistributedOptimizer(cls(m.parameters(), lr=0.01, **kw), named_parameters=m.named_parameters(),
                                   shard_optimizer_state=True)


# -- the sharded optimizer ------------------------------------------------------------------
def test_sharded_training_in_one_process_is_plain_training() -> None:
    a, b = model(), model()
    plain = torch.optim.Adam(a.parameters(), lr=0.01)
    opt = sharded(b)
    train(a, plain)
    train(b, opt)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)
    assert all(p.grad is None for p in b.parameters())  # the buffers carried the parameters back
    assert isinstance(opt, dt.DistributedOptimizer) and opt.partition.world_size == 1


def test_state_dict_needs_consolidation_and_then_is_one_process_s() -> None:
    a, b = model(), model()
    plain = torch.optim.Adam(a.parameters(), lr=0.01)
    opt = sharded(b)
    train(a, plain)
    train(b, opt)
    with pytest.raises(RuntimeError, match=r"consolidate_state_dict\(to=R\)"):
        opt.state_dict()
    opt.consolidate_state_dict(to=0)
    got, want = opt.state_dict(), plain.state_dict()
    assert got["param_groups"] == want["param_groups"]
    for i, slots in want["state"].items():
        for k, v in slots.items():
            assert torch.equal(got["state"][i][k], v), (i, k)
    with pytest.raises(ValueError, match="not a rank of this job"):
        opt.consolidate_state_dict(to=3)


def test_zero_redundancy_optimizer_has_torch_s_signature_and_methods() -> None:
    from torch.distributed.optim import ZeroRedundancyOptimizer as Theirs

    ours = inspect.signature(dt.ZeroRedundancyOptimizer.__init__).parameters
    theirs = inspect.signature(Theirs.__init__).parameters
    assert [n for n in theirs if n != "defaults"] == [n for n in ours if n not in ("defaults", "named_parameters")]
    for method in ("consolidate_state_dict", "state_dict", "load_state_dict", "add_param_group", "step"):
        assert callable(getattr(dt.ZeroRedundancyOptimizer, method))
    m = model()
    zero = dt.ZeroRedundancyOptimizer(m.parameters(), optimizer_class=torch.optim.SGD, lr=0.1, momentum=0.9)
    assert isinstance(zero.optim, torch.optim.SGD) and zero.world_size == 1 and zero.rank == 0
    train(m, zero)
    with pytest.raises(ValueError, match="process_group=None"):
        dt.ZeroRedundancyOptimizer(m.parameters(), torch.optim.SGD, object(), lr=0.1)
    with pytest.raises(ValueError, match="overlap_with_ddp"):
        dt.ZeroRedundancyOptimizer(m.parameters(), torch.optim.SGD, overlap_with_ddp=True, lr=0.1)


def test_what_sharding_cannot_do_is_refused_before_any_collective() -> None:
    m = model()
    with pytest.raises(ValueError, match="cannot shard LBFGS"):
        sharded(m, torch.optim.LBFGS)
    with pytest.raises(ValueError, match="drop compression="):
        dt.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), compression=dt.Compression.fp16,
                                shard_optimizer_state=True)
    opt = sharded(m)
    opt.optimizer.param_groups[0]["params"].append(nn.Parameter(torch.zeros(2)))
    with pytest.raises(RuntimeError, match="add_param_group"):
        train(m, opt, 1)


def test_load_state_dict_takes_a_one_process_state_dict() -> None:
    a, b = model(), model()
    plain = torch.optim.Adam(a.parameters(), lr=0.01)
    train(a, plain)
    b.load_state_dict(a.state_dict())
    opt = sharded(b)
    opt.load_state_dict(copy.deepcopy(plain.state_dict()))  # torch's load shares the tensors it is given
    train(a, plain, 2)
    train(b, opt, 2)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)


# -- checkpoints -----------------------------------------------------------------------------
def test_a_checkpoint_round_trips_model_optimizer_and_extra(tmp_path: Path) -> None:
    a = model()
    opt = torch.optim.AdamW(a.parameters(), lr=0.01, betas=(0.8, 0.9))
    train(a, opt)
    dt.checkpoint.save(tmp_path, model=a, optimizer=opt, extra={"epoch": 7})
    b = model(seed=1)
    fresh = torch.optim.AdamW(b.parameters(), lr=0.5)
    assert dt.checkpoint.load(tmp_path, model=b, optimizer=fresh) == {"epoch": 7}
    assert fresh.param_groups[0]["lr"] == 0.01 and fresh.param_groups[0]["betas"] == (0.8, 0.9)
    train(a, opt, 2)
    train(b, fresh, 2)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)


def test_a_checkpoint_refuses_another_model_or_optimizer_naming_the_field(tmp_path: Path) -> None:
    a = model()
    opt = torch.optim.Adam(a.parameters(), lr=0.01)
    train(a, opt)
    dt.checkpoint.save(tmp_path, model=a, optimizer=opt)
    wider = model(width=9)
    with pytest.raises(CheckpointError, match=r"entry 'model/0.weight' is float32\[8, 4\], the model's tensor is "
                                              r"float32\[9, 4\]"):
        dt.checkpoint.load(tmp_path, model=wider)
    other = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3), nn.Linear(3, 3))
    with pytest.raises(CheckpointError, match=r"meta.model.keys differs from the model's state_dict: 2 missing from "
                                              r"the checkpoint \['3.weight', '3.bias'\], 0 not in"):
        dt.checkpoint.load(tmp_path, model=other)
    b = model()
    with pytest.raises(CheckpointError, match=r"meta.optimizer.class is torch.optim.adam.Adam, the optimizer is "
                                              r"torch.optim.sgd.SGD"):
        dt.checkpoint.load(tmp_path, model=b, optimizer=torch.optim.SGD(b.parameters(), lr=0.1))


def test_a_flipped_byte_is_refused_naming_the_file_and_nothing_changes(tmp_path: Path) -> None:
    a = model()
    opt = torch.optim.Adam(a.parameters(), lr=0.01)
    train(a, opt)
    dt.checkpoint.save(tmp_path, model=a, optimizer=opt)
    name = next(f for f in read_manifest(tmp_path).files if f.startswith("optimizer"))
    data = bytearray((tmp_path / name).read_bytes())
    data[len(data) // 2] ^= 0x10
    (tmp_path / name).write_bytes(bytes(data))
    b = model(seed=3)
    before = [p.detach().clone() for p in b.parameters()]
    with pytest.raises(CheckpointError, match=rf"{name}: corrupt"):
        dt.checkpoint.load(tmp_path, model=b, optimizer=torch.optim.Adam(b.parameters(), lr=0.01))
    assert all(torch.equal(p, q) for p, q in zip(b.parameters(), before, strict=True))


def test_consolidate_writes_plain_torch_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = model()
    opt = sharded(a)
    train(a, opt)
    dt.checkpoint.save(tmp_path / "c", model=a, optimizer=opt)
    assert cli.main(["consolidate", str(tmp_path / "c"), "-o", str(tmp_path / "m.pt"),
                     "--optimizer", str(tmp_path / "o.pt")]) == 0
    assert "m.pt: model state_dict, 4 tensors" in capsys.readouterr().out
    b = model(seed=5)
    b.load_state_dict(torch.load(tmp_path / "m.pt"))
    plain = torch.optim.Adam(b.parameters(), lr=0.01)
    plain.load_state_dict(torch.load(tmp_path / "o.pt"))
    opt.consolidate_state_dict()
    want = opt.state_dict()
    for i in want["state"]:
        assert torch.equal(plain.state_dict()["state"][i]["exp_avg"], want["state"][i]["exp_avg"])
    assert cli.main(["inspect", str(tmp_path / "c")]) == 0
    assert "optimizer: torch.optim.adam.Adam, 4 parameters in 1 group(s), sharded when saved" in capsys.readouterr().out
