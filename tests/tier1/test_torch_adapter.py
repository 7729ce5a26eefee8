"""ddl.torch in one process: buckets, the optimizer wrapper's contract, tensor collectives."""

from __future__ import annotations

import copy
import pickle

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import ddl  # noqa: E402
import ddl.torch as dt  # noqa: E402
from ddl.torch.buckets import plan_buckets  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _world() -> None:
    dt.init()


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def backward(m: nn.Module) -> None:
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(1))
    nn.functional.cross_entropy(m(x), torch.tensor([0, 1, 2, 0, 1, 2])).backward()


def wrapped(m: nn.Module, **kw) -> dt.DistributedOptimizer:
    return dt.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=m.named_parameters(), **kw)


# -- bucket planning -----------------------------------------------------------------
def test_buckets_fill_from_the_last_parameter_with_a_small_first_one() -> None:
    assert plan_buckets([4] * 6, ["f"] * 6, first_cap=4, cap=8) == [[5], [4, 3], [2, 1], [0]]


def test_buckets_hold_one_kind_each_and_oversized_parameters_alone() -> None:
    plan = plan_buckets([4, 4, 100, 4], ["a", "b", "a", "a"], first_cap=8, cap=8)
    assert plan == [[3], [2], [1], [0]] or plan == [[3], [2], [0], [1]]
    for bucket in plan:
        assert len({["a", "b", "a", "a"][i] for i in bucket}) == 1
    assert sorted(i for b in plan for i in b) == [0, 1, 2, 3]


def test_bucket_caps_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        plan_buckets([4], ["f"], first_cap=0, cap=8)


def test_optimizer_builds_buckets_under_the_cap() -> None:
    m = nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)])  # 16.6 KB per layer
    opt = wrapped(m, bucket_cap_mb=0.04, first_bucket_mb=0.001)
    sizes = [sum(p.numel() * 4 for p in b.params) for b in opt._reducer.buckets]
    assert len(opt._reducer.buckets) > 2 and all(s <= 0.04 * 2**20 or len(b.params) == 1
                                         for s, b in zip(sizes, opt._reducer.buckets, strict=True))
    assert opt._reducer.buckets[0].params[0] is list(m.parameters())[-1]


# -- the optimizer wrapper's contract -----------------------------------------------
def test_step_matches_the_plain_optimizer_in_one_process() -> None:
    a, b = model(), model()
    plain = torch.optim.SGD(a.parameters(), lr=0.1, momentum=0.9)
    dist = wrapped(b)
    for _ in range(3):
        for m, o in ((a, plain), (b, dist)):
            o.zero_grad()
            backward(m)
            o.step()
    for x, y in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(x, y)


def test_state_dict_round_trips_with_the_plain_optimizer() -> None:
    m = model()
    opt = wrapped(m)
    backward(m)
    opt.step()
    sd = opt.state_dict()
    plain = torch.optim.SGD(m.parameters(), lr=0.5, momentum=0.9)
    plain.load_state_dict(sd)
    assert plain.param_groups[0]["lr"] == 0.1
    assert torch.equal(plain.state_dict()["state"][0]["momentum_buffer"], sd["state"][0]["momentum_buffer"])
    again = wrapped(model())
    again.load_state_dict(plain.state_dict())
    assert again.state_dict()["param_groups"] == sd["param_groups"]


