"""Horovod's torch API under mpiexec (run at 3 ranks): SyncBatchNorm and join equal one
process, process sets, Horovod's gradient conventions, sparse gradients, an optimizer on a
rank outside its process set, the Adasum optimizer, a torch.compile'd model under
DistributedOptimizer."""

from __future__ import annotations

import sys
import time
import warnings

import torch
from torch import nn

import ddl.torch as hvd
from ddl.reduction import adasum

torch.set_num_threads(1)
hvd.init()
R, P = hvd.rank(), hvd.size()
assert P == 3, "this worker runs at 3 ranks"


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / max(float(b.abs().max()), 1e-30))


def check_sync_batch_norm() -> None:
    """3 ranks on 4 samples each == one process on 12 with torch.nn.BatchNorm2d (training mode)."""
    def make(bn: type) -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(2, 3, 3), bn(3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 4 * 4, 5)).double()

    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(12, 2, 6, 6, generator=gen, dtype=torch.float64) for _ in range(4)]
    ys = [torch.randint(0, 5, (12,), generator=gen) for _ in range(4)]
    ref = make(nn.BatchNorm2d)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.2, momentum=0.9)
    sync = hvd.SyncBatchNorm.convert_sync_batchnorm(make(nn.BatchNorm2d))
    assert isinstance(sync[1], hvd.SyncBatchNorm)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(sync.parameters(), lr=0.2, momentum=0.9),
                                   named_parameters=sync.named_parameters())
    lo, hi = 4 * R, 4 * R + 4
    for x, y in zip(xs, ys, strict=True):
        ref_opt.zero_grad()
        nn.functional.cross_entropy(ref(x), y).backward()
        ref_opt.step()
        opt.zero_grad()
        nn.functional.cross_entropy(sync(x[lo:hi]), y[lo:hi]).backward()
        opt.step()
    worst = max(rel(a, b) for a, b in zip(sync.state_dict().values(), ref.state_dict().values(), strict=True)
                if a.is_floating_point())
    assert worst <= 1e-5, worst
    sync.eval()
    ref.eval()
    assert rel(sync(xs[0]), ref(xs[0])) <= 1e-5  # eval mode uses the synced running statistics
    print(f"EQUIV syncbatchnorm ranks={P} max_rel_diff={worst:.2e}", flush=True)


def check_join() -> None:
    """Ranks with 3, 5 and 7 batches finish together and equal one process over the same batches
    (run with DDL_JOIN_AVERAGE=contributors: Average divides by the ranks still working)."""
    steps = [3, 5, 7]
    gen = torch.Generator().manual_seed(2)
    data = [[(torch.randn(6, 4, generator=gen, dtype=torch.float64), torch.randn(6, 2, generator=gen,
                                                                                   dtype=torch.float64))
             for _ in range(steps[r])] for r in range(P)]

    def make() -> nn.Module:
        torch.manual_seed(3)
        return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)).double()

    model = make()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters())
    for x, y in data[R]:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    start = time.monotonic()
    last = hvd.join()
    waited = time.monotonic() - start
    # Joined ranks stopped updating; the usual Horovod ending: take the last rank's model.
    hvd.broadcast_parameters(model.state_dict(), root_rank=last)
    ref = make()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for s in range(max(steps)):
        working = [r for r in range(P) if s < steps[r]]
        x = torch.cat([data[r][s][0] for r in working])
        y = torch.cat([data[r][s][1] for r in working])
        ref_opt.zero_grad()
        nn.functional.mse_loss(ref(x), y).backward()
        ref_opt.step()
    worst = max(rel(a, b) for a, b in zip(model.parameters(), ref.parameters(), strict=True))
    assert last == 2, last
    assert worst <= 1e-12, worst
    print(f"EQUIV join batches={steps} last={last} max_rel_diff={worst:.2e} waited={waited:.2f}s", flush=True)


