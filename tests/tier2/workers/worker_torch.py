"""ddl.torch under mpiexec: N ranks on B/N samples must train like one process on B samples."""

from __future__ import annotations

import hashlib
import sys

import torch
from torch import nn

import ddl
import ddl.torch as dt

torch.set_num_threads(1)
dt.init()
R, P = dt.rank(), dt.size()
B, STEPS = 48, 20


class Net(nn.Module):
    """A small MLP with a tied pair of layers, a frozen layer and a head only some samples use."""

    def __init__(self, sparse: bool = False) -> None:
        super().__init__()
        self.emb = nn.Embedding(12, 6, sparse=sparse)
        self.frozen = nn.Linear(6, 6)
        self.frozen.requires_grad_(False)
        self.a = nn.Linear(6, 16)
        self.b = nn.Linear(16, 16)
        self.c = nn.Linear(16, 16)
        self.c.weight = self.b.weight  # tied
        self.head = nn.Linear(16, 4)
        self.rare = nn.Linear(16, 4)  # used only by samples with token 0

    def forward(self, tok: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(torch.tanh(self.frozen(self.emb(tok)))))
        h = torch.relu(self.c(torch.relu(self.b(h))))
        out = self.head(h)
        use = tok == 0
        if bool(use.any()):
            out = out + torch.where(use[:, None], self.rare(h), torch.zeros_like(out))
        return out


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    tok = torch.randint(1, 12, (B,), generator=g)
    tok[:3] = 0  # only the first shard uses `rare`
    return tok, torch.randint(0, 4, (B,), generator=g)


def train(make_opt, *, distributed: bool, k: int = 1, seed: int = 0, init_seed: int | None = None,
          scaler: bool = False, **options) -> nn.Module:
    torch.manual_seed(seed if init_seed is None else init_seed)
    model = Net(sparse=options.pop("sparse", False))
    if distributed:
        dt.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = make_opt(model.parameters())
    if distributed:
        opt = dt.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                      backward_passes_per_step=k, **options)
    gs = torch.amp.GradScaler("cpu", init_scale=1024.0) if scaler else None
    for step in range(STEPS):
        tok, y = batch(step)
        if distributed:
            n = B // P
            tok, y = tok[R * n : (R + 1) * n], y[R * n : (R + 1) * n]
        opt.zero_grad()
        for tc, yc in zip(tok.chunk(k), y.chunk(k), strict=True):
            loss = nn.functional.cross_entropy(model(tc), yc) / k
            (gs.scale(loss) if gs else loss).backward()
        if gs is None:
            opt.step()
            continue
        if distributed:
            opt.synchronize()
        gs.unscale_(opt)
        nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        if distributed:
            with opt.skip_synchronize():
                gs.step(opt)
        else:
            gs.step(opt)
        gs.update()
    return model


def digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def check_equivalent(label: str, make_opt, *, rtol: float = 1e-5, atol: float = 1e-6, **options) -> None:
    ref_options = {k: options[k] for k in ("scaler", "sparse") if k in options}
    ref = train(make_opt, distributed=False, **ref_options)
    got = train(make_opt, distributed=True, **options)
    worst = 0.0
    for (name, a), b in zip(ref.state_dict().items(), got.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=rtol, atol=atol, msg=lambda m, n=name: f"{label} {n}: {m}")
        worst = max(worst, float((b - a).abs().max()))
    hashes = dt.allgather_object(digest(got))
    assert len(set(hashes)) == 1, f"{label}: ranks hold different weights"
    moved = max(float((a - b).abs().max()) for a, b in zip(ref.state_dict().values(),
                                                         Net().state_dict().values(), strict=True))
    assert moved > 0
    if R == 0:
        print(f"EQUIV {label} ranks={P} max_abs_diff={worst:.2e} (rtol={rtol:g} atol={atol:g}) identical=yes", flush=True)


def sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-3)


def plain_sgd(params):  # torch's SGD takes sparse gradients only without momentum and decay
    return torch.optim.SGD(params, lr=0.1)


def adam(params):
    return torch.optim.Adam(params, lr=1e-2)


check_equivalent("sgd-momentum-wd", sgd)
check_equivalent("adam", adam)
check_equivalent("sgd-backward_passes_per_step=2", sgd, k=2)
check_equivalent("adam-fp16-compression", adam, rtol=2e-2, atol=2e-3, compression=ddl.Compression.fp16)
check_equivalent("sgd-broadcast-from-different-inits", sgd, init_seed=R)
check_equivalent("sgd-gradscaler-clip", sgd, scaler=True)
check_equivalent("sgd-sparse_as_dense", plain_sgd, sparse=True, sparse_as_dense=True)
check_equivalent("sgd-small-buckets", sgd, bucket_cap_mb=0.0005, first_bucket_mb=0.0001)