def test_pickles_and_keeps_working() -> None:
    m = model()
    opt = wrapped(m, backward_passes_per_step=1, compression=ddl.Compression.fp16)
    backward(m)
    opt.step()
    clone = pickle.loads(pickle.dumps(opt))
    assert isinstance(clone, dt.DistributedOptimizer) and clone._options.compression is ddl.Compression.fp16
    params = clone.param_groups[0]["params"]
    loss = sum((p * p).sum() for p in params)
    loss.backward()
    before = [p.detach().clone() for p in params]
    clone.step()
    assert any(not torch.equal(p, q) for p, q in zip(params, before, strict=True))
    twin = copy.deepcopy(opt)
    assert twin._prefix == f"{opt._prefix}.copy2" and clone._prefix == f"{opt._prefix}.copy1"
    # Names come from what the optimizer covers (alike on every rank), not a process
    # counter: the next optimizer over the same model is that model's next one, copies
    # take no number, and an optimizer over another model leaves this sequence alone.
    base, _, n = opt._prefix.rpartition(".")
    lin = torch.nn.Linear(3, 1)
    other = dt.DistributedOptimizer(torch.optim.SGD(lin.parameters(), lr=0.1), named_parameters=lin.named_parameters())
    assert not other._prefix.startswith(base)
    after = wrapped(model())
    assert after._prefix == f"{base}.{int(n) + 1}" if n.isdigit() else after._prefix == f"{opt._prefix}.1"


def test_lr_schedulers_and_isinstance() -> None:
    m = model()
    opt = wrapped(m)
    assert isinstance(opt, torch.optim.Optimizer)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    backward(m)
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)
    m2 = model()
    opt2 = wrapped(m2)
    one = torch.optim.lr_scheduler.OneCycleLR(opt2, max_lr=1.0, total_steps=10)
    backward(m2)
    opt2.step()
    one.step()
    assert opt2.param_groups[0]["lr"] != pytest.approx(1.0 / 25)


def test_zero_grad_while_reductions_are_in_flight_is_an_error() -> None:
    m = model()
    opt = wrapped(m)
    backward(m)
    with pytest.raises(RuntimeError, match="in flight"):
        opt.zero_grad()
    opt.step()
    opt.zero_grad()
    assert all(p.grad is None for p in m.parameters())


def test_a_second_backward_before_step_needs_backward_passes_per_step() -> None:
    m = model()
    _keep = wrapped(m)  # the hooks hold it; the name keeps it visible
    backward(m)
    with pytest.raises(RuntimeError, match="backward_passes_per_step"):
        backward(m)


def test_backward_passes_per_step_sums_locally() -> None:
    a, b = model(), model()
    backward(a)
    backward(a)
    opt = wrapped(b, backward_passes_per_step=2)
    backward(b)
    assert all(bk.handle is None for bk in opt._reducer.buckets)  # nothing sent after one pass
    backward(b)
    opt.synchronize()
    for x, y in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(x.grad, y.grad)


def test_synchronize_then_skip_synchronize_for_clipping() -> None:
    m = model()
    opt = wrapped(m, compression=ddl.Compression.fp16)  # a second reduction would round the clipped grads
    backward(m)
    opt.synchronize()
    nn.utils.clip_grad_norm_(m.parameters(), 1e-3)
    clipped = [p.grad.clone() for p in m.parameters()]
    with opt.skip_synchronize():
        opt.step()
    opt.synchronize()  # nothing new since the last one: a no-op
    assert all(torch.equal(p.grad, c) for p, c in zip(m.parameters(), clipped, strict=True))


def test_unused_parameters_keep_no_grad_and_frozen_ones_are_skipped() -> None:
    m = nn.ModuleDict({"used": nn.Linear(3, 3), "unused": nn.Linear(3, 3), "frozen": nn.Linear(3, 3)})
    m["frozen"].requires_grad_(False)
    # fp16 on the wire: the bucket (presence flags and all) is reduced even at one rank.
    opt = dt.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), named_parameters=m.named_parameters(),
                                  compression=ddl.Compression.fp16)
    m["used"](m["frozen"](torch.ones(2, 3))).sum().backward()
    (bucket,) = opt._reducer.buckets
    opt.step()
    grad = m["used"].weight.grad
    assert grad is not None and grad.untyped_storage().data_ptr() == bucket.buffer.untyped_storage().data_ptr()
    assert m["unused"].weight.grad is None and m["frozen"].weight.grad is None
    m["frozen"].requires_grad_(True)
    with pytest.raises(RuntimeError, match="frozen"):
        opt.step()