def check_process_sets() -> None:
    evens = hvd.add_process_set([0, 2])
    assert evens.ranks == [0, 2] and evens.included() == (R != 1)
    if evens.included():
        total = hvd.allreduce(torch.tensor([float(R)]), op=hvd.Sum, process_set=evens)
        assert float(total) == 2.0, total
        root = hvd.broadcast(torch.tensor([R]), root_rank=2, process_set=evens)
        assert int(root) == 2
        assert hvd.allgather(torch.tensor([R]), process_set=evens).tolist() == [0, 2]
        assert evens.rank() == (0 if R == 0 else 1) and evens.size() == 2
        model = nn.Linear(3, 1)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), process_set=evens)
        model(torch.ones(2, 3) * (R + 1)).sum().backward()
        opt.step()
        w = hvd.allgather(model.weight.detach(), process_set=evens)
        assert torch.equal(w[0], w[1])
    else:
        try:
            hvd.allreduce(torch.ones(1), process_set=evens)
            raise AssertionError("a rank outside the set got through")
        except ValueError as exc:
            assert "not in" in str(exc)
    # The world goes on alongside, and the set can go.
    assert float(hvd.allreduce(torch.ones(1), op=hvd.Sum)) == P
    assert hvd.remove_process_set(evens) and evens.process_set_id is None
    try:
        hvd.add_process_set([0, 1] if R == 0 else [0, 2])
        raise AssertionError("different sets on different ranks were accepted")
    except (hvd.MismatchError, ValueError) as exc:
        assert "add_process_set" in str(exc) or "match" in str(exc), exc
    print(f"PASS process_sets rank {R}", flush=True)


def check_gradient_conventions() -> None:
    """Horovod 0.28.1's gradient scaling: an allgather's gradient is this rank's rows of the
    output gradients averaged over the ranks; a reducescatter's the allgathered gradient,
    times the ranks for Sum, times the scale factors."""
    x = torch.full((R + 1, 2), float(R), requires_grad=True)
    (hvd.allgather(x, name="ag") * (R + 1)).sum().backward()
    assert torch.equal(x.grad, torch.full((R + 1, 2), 2.0)), x.grad  # mean of 1, 2, 3 (the sum would be 6)
    xs = [torch.ones(R + 1, requires_grad=True), torch.ones(2, 3, requires_grad=True)]
    outs = hvd.grouped_allgather(xs, name="gag")
    sum((o * (R + 1)).sum() for o in outs).backward()
    assert all(torch.equal(t.grad, torch.full_like(t, 2.0)) for t in xs), [t.grad for t in xs]
    rows = torch.arange(1.0, 4.0).repeat_interleave(2)[:, None]  # rank q's output gradient is q + 1
    for op, pre, post, factor in ((hvd.Sum, 1.0, 1.0, P), (hvd.Average, 1.0, 1.0, 1), (hvd.Sum, 0.5, 3.0, 1.5 * P)):
        y = torch.ones(2 * P, 2, requires_grad=True)
        (hvd.reducescatter(y, op=op, prescale_factor=pre, postscale_factor=post) * (R + 1)).sum().backward()
        assert torch.equal(y.grad, rows.expand(-1, 2) * factor), (op, y.grad)
    try:
        hvd.reducescatter(torch.ones(2 * P, dtype=torch.int32), op=hvd.Adasum)
        raise AssertionError("reducescatter took Adasum")
    except RuntimeError as exc:  # Horovod's error class
        assert "Adasum" in str(exc), exc
    print(f"PASS gradient_conventions rank {R}", flush=True)