# A sparse gradient without sparse_as_dense is refused, clearly, on every rank.
model = Net(sparse=True)
opt = dt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters())
try:
    nn.functional.cross_entropy(model(batch(0)[0]), batch(0)[1]).backward()
    raise AssertionError("sparse gradient accepted")
except TypeError as exc:
    assert "emb.weight" in str(exc) and "sparse_as_dense" in str(exc), exc

# broadcast_optimizer_state: Adam state exists on the root only (lazily created elsewhere).
torch.manual_seed(0)
model = Net()
opt = torch.optim.Adam(model.parameters(), lr=1e-3 * (R + 1))
if R == 0:
    nn.functional.cross_entropy(model(batch(0)[0]), batch(0)[1]).backward()
    opt.step()
dt.broadcast_optimizer_state(opt, root_rank=0)
assert opt.param_groups[0]["lr"] == 1e-3 and len(opt.state) == sum(1 for p in model.parameters() if p.requires_grad)
states = dt.allgather_object({k: {n: v.clone() for n, v in s.items()} for k, s in opt.state_dict()["state"].items()})
for other in states:
    for k, s in states[0].items():
        for n, v in s.items():
            assert torch.equal(other[k][n], v), (k, n)

# Tensor collectives: dtypes, shapes, async, in place, non-contiguous.
for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64):
    x = (torch.arange(10) + R).to(dtype)
    got = dt.allreduce(x, op=ddl.Sum, name=f"sum.{dtype}")
    want = (torch.arange(10) * P + P * (P - 1) // 2).to(dtype)
    assert got.dtype == dtype and torch.equal(got, want), (dtype, got)
x = torch.full((3, 4), float(R))
h = dt.allreduce_async_(x, name="async")
assert dt.synchronize(h) is x and torch.allclose(x, torch.full((3, 4), (P - 1) / 2))
nc = torch.zeros(4, 6)[:, ::2]
nc += R
dt.allreduce_(nc, op=ddl.Max, name="noncontig")
assert torch.equal(nc, torch.full((4, 3), float(P - 1)))
rows = dt.allgather(torch.full((R + 1, 2), R, dtype=torch.int64), name="gather")
assert rows.shape == (P * (P + 1) // 2, 2) and rows[-1, 0].item() == P - 1
b = torch.full((5,), float(R))
dt.broadcast_(b, root_rank=P - 1, name="bcast")
assert torch.equal(b, torch.full((5,), float(P - 1)))
part = dt.reducescatter(torch.ones(2 * P, 3), name="rs")
assert part.shape == (2, 3) and torch.equal(part, torch.full((2, 3), float(P)))
outs = dt.grouped_allreduce([torch.ones(3), torch.ones(2, 2, dtype=torch.float64)], op=ddl.Sum, name="grp")
assert [o.shape for o in outs] == [(3,), (2, 2)] and all(bool((o == P).all()) for o in outs)
fp16 = dt.allreduce(torch.full((100,), 6e4), compression=ddl.Compression.fp16, name="fp16")
assert torch.allclose(fp16, torch.full((100,), 6e4), rtol=1e-3)
assert dt.broadcast_object({"r": torch.tensor([R])}, root_rank=0)["r"].item() == 0

# Autograd through allreduce and allgather: each rank's loss weights the result by (R + 1).
x = torch.full((3,), float(R + 1), requires_grad=True)
(dt.allreduce(x, op=ddl.Sum, name="ag.sum") * (R + 1)).sum().backward()
assert torch.equal(x.grad, torch.full((3,), P * (P + 1) / 2)), x.grad
x = torch.ones(R + 1, 2, requires_grad=True)
(dt.allgather(x, name="ag.gather") * (R + 1)).sum().backward()
assert torch.equal(x.grad, torch.full((R + 1, 2), P * (P + 1) / 2)), x.grad

# Different models on different ranks: a MismatchError on every rank, naming the parameter.
if P > 1:
    other = nn.Linear(3, 3 + (R == 1))
    try:
        dt.DistributedOptimizer(torch.optim.SGD(other.parameters(), lr=0.1), named_parameters=other.named_parameters())
        raise AssertionError("different models accepted")
    except ddl.MismatchError as exc:
        assert "weight" in str(exc), exc

dt.shutdown()
print(f"PASS torch rank {R}/{P}", flush=True)
sys.exit(0)
