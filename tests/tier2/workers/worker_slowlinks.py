"""ddl.torch over slow links under mpiexec: PowerSGD, LocalSGD and DiLoCo against one process.

Exact where the algorithm is (PowerSGD at full rank without error feedback: plain
averaging to 1e-5; LocalSGD with period 1 and DiLoCo with period 1 and outer SGD at lr 1:
synchronous SGD to 1e-6); every rank ends with the same weights in every case.
"""

from __future__ import annotations

import hashlib

import torch
from torch import nn

import ddl
import ddl.torch as dt

torch.set_num_threads(1)
dt.init()
R, P = dt.rank(), dt.size()
B, STEPS = 24, 10


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(2, 6, 3), nn.ReLU(), nn.Flatten(), nn.Linear(6 * 4 * 4, 20), nn.ReLU(),
                         nn.Linear(20, 3))


def batch(i: int, shard: bool) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    x, y = torch.randn(B, 2, 6, 6, generator=g), torch.randint(0, 3, (B,), generator=g)
    n = B // P
    return (x[R * n : (R + 1) * n], y[R * n : (R + 1) * n]) if shard else (x, y)


def sgd(m: nn.Module, lr: float = 0.1) -> torch.optim.Optimizer:
    return torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9)


def train(make_opt, *, distributed: bool) -> tuple[nn.Module, torch.optim.Optimizer]:
    m = model()
    opt = make_opt(m)
    for i in range(STEPS):
        x, y = batch(i, distributed)
        opt.zero_grad()
        nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
    if hasattr(opt, "synchronize") and not isinstance(opt, dt.DistributedOptimizer):
        opt.synchronize()
    return m, opt


def flat(m: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()])


REFERENCE = flat(train(sgd, distributed=False)[0])
START = flat(model())


def check(label: str, make_opt, *, atol: float | None) -> torch.optim.Optimizer:
    """``atol``: the largest difference from one process allowed (None: an inexact algorithm,
    which must still train and leave every rank the same weights)."""
    m, opt = train(make_opt, distributed=True)
    w = flat(m)
    digests = dt.allgather_object(hashlib.sha256(w.numpy().tobytes()).hexdigest())
    assert len(set(digests)) == 1, f"{label}: ranks hold different weights"
    diff = float((w - REFERENCE).abs().max())
    if atol is None:
        assert diff > 1e-4 and float((w - START).abs().max()) > 1e-2, f"{label}: {diff}"
    else:
        assert diff <= atol, f"{label}: {diff} > {atol}"
    if R == 0:
        print(f"SLOWLINKS {label} ranks={P} max_abs_diff={diff:.2e} identical=yes", flush=True)
    return opt


full_rank = ddl.PowerSGD(rank=64, start_iter=0, min_compression_rate=0, error_feedback=False)
opt = check("powersgd-full-rank-no-error-feedback", lambda m: dt.DistributedOptimizer(
    sgd(m), named_parameters=m.named_parameters(), compression=full_rank), atol=1e-5)
assert opt.compression_stats()["compressed_calls"] >= STEPS
check("localsgd-period-1", lambda m: dt.LocalSGD(sgd(m), period=1), atol=1e-6)
check("diloco-period-1-outer-sgd-lr-1", lambda m: dt.DiLoCo(m, sgd(m), torch.optim.SGD(m.parameters(), lr=1.0),
                                                           period=1), atol=1e-6)
opt = check("powersgd-rank-1", lambda m: dt.DistributedOptimizer(
    sgd(m), named_parameters=m.named_parameters(), compression=ddl.PowerSGD(rank=1, start_iter=2)), atol=None)
assert opt.compression_stats()["compression_rate"] > 2
check("localsgd-period-4-fp16", lambda m: dt.LocalSGD(sgd(m), period=4, compression=ddl.Compression.fp16),
      atol=None)
check("diloco-period-3-overlap-2-powersgd", lambda m: dt.DiLoCo(
    m, sgd(m, 0.05), period=3, overlap=2, compression=ddl.PowerSGD(rank=2, start_iter=0)), atol=None)
dt.shutdown()
print(f"PASS slowlinks rank {R}/{P}", flush=True)
