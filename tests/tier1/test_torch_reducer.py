"""ddl.torch's reducer in one process: bucket re-planning, early launches, no_sync, late parameters."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

import ddl  # noqa: E402
import ddl.torch as dt  # noqa: E402

TINY = {"bucket_cap_mb": 1e-6, "first_bucket_mb": 1e-6}  # one parameter per bucket


@pytest.fixture(scope="module", autouse=True)
def _world() -> None:
    dt.init()


class Reversed(nn.Module):
    """Layers declared in the opposite order to their use, so gradients arrive in declared order."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.out = nn.Linear(8, 3)
        self.mid = nn.Linear(8, 8)
        self.inp = nn.Linear(4, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.mid(torch.relu(self.inp(x)))))


def loss(m: nn.Module, seed: int = 1) -> torch.Tensor:
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(seed))
    return nn.functional.cross_entropy(m(x), torch.tensor([0, 1, 2, 0, 1, 2]))


def wrap(m: nn.Module, **kw) -> dt.DistributedOptimizer:
    return dt.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=m.named_parameters(), **kw)


def arrival_order(m: nn.Module) -> list[str]:
    """The order in which the gradients of ``m`` arrive in backward (hooks run in the order they are added)."""
    seen: list[str] = []
    for n, p in m.named_parameters():
        p.register_post_accumulate_grad_hook(lambda _p, n=n: seen.append(n))
    loss(m).backward()
    for p in m.parameters():
        p.grad = None
    return seen


def bucket_names(opt: dt.DistributedOptimizer, m: nn.Module) -> list[list[str]]:
    name = {p: n for n, p in m.named_parameters()}
    return [[name[p] for p in b.params] for b in opt._reducer.buckets]


# -- buckets re-planned once from the observed order ----------------------------------
def test_buckets_follow_the_observed_gradient_order_from_the_second_step() -> None:
    m = Reversed()
    observed = arrival_order(Reversed())
    declared = [n for n, _ in m.named_parameters()]
    assert observed != declared[::-1]  # the model's point: use order differs from declared order
    opt = wrap(m, **TINY)
    assert bucket_names(opt, m) == [[n] for n in declared[::-1]]
    launched: list[str] = []
    launch = opt._reducer._launch
    opt._reducer._launch = lambda b: (launched.append(b.name), launch(b))[1]
    for _ in range(3):
        opt.zero_grad()
        launched.clear()
        loss(m).backward()
        opt.step()
        if _ == 0:
            first = list(launched)
    assert bucket_names(opt, m) == [[n] for n in observed]
    # From the second step on, buckets start in their own order, each as its gradient lands.
    assert launched == [f"{opt._prefix}.r.b{k}" for k in range(len(observed))]
    assert first != sorted(first, key=lambda s: int(s.rsplit("b", 1)[1]))


def test_the_plan_is_rebuilt_once_and_a_copy_keeps_it() -> None:
    import pickle

    m = Reversed()
    opt = wrap(m, **TINY)
    loss(m).backward()
    opt.step()
    assert opt._reducer.agreed is not None and opt._reducer._observed is None  # done watching
    plan = opt._reducer.plan
    buckets = opt._reducer.buckets
    opt.zero_grad()
    loss(m).backward()
    opt.step()
    assert opt._reducer.buckets is buckets  # not re-planned again
    clone = pickle.loads(pickle.dumps(opt))
    assert clone._reducer.plan == plan and clone._reducer.agreed == opt._reducer.agreed


def test_parameters_no_rank_used_get_buckets_of_their_own_at_the_end() -> None:
    m = nn.ModuleDict({"a": nn.Linear(3, 3), "unused": nn.Linear(3, 3), "b": nn.Linear(3, 3)})
    opt = dt.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), named_parameters=m.named_parameters())
    assert len(opt._reducer.buckets) == 1  # everything fits one bucket at first
    m["b"](m["a"](torch.ones(2, 3))).sum().backward()
    opt.step()
    names = bucket_names(opt, m)
    assert names[-1] == ["unused.bias", "unused.weight"] and all("unused" not in n for b in names[:-1] for n in b)


# -- buckets waiting on an unused parameter start when backward ends -------------------
def test_a_bucket_waiting_on_an_unused_parameter_starts_when_backward_ends() -> None:
    m = nn.ModuleDict({"used": nn.Linear(3, 3), "unused": nn.Linear(3, 3)})
    opt = dt.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), named_parameters=m.named_parameters())
    (bucket,) = opt._reducer.buckets
    m["used"](torch.ones(2, 3)).sum().backward()
    assert bucket.handle is not None  # started by the end-of-backward callback, not by step()
    opt.step()
    assert m["unused"].weight.grad is None


def test_with_several_passes_per_step_waiting_buckets_start_after_the_last() -> None:
    m = nn.ModuleDict({"used": nn.Linear(3, 3), "once": nn.Linear(3, 3)})
    opt = dt.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), named_parameters=m.named_parameters(),
                                  backward_passes_per_step=2)
    (bucket,) = opt._reducer.buckets
    m["once"](m["used"](torch.ones(2, 3))).sum().backward()
    assert bucket.handle is None
    m["used"](torch.ones(2, 3)).sum().backward()
    assert bucket.handle is not None
    opt.step()