def check_sparse() -> None:
    """Horovod's sparse path: the handle is a function; DistributedOptimizer allgathers sparse
    gradients (a rank that got none joins with an empty one) and trains like one process."""
    gen = torch.Generator().manual_seed(7)
    dense = [torch.where(torch.rand(5, 3, generator=gen) > 0.6, torch.randn(5, 3, generator=gen), 0.0)
             for _ in range(P)]
    handle = hvd.sparse_allreduce_async(dense[R].to_sparse(), name="sp", op=hvd.Average)
    torch.testing.assert_close(handle().to_dense(), sum(dense) / P)

    class Net(nn.Module):
        def __init__(self, dense_layer: bool) -> None:
            super().__init__()
            torch.manual_seed(8)
            self.emb = nn.Embedding(10, 2, sparse=True)
            self.lin = nn.Linear(3, 2) if dense_layer else None

        def forward(self, x: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
            out = self.lin(x) if self.lin is not None else torch.zeros(len(x), 2)
            used = tok > 0  # token 0: no embedding; rank 2's samples have none
            if bool(used.any()):
                out = out + torch.zeros_like(out).index_put((used.nonzero()[:, 0],), self.emb(tok[used]))
            return out

    xs = torch.randn(4, 12, 3, generator=gen)
    toks = torch.randint(1, 10, (4, 12), generator=gen)
    toks[:, 8:] = 0
    worst = 0.0
    # SGD with a dense layer beside; SparseAdam (sparse gradients only), on the wire sparse or dense.
    for make_opt, dense_layer, as_dense in ((lambda ps: torch.optim.SGD(ps, lr=0.3), True, False),
                                            (lambda ps: torch.optim.SparseAdam(ps, lr=0.1), False, False),
                                            (lambda ps: torch.optim.SparseAdam(ps, lr=0.1), False, True)):
        ref, dist = Net(dense_layer), Net(dense_layer)
        ref_opt = make_opt(list(ref.parameters()))
        opt = hvd.DistributedOptimizer(make_opt(list(dist.parameters())), named_parameters=dist.named_parameters(),
                                       sparse_as_dense=as_dense)
        for x, tok in zip(xs, toks, strict=True):
            ref_opt.zero_grad()
            ref(x, tok).pow(2).mean().backward()
            ref_opt.step()
            opt.zero_grad()
            loss = dist(x[4 * R : 4 * R + 4], tok[4 * R : 4 * R + 4]).pow(2).mean()
            if loss.requires_grad:
                loss.backward()
            assert (dist.emb.weight.grad is None) == (R == 2)
            opt.step()
            assert dist.emb.weight.grad.is_sparse
        worst = max(worst, *(rel(a, b) for a, b in zip(dist.parameters(), ref.parameters(), strict=True)))
        assert worst <= 1e-6, (as_dense, worst)
        hashes = hvd.allgather_object([p.detach().sum().item() for p in dist.parameters()])
        assert all(h == hashes[0] for h in hashes), hashes
    print(f"EQUIV sparse-gradients ranks={P} max_rel_diff={worst:.2e}", flush=True)


def check_optimizer_outside_its_process_set() -> None:
    """Horovod's rule: on a rank outside the optimizer's set, step() applies the local gradient."""
    pair = hvd.add_process_set([0, 2])

    def make() -> nn.Module:
        torch.manual_seed(9)
        return nn.Linear(3, 1)

    model, local = make(), make()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), process_set=pair)
    assert any("not in" in str(w.message) for w in caught) == (R == 1), [str(w.message) for w in caught]
    x = torch.ones(2, 3) * (R + 1)
    model(x).sum().backward()
    opt.step()
    local(x).sum().backward()
    torch.optim.SGD(local.parameters(), lr=0.1).step()
    if R == 1:
        assert torch.equal(model.weight, local.weight)
    else:
        w = hvd.allgather(model.weight.detach(), process_set=pair)
        assert torch.equal(w[0], w[1]) and not torch.equal(model.weight, local.weight)
    assert hvd.remove_process_set(pair)
    print(f"PASS optimizer_outside_process_set rank {R}", flush=True)


def check_adasum() -> None:
    torch.manual_seed(4)
    model = nn.Linear(5, 2).double()
    start = [p.detach().clone() for p in model.parameters()]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5), op=hvd.Adasum)
    x = torch.randn(4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(10 + R))
    model(x).pow(2).sum().backward()
    grads = [p.grad.detach().clone() for p in model.parameters()]
    opt.step()
    everyone = [hvd.allgather(g.reshape(1, -1)) for g in grads]
    for p, s, g in zip(model.parameters(), start, everyone, strict=True):
        expect = s.reshape(-1) + torch.from_numpy(adasum.combine([-0.5 * g[q].numpy() for q in range(P)]))
        assert rel(p.detach().reshape(-1), expect) <= 1e-12
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = hvd.allgather(flat.reshape(1, -1))
    assert all(torch.equal(gathered[0], gathered[q]) for q in range(P))
    print(f"PASS adasum rank {R}", flush=True)


def check_compile() -> None:
    """A torch.compile'd model trains under DistributedOptimizer (hooks outside the graph) like eager."""
    def make() -> nn.Module:
        torch.manual_seed(5)
        return nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 3))

    gen = torch.Generator().manual_seed(6)
    batches = [(torch.randn(9, 6, generator=gen), torch.randint(0, 3, (9,), generator=gen)) for _ in range(4)]
    results = []
    for compiled in (False, True):
        model = make()
        run = torch.compile(model, backend="aot_eager") if compiled else model
        opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01),
                                       named_parameters=model.named_parameters())
        for x, y in batches:
            opt.zero_grad()
            nn.functional.cross_entropy(run(x[3 * R : 3 * R + 3]), y[3 * R : 3 * R + 3]).backward()
            opt.step()
        results.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    worst = rel(results[1], results[0])
    assert worst <= 1e-6, worst
    print(f"EQUIV torch.compile ranks={P} max_rel_diff={worst:.2e}", flush=True)


for check in (check_sync_batch_norm, check_join, check_process_sets, check_gradient_conventions, check_sparse,
              check_optimizer_outside_its_process_set, check_adasum, check_compile):
    check()
hvd.shutdown()
print(f"PASS horovod torch rank {R}/{P}", flush=True)
sys.exit(0)