def test_add_param_group_rebuilds_buckets() -> None:
    m, extra = model(), nn.Linear(2, 2)
    opt = wrapped(m)
    n = sum(len(b.params) for b in opt._reducer.buckets)
    opt.add_param_group({"params": extra.parameters(), "lr": 0.01})
    assert sum(len(b.params) for b in opt._reducer.buckets) == n + 2
    extra(torch.ones(1, 2)).sum().backward()
    opt.step()
    assert extra.weight.grad is not None


def test_sparse_gradients_stay_sparse() -> None:
    # Sparse gradients are allgathered across ranks (Horovod's way); in one process that is
    # the gradient itself, so the step equals the plain optimizer's and .grad stays sparse.
    def emb() -> nn.Embedding:
        torch.manual_seed(0)
        return nn.Embedding(10, 3, sparse=True)

    plain_emb, dist_emb = emb(), emb()
    plain = torch.optim.SGD(plain_emb.parameters(), lr=0.1)
    dist = dt.DistributedOptimizer(torch.optim.SGD(dist_emb.parameters(), lr=0.1),
                                   named_parameters=[("emb.weight", dist_emb.weight)])
    for m, o in ((plain_emb, plain), (dist_emb, dist)):
        o.zero_grad()
        m(torch.tensor([1, 2, 2])).sum().backward()
        o.step()
    assert dist_emb.weight.grad.is_sparse
    assert torch.equal(plain_emb.weight, dist_emb.weight)
    # sparse_as_dense: dense on the wire, sparse again after, so SparseAdam takes it (Horovod's rule).
    plain_emb, dist_emb = emb(), emb()
    plain = torch.optim.SparseAdam(list(plain_emb.parameters()), lr=0.1)
    dist = dt.DistributedOptimizer(torch.optim.SparseAdam(list(dist_emb.parameters()), lr=0.1), sparse_as_dense=True)
    for m, o in ((plain_emb, plain), (dist_emb, dist)):
        for _ in range(2):
            o.zero_grad()
            m(torch.tensor([1, 2, 2])).sum().backward()
            o.step()
    assert dist_emb.weight.grad.is_sparse and dist_emb.weight.grad.to_dense()[2].sum() == 6
    assert torch.equal(plain_emb.weight, dist_emb.weight)


def test_parameter_names_under_horovods_attribute() -> None:
    m = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    opt = dt.DistributedOptimizer(torch.optim.SGD([{"params": m[0].parameters()}, {"params": m[1].parameters()}],
                                                  lr=0.1))
    names = opt._parameter_names
    assert set(names) == set(m.parameters()) and len(set(names.values())) == 4
    named = wrapped(m)
    assert {named._parameter_names[p] for p in m.parameters()} == {n for n, _ in m.named_parameters()}


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"op": ddl.Max}, ValueError, "Average or ddl.Sum"),
        ({"backward_passes_per_step": 0}, ValueError, ">= 1"),
        ({"gradient_predivide_factor": 2.0, "op": ddl.Sum}, ValueError, "only applies"),
        ({"bucket_cap_mb": 0}, ValueError, "> 0 MiB"),
        ({"compression": "zip"}, ValueError, "unknown compression"),
        ({"named_parameters": [("w", torch.zeros(1))]}, ValueError, "not in named_parameters"),
        ({"named_parameters": [("w", 3)]}, TypeError, "pairs"),
    ],
)
def test_bad_options_are_clear_errors(kwargs, error, match) -> None:
    m = model()
    kwargs.setdefault("named_parameters", m.named_parameters())
    with pytest.raises(error, match=match):
        dt.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), **kwargs)


def test_wrapping_twice_or_wrapping_a_non_optimizer_is_refused() -> None:
    m = model()
    opt = wrapped(m)
    with pytest.raises(TypeError, match="already"):
        dt.DistributedOptimizer(opt)
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        dt.DistributedOptimizer(object())


