"""ddl.torch under mpiexec: N ranks on B/N samples must train like one process on B samples."""

from __future__ import annotations

import contextlib
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


class LateNet(Net):
    """Net with a layer that joins the forward pass, and the optimizer, at step LATE."""

    def __init__(self, sparse: bool = False) -> None:
        super().__init__(sparse)
        self.extra = nn.Linear(12, 4)
        self.use_extra = False

    def forward(self, tok: torch.Tensor) -> torch.Tensor:
        out = super().forward(tok)
        if self.use_extra:
            out = out + self.extra(nn.functional.one_hot(tok, 12).float())
        return out


class OrderNet(nn.Module):
    """Layers declared in another order than backward reaches them; in step 0 the order of
    two branches differs between even and odd ranks, so ranks observe different orders."""

    def __init__(self, sparse: bool = False) -> None:
        super().__init__()
        self.head = nn.Linear(16, 4)
        self.right = nn.Linear(16, 16)
        self.left = nn.Linear(16, 16)
        self.inp = nn.Linear(6, 16)
        self.emb = nn.Embedding(12, 6, sparse=sparse)
        self.step = 0

    def forward(self, tok: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(self.emb(tok)))
        if self.step > 0 or R % 2 == 0:
            u, v = self.left(h), self.right(h)
        else:
            v, u = self.right(h), self.left(h)
        return self.head(torch.relu(u + v))


LATE = 5
LAST: dict[str, object] = {}  # the last distributed run's optimizer and first-step gradient order


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    tok = torch.randint(1, 12, (B,), generator=g)
    tok[:3] = 0  # only the first shard uses `rare`
    return tok, torch.randint(0, 4, (B,), generator=g)


def train(make_opt, *, distributed: bool, k: int = 1, seed: int = 0, init_seed: int | None = None,
          scaler: bool = False, model_cls=Net, late: str | None = None, micro: bool = False,
          **options) -> nn.Module:
    torch.manual_seed(seed if init_seed is None else init_seed)
    model = model_cls(sparse=options.pop("sparse", False))
    if distributed:
        dt.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = make_opt([p for n, p in model.named_parameters() if not n.startswith("extra.")])
    arrived: list[str] = []
    if distributed:
        names = {p: n for n, p in model.named_parameters()}
        hooks = [p.register_post_accumulate_grad_hook(lambda q: arrived.append(names[q]))
                 for p in model.parameters() if p.requires_grad]
        opt = dt.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                      backward_passes_per_step=k, **options)
        LAST.update(opt=opt, arrived=arrived, model=model)
    gs = torch.amp.GradScaler("cpu", init_scale=1024.0) if scaler else None
    for step in range(STEPS):
        model.step = step
        if late and step == LATE:  # behind the wrapper's back: it must notice
            model.use_extra = True
            if late == "append":
                opt.param_groups[0]["params"].extend(model.extra.parameters())
            else:
                getattr(opt, "optimizer", opt).add_param_group({"params": list(model.extra.parameters()), "lr": 0.05})
        tok, y = batch(step)
        if distributed:
            n = B // P
            tok, y = tok[R * n : (R + 1) * n], y[R * n : (R + 1) * n]
        opt.zero_grad()
        if micro and distributed:
            # no_sync with 1-3 micro-batches per step, each loss weighted by its share.
            m = 1 + step % 3
            for i, (tc, yc) in enumerate(zip(tok.chunk(m), y.chunk(m), strict=True)):
                loss = nn.functional.cross_entropy(model(tc), yc) * (len(tc) / len(tok))
                with opt.no_sync() if i < m - 1 else contextlib.nullcontext():
                    loss.backward()
            opt.step()
            continue
        for tc, yc in zip(tok.chunk(k), y.chunk(k), strict=True):
            loss = nn.functional.cross_entropy(model(tc), yc) / k
            (gs.scale(loss) if gs else loss).backward()
        if distributed and step == 0:
            for h in hooks:
                h.remove()
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
    ref_options = {k: options[k] for k in ("scaler", "sparse", "model_cls", "late") if k in options}
    ref = train(make_opt, distributed=False, **ref_options)
    got = train(make_opt, distributed=True, **options)
    worst = 0.0
    for (name, a), b in zip(ref.state_dict().items(), got.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=rtol, atol=atol, msg=lambda m, n=name: f"{label} {n}: {m}")
        worst = max(worst, float((b - a).abs().max()))
    hashes = dt.allgather_object(digest(got))
    assert len(set(hashes)) == 1, f"{label}: ranks hold different weights"
    fresh = options.get("model_cls", Net)().state_dict().values()
    moved = max(float((a - b).abs().max()) for a, b in zip(ref.state_dict().values(), fresh, strict=True))
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
check_equivalent("sgd-sparse-allgathered", plain_sgd, sparse=True)  # Horovod's sparse path: .grad stays sparse
assert LAST["model"].emb.weight.grad.is_sparse
check_equivalent("sgd-small-buckets", sgd, bucket_cap_mb=0.0005, first_bucket_mb=0.0001)
check_equivalent("sgd-predivide", sgd, gradient_predivide_factor=float(P))
check_equivalent("sgd-param-appended-after-construction", sgd, model_cls=LateNet, late="append")
check_equivalent("adam-inner-add_param_group", adam, model_cls=LateNet, late="inner")
check_equivalent("sgd-no_sync-1-to-3-passes", sgd, micro=True)
check_equivalent("sgd-rebucketed-order", sgd, model_cls=OrderNet, bucket_cap_mb=1e-6, first_bucket_mb=1e-6)