@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpointing_does_not_end_the_backward_pass_early(reentrant: bool) -> None:
    # A reentrant checkpoint runs a nested backward whose end is not the pass's end.
    a, b = Reversed(), Reversed()
    plain = torch.optim.SGD(a.parameters(), lr=0.1)
    opt = dt.DistributedOptimizer(torch.optim.SGD(b.parameters(), lr=0.1), named_parameters=b.named_parameters(),
                                  compression=ddl.Compression.fp16)
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(3))
    for m, o in ((a, plain), (b, opt)):
        h = torch.relu(m.mid(torch.relu(m.inp(x))))
        checkpoint(m.out, h, use_reentrant=reentrant).sum().backward()
        o.step()
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=1e-3, atol=1e-4)


def test_a_second_backward_after_the_pass_ended_says_what_to_do() -> None:
    m = nn.ModuleDict({"a": nn.Linear(3, 3), "b": nn.Linear(3, 3)})
    _keep = dt.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), named_parameters=m.named_parameters())
    m["a"](torch.ones(1, 3)).sum().backward()
    with pytest.raises(RuntimeError, match=r"'b\.(weight|bias)'.*no_sync"):
        m["b"](torch.ones(1, 3)).sum().backward()


# -- no_sync ---------------------------------------------------------------------------
def test_no_sync_accumulates_locally_then_the_next_backward_reduces_the_sum() -> None:
    a, b = Reversed(), Reversed()
    plain = torch.optim.SGD(a.parameters(), lr=0.1, momentum=0.9)
    opt = wrap(b, compression=ddl.Compression.fp16)  # a real reduction even at one rank
    for passes in (3, 1, 2):
        for m, o in ((a, plain), (b, opt)):
            o.zero_grad()
            for i in range(passes):
                if o is opt and i < passes - 1:
                    with opt.no_sync():
                        loss(m, seed=i).backward()
                    assert all(bk.handle is None for bk in opt._reducer.buckets)
                else:
                    loss(m, seed=i).backward()
            o.step()
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=1e-2, atol=1e-3)


def test_no_sync_refuses_step_and_in_flight_entry() -> None:
    m = Reversed()
    opt = wrap(m)
    with opt.no_sync():
        loss(m).backward()
        with pytest.raises(RuntimeError, match="inside no_sync"):
            opt.step()
    loss(m).backward()
    with pytest.raises(RuntimeError, match="in flight"), opt.no_sync():
        pass
    opt.step()
    with opt.no_sync():
        loss(m).backward()
    opt.step()  # the sum is reduced at step() even without a last pass outside the block
    assert all(p.grad is not None for p in m.parameters())


# -- parameters added after construction ----------------------------------------------
@pytest.mark.parametrize("how", ["append", "inner add_param_group"])
def test_parameters_added_behind_the_wrapper_are_hooked_at_the_next_step(how: str) -> None:
    m, extra = Reversed(), nn.Linear(3, 3)
    opt = wrap(m, compression=ddl.Compression.fp16)
    if how == "append":
        opt.param_groups[0]["params"].extend(extra.parameters())
    else:
        opt.optimizer.add_param_group({"params": list(extra.parameters()), "lr": 0.01})
    (loss(m) + extra(torch.full((2, 3), 0.1)).sum()).backward()
    raw = extra.weight.grad.clone()
    opt.step()
    # Reduced with this step's buckets (fp16 on the wire rounds it), hooked from now on.
    assert not torch.equal(extra.weight.grad, raw)
    torch.testing.assert_close(extra.weight.grad, raw, rtol=1e-3, atol=1e-3)
    assert extra.weight in opt._reducer.index and opt._prefix.endswith(".v1")
    opt.zero_grad()
    extra(torch.ones(2, 3)).sum().backward()
    assert any(b.handle is not None and any(p is extra.weight for p in b.params) for b in opt._reducer.buckets)
    opt.step()


def test_a_removed_parameter_is_no_longer_hooked() -> None:
    m = Reversed()
    opt = wrap(m)
    params = opt.param_groups[0]["params"]
    del params[next(i for i, p in enumerate(params) if p is m.inp.weight)]
    loss(m).backward()
    opt.step()
    assert m.inp.weight not in opt._reducer.index and m.inp.bias in opt._reducer.index


@pytest.mark.parametrize("compression", ["auto", ddl.AutoCompression(ddl.PowerSGD(rank=2, start_iter=0))],
                         ids=["auto", "auto-powersgd"])
def test_auto_compression_trains_as_plain_on_one_host(compression: object) -> None:
    # One host: every bucket is reduced plainly, so the step is the uncompressed one, bit for bit.
    steps = []
    for comp in (None, compression):
        m = Reversed()
        opt = dt.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), named_parameters=m.named_parameters(),
                                      compression=comp, **TINY)
        for seed in range(3):
            opt.zero_grad()
            loss(m, seed).backward()
            opt.step()
        steps.append([p.detach().clone() for p in m.parameters()])
        if comp is not None:
            reducer = opt._reducer
            assert all(reducer.hook_for(b) is ddl.Compression.none for b in reducer.buckets)
    assert all(torch.equal(a, b) for a, b in zip(*steps, strict=True))