# -- broadcasts and tensor collectives at size 1 ------------------------------------
def test_broadcast_parameters_validates_its_input() -> None:
    m = model()
    dt.broadcast_parameters(m.state_dict())
    dt.broadcast_parameters(m.named_parameters())
    with pytest.raises(ValueError, match="twice"):
        dt.broadcast_parameters([("w", torch.zeros(1)), ("w", torch.zeros(1))])
    with pytest.raises(ValueError, match="state_dict"):
        dt.broadcast_parameters([torch.zeros(1)])
    with pytest.raises(TypeError, match="torch optimizer"):
        dt.broadcast_optimizer_state(m)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16,
                                   torch.int32, torch.int64, torch.uint8])
def test_tensor_collectives_keep_dtype_and_shape(dtype) -> None:
    x = torch.arange(6).reshape(2, 3).to(dtype)
    assert torch.equal(dt.allreduce(x, op=ddl.Sum), x)
    assert dt.allgather(x).shape == (2, 3) and dt.broadcast(x).dtype == dtype
    y = x.clone()
    assert dt.allreduce_(y, op=ddl.Sum) is y and torch.equal(y, x)


def test_allreduce_and_allgather_are_differentiable() -> None:
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: dt.allreduce(t, op=ddl.Sum), (x,))
    assert torch.autograd.gradcheck(lambda t: dt.allgather(t) * 2, (x,))
    y = torch.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="no gradient"):
        dt.allreduce(y, op=ddl.Max).sum().backward()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_tensors_reach_the_core_without_a_copy(monkeypatch, dtype) -> None:
    handed = []

    from ddl.runtime import api  # what the adapter calls

    def spy_on(name):
        real = getattr(api, name)

        def spy(x, **kw):
            handed.append(x)
            return real(x, **kw)

        monkeypatch.setattr(api, name, spy)

    spy_on("allreduce_async")
    spy_on("allreduce_")
    x = torch.ones(1000, dtype=dtype)
    dt.allreduce_(x, op=ddl.Sum)
    dt.allreduce_async_(x[10:20], op=ddl.Sum).wait()  # a contiguous view, at an offset
    assert handed[0].__array_interface__["data"][0] == x.data_ptr()
    assert handed[1].__array_interface__["data"][0] == x[10:20].data_ptr()
    m = model()
    opt = wrapped(m, compression=ddl.Compression.fp16)
    backward(m)
    opt.step()
    assert {a.__array_interface__["data"][0] for a in handed[2:]} == {b.buffer.data_ptr() for b in opt._reducer.buckets}


def test_sparse_allreduce_async_handle_is_callable_as_horovods() -> None:
    # Horovod's sparse_allreduce_async returns a function: handle() gives the result.
    t = torch.tensor([[0.0, 2.0], [0.0, 0.0], [3.0, 0.0]]).to_sparse()
    h = dt.sparse_allreduce_async(t, name="sp", op=ddl.Average)
    out = h()
    assert out.is_sparse and torch.equal(out.to_dense(), t.to_dense()) and dt.synchronize(h) is out
    with pytest.raises(TypeError, match="sparse COO"):
        dt.sparse_allreduce_async(torch.ones(2), name="d", op=ddl.Sum)
    with pytest.raises(ValueError, match="Sum or Average"):
        dt.sparse_allreduce_async(t, name="m", op=ddl.Max)


def test_tensor_collective_errors() -> None:
    with pytest.raises(TypeError, match="torch.Tensor"):
        dt.allreduce([1, 2])
    with pytest.raises(TypeError, match="bool"):
        dt.allreduce(torch.ones(2, dtype=torch.bool))
    with pytest.raises(TypeError, match="cannot"):
        dt.allreduce(torch.ones(2, dtype=torch.complex64))
    with pytest.raises(TypeError, match="dense"):
        dt.allreduce(torch.ones(2).to_sparse())
    with pytest.raises(TypeError, match="Adasum"):
        dt.allreduce(torch.ones(2, dtype=torch.int32), op=ddl.Adasum)
    # Average on integers divides and truncates (Horovod's rule); int8 reduces too.
    assert torch.equal(dt.allreduce(torch.tensor([3, -3], dtype=torch.int8)), torch.tensor([3, -3], dtype=torch.int8))