# The re-planned buckets: one plan on every rank, in rank 0's first-step order (odd ranks
# saw another), not the declared order reversed.
opt, model = LAST["opt"], LAST["model"]
plan = [[n for n, p in model.named_parameters() for q in b.params if p is q] for b in opt._reducer.buckets]
assert all(len(b) == 1 for b in plan), plan
assert len({str(x) for x in dt.allgather_object(plan)}) == 1, "ranks bucket differently"
declared = [n for n, p in model.named_parameters()]
assert [b[0] for b in plan] != declared[::-1], plan
if R == 0:
    assert [b[0] for b in plan] == LAST["arrived"][: len(plan)], (plan, LAST["arrived"])
elif R % 2 == 1:
    assert [b[0] for b in plan] != LAST["arrived"][: len(plan)], "odd ranks should have seen another order"

# Gradients staged through host memory (as CUDA ones are), with copies that land late: the
# hooks return at once, every allreduce starts only once its copy has landed (else the sums
# would hold last step's values), and training equals one process.
from ddl.torch import staging as staging_module  # noqa: E402

late = staging_module.LateCopies(0.02)
real_device_for = staging_module.device_for
staging_module.device_for = lambda params: late
try:
    check_equivalent("sgd-staged-copies-landing-late", sgd)
finally:
    staging_module.device_for = real_device_for
# Some copies were still in flight when their hooks returned (a loaded machine may land one
# before the caller looks, so not every one), and training still equals one process.
assert late.started > 0 and not all(late.landed_early), (late.started, late.landed_early)

# gradient_predivide_factor: the wire carries grad/factor summed (not an Average), and
# the result is the average. Unused parameters: one no rank uses keeps grad=None; one only
# rank 0 uses gets rank 0's gradient / P, and its bucket starts when backward ends.
sent: list[tuple[object, torch.Tensor]] = []
from ddl.runtime import api  # noqa: E402 - what the adapter calls

_real_async = api.allreduce_async


def _spy(x, **kw):
    sent.append((kw.get("op"), torch.from_numpy(x.copy())))
    return _real_async(x, **kw)


torch.manual_seed(0)
net = nn.ModuleDict({"used": nn.Linear(3, 2), "rare": nn.Linear(3, 2), "never": nn.Linear(3, 2)})
opt = dt.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), named_parameters=net.named_parameters(),
                              gradient_predivide_factor=4.0)
x = torch.full((2, 3), float(R + 1))
loss = net["used"](x).sum() + (net["rare"](x).sum() if R == 0 else 0)
api.allreduce_async = _spy
try:
    loss.backward()
    assert all(b.handle is not None for b in opt._reducer.buckets), "a bucket waited for step()"
    local = {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}
    buckets = list(opt._reducer.buckets)  # synchronize() re-plans them in the observed order
    opt.synchronize()
finally:
    api.allreduce_async = _real_async
assert sent and all(op is ddl.Sum for op, _ in sent), [op for op, _ in sent]
for (_, wire), b in zip(sent, buckets, strict=True):
    for j, p in enumerate(b.params):
        name = next(n for n, q in net.named_parameters() if q is p)
        want = local[name] / 4.0 if name in local else torch.zeros_like(p)
        assert torch.equal(wire[b.offsets[j] : b.offsets[j] + p.numel()].view(p.shape), want), name
everyone = dt.allgather_object(local)
for name, p in net.named_parameters():
    if name.startswith("never"):
        assert p.grad is None, name
        continue
    want = sum(g[name] for g in everyone if name in g) / P
    torch.testing.assert_close(p.grad, want, rtol=1e-6, atol=1e-7, msg=name)

# A gradient sparse on some ranks and dense on others has no one-process meaning: refused,
# clearly, on every rank (the reduced flags tell each rank alike).
model = Net(sparse=R == 0)
opt = dt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters())
nn.functional.cross_entropy(model(batch(0)[0]), batch(0)[1]).backward()
try:
    opt.step()
    raise AssertionError("sparse and dense gradients of one parameter accepted")
except RuntimeError as exc:
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
part = dt.reducescatter(torch.ones(2 * P, 3), name="rs", op=ddl.Sum)  # Horovod's default is Average
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
assert torch.equal(x.grad, torch.full((R + 1, 2), (P + 1) / 2)), x.grad  # averaged, as Horovod 0.28.1

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
