"""GPU worker: ddl.torch on CUDA tensors, 2 ranks sharing one GPU (staging through host memory).

Run by tests/gpu/test_cuda.py (and scripts/gpu-check.sh) under ``ddlrun -np 2``. Every
check raises on failure, and ddl's abort hook ends the whole job with the message; rank 0
prints one ``CUDA <check> ok ...`` line per check and writes a JSON summary to argv[1].
"""

import json
import sys
import time

import torch
from torch import nn

import ddl
import ddl.torch as dt

dt.init()
R, P = dt.rank(), dt.size()
DEV = torch.device("cuda", dt.local_rank() % torch.cuda.device_count())
torch.cuda.set_device(DEV)
results: dict[str, object] = {"ranks": P, "device": torch.cuda.get_device_name(DEV), "checks": {}}


def ok(check: str, **figures: object) -> None:
    results["checks"][check] = figures  # type: ignore[index]
    if R == 0:
        print(f"CUDA {check} ok {figures}", flush=True)


# -- every collective on CUDA tensors: dtypes, in place and not, async ------------------------
for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64):
    x = (torch.arange(1000, device=DEV) % 7 + R).to(dtype)
    want = sum((torch.arange(1000, device=DEV) % 7 + q).to(torch.float64) for q in range(P))
    y = dt.allreduce(x, op=ddl.Sum)
    assert y.device == x.device and y.dtype == dtype and torch.equal(y.double(), want), dtype
    z = x.clone()
    assert dt.allreduce_(z, op=ddl.Sum) is z and torch.equal(z.double(), want), dtype
    h = dt.allreduce_async(x, op=ddl.Sum)
    assert torch.equal(h.wait().double(), want), dtype
    g = dt.allgather(x[: R + 1])
    assert g.device == x.device and g.shape[0] == P * (P + 1) // 2
    b = dt.broadcast(x + 1, 0)
    assert torch.equal(b.double(), (torch.arange(1000, device=DEV) % 7 + 1).double())
ok("collectives", dtypes=6)


# -- DistributedOptimizer: N ranks == one process, identical weights ---------------------------
def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)).to(DEV)


def data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return torch.randn(8 * P, 32, generator=g).to(DEV), torch.randint(0, 10, (8 * P,), generator=g).to(DEV)


def train(distributed: bool, *, amp: bool = False, accumulate: int = 1, sharded: bool = False) -> nn.Module:
    model = net()
    opt: torch.optim.Optimizer = (torch.optim.Adam(model.parameters(), lr=1e-2) if sharded else
                                  torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    if distributed:
        opt = dt.DistributedOptimizer(opt, named_parameters=model.named_parameters(), shard_optimizer_state=sharded)
    scaler = torch.amp.GradScaler("cuda", enabled=amp)
    for step in range(6):
        opt.zero_grad()
        for micro in range(accumulate):
            x, y = data(step * accumulate + micro)
            if distributed:
                x, y = x[R::P], y[R::P]
            with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
                loss = nn.functional.cross_entropy(model(x), y) / accumulate
            if distributed and micro < accumulate - 1:
                with opt.no_sync():  # type: ignore[attr-defined]
                    scaler.scale(loss).backward()
            else:
                scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    torch.cuda.synchronize()
    return model


for label, options, tol in (("sgd", {}, 1e-5), ("amp-gradscaler", {"amp": True}, 2e-3),
                            ("no_sync-3-passes", {"accumulate": 3}, 1e-5),
                            ("sharded-adam", {"sharded": True}, 1e-5)):
    ref, got = train(False, **options), train(True, **options)
    worst = max(float((a - b).abs().max()) for a, b in zip(ref.state_dict().values(), got.state_dict().values(),
                                                          strict=True))
    assert worst <= tol, (label, worst)
    digests = dt.allgather_object([float(t.double().sum()) for t in got.state_dict().values()])
    assert all(d == digests[0] for d in digests), f"{label}: ranks hold different weights"
    ok(f"equivalence-{label}", max_abs_diff=worst)

# -- a sharded checkpoint of CUDA tensors, loaded into CUDA tensors --------------------------
import tempfile  # noqa: E402

model = net()
opt = dt.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-2), named_parameters=model.named_parameters(),
                              shard_optimizer_state=True)
x, y = data(0)
nn.functional.cross_entropy(model(x[R::P]), y[R::P]).backward()
opt.step()
folder = dt.broadcast_object(tempfile.mkdtemp() if R == 0 else None, 0)
dt.checkpoint.save(folder, model=model, optimizer=opt)
again = net()
reopt = dt.DistributedOptimizer(torch.optim.Adam(again.parameters(), lr=1e-2), named_parameters=again.named_parameters(),
                                shard_optimizer_state=True)
dt.checkpoint.load(folder, model=again, optimizer=reopt)
assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values(), strict=True))
assert all(v.device == DEV for s in reopt.state.values() for v in s.values() if v.dim() > 0)
ok("sharded-checkpoint", state_tensors=sum(len(s) for s in reopt.state.values()))

# -- sparse_as_dense on CUDA -----------------------------------------------------------------
emb = nn.Embedding(50, 8, sparse=True).to(DEV)
opt = dt.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.1), named_parameters=emb.named_parameters(),
                              sparse_as_dense=True)
emb(torch.tensor([R, 10 + R], device=DEV)).sum().backward()
opt.step()
ok("sparse_as_dense")

# -- staging overlaps backward: the device->host copies are on a side stream ------------------
model = nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(8)]).to(DEV)
opt = dt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters(),
                              bucket_cap_mb=4, first_bucket_mb=1)
x = torch.randn(256, 1024, device=DEV)
for _ in range(3):
    opt.zero_grad(set_to_none=False)
    model(x).square().mean().backward()
    opt.step()
pointers = [b.buffer.data_ptr() for b in opt._reducer.buckets]  # type: ignore[attr-defined]
sides = {id(b.device) for b in opt._reducer.buckets}  # type: ignore[attr-defined]
torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(5):
    opt.zero_grad(set_to_none=False)
    model(x).square().mean().backward()
    opt.step()
torch.cuda.synchronize()
step_ms = (time.perf_counter() - t0) / 5 * 1e3
assert pointers == [b.buffer.data_ptr() for b in opt._reducer.buckets], "pinned buffers were allocated again"  # type: ignore[attr-defined]
assert all(b.buffer.is_pinned() for b in opt._reducer.buckets)  # type: ignore[attr-defined]
ok("staging", buckets=len(pointers), side_streams=len(sides), step_ms=round(step_ms, 2))

if R == 0 and len(sys.argv) > 1:
    with open(sys.argv[1], "w") as f:
        json.dump(results, f, indent=1)
dt.shutdown()