@pytest.mark.gpu
def test_cuda_tensors_stage_through_host_memory() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    x = torch.arange(8.0, device="cuda")
    assert dt.allreduce(x, op=ddl.Sum).device.type == "cuda"
    dt.allreduce_(x, op=ddl.Sum)
    assert torch.equal(x.cpu(), torch.arange(8.0))


# -- ddl bench torch's arithmetic ---------------------------------------------------
def test_bench_summary_computes_efficiency_against_one_undistributed_process() -> None:
    from ddl_bench.torch_training import format_table, summarize

    per = {"none": 0.100, "ddl.torch": 0.104, "DDP-gloo": 0.110}
    runs = [{"size": 1, "step_s": {"cnn": per}, "batch": {"cnn": 8}, "params": {"cnn": 1000},
             "allreduce_s": {"cnn": 0.0}},
            {"size": 2, "step_s": {"cnn": {"none": 0.1, "ddl.torch": 0.125, "DDP-gloo": 0.100}},
             "batch": {"cnn": 8}, "params": {"cnn": 1000}, "allreduce_s": {"cnn": 0.025}}]
    rows = {(r["ranks"], r["contender"]): r for r in summarize(runs)["rows"]}
    assert rows[(2, "ddl.torch")]["scaling_efficiency"] == pytest.approx(0.8)
    assert rows[(2, "ddl.torch")]["samples_per_s"] == pytest.approx(16 / 0.125)
    assert rows[(2, "ddl.torch")]["vs_ddp"] == pytest.approx(1.25)
    assert rows[(1, "none")]["scaling_efficiency"] == pytest.approx(1.0)
    # Against the floor measured in the same run: the no-communication step + one allreduce.
    assert rows[(2, "ddl.torch")]["vs_floor"] == pytest.approx(0.125 / (0.1 + 0.025))
    assert rows[(1, "ddl.torch")]["vs_floor"] is None and rows[(2, "DDP-gloo")]["vs_floor"] is None
    table = format_table(summarize(runs))
    assert "ddl.torch" in table and "0.800" in table


def test_staged_gradients_overlap_their_copies_and_reuse_their_buffers(monkeypatch) -> None:
    """The CUDA path's logic on CPU (a device whose copies land late): the hook returns before
    the copy lands, the allreduce starts only after it (else the sums are wrong), results
    equal the in-place path, and no buffer is allocated again from one step to the next."""
    from ddl.torch import staging

    def run(staged: bool) -> tuple[list[torch.Tensor], object]:
        late = staging.LateCopies(0.03)
        if staged:
            monkeypatch.setattr(staging, "device_for", lambda params: late)
        torch.manual_seed(0)
        m = model()
        opt = wrapped(m, compression=ddl.Compression.fp16)  # one rank: fp16 makes it reduce
        pointers = []
        for _ in range(3):
            opt.zero_grad(set_to_none=False)
            backward(m)
            opt.step()
            pointers.append(([b.buffer.data_ptr() for b in opt._reducer.buckets],
                             [p.grad.data_ptr() for p in m.parameters() if p.grad is not None]))
        monkeypatch.undo()
        assert all(pp == pointers[0] for pp in pointers[1:]), "a buffer was allocated again"
        return [p.detach().clone() for p in m.parameters()], late

    plain, _ = run(False)
    staged, late = run(True)
    # Copies were still in flight when the hooks returned (on a loaded machine a thread may
    # land one before the caller looks: not all of them), and the sums are still right.
    assert late.started >= 3 and not all(late.landed_early)
    for a, b in zip(plain, staged, strict=True):
        assert torch.equal(a, b)


def test_an_unknown_device_has_no_staging_path() -> None:
    from ddl.torch import staging

    with pytest.raises(TypeError, match="CPU and CUDA"):
        staging.device_for([torch.empty(1, device="meta")])
    assert staging.device_for([torch.empty(1)]) is None
