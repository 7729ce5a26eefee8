"""One optimizer's gradient reduction: hooks, buckets, their launches and the bucket plan."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import ddl
import torch
from ddl.base.ops import ReduceOp
from ddl.engine.auto_compression import AutoCompression
from ddl.engine.compression import Compressor
from ddl.engine.hooks import CommHook, Future, GradBucket, apply_hook, is_identity
from ddl.engine.naming import label
from ddl.runtime import api, running
from ddl.runtime.process_sets import global_process_set

from . import kernels, staging
from .buckets import Bucket, GradientBucket, MiB, gradient_buckets, plan_buckets
from .collectives import TorchHandle, sparse_allreduce_async
from .tensors import host_view, numpy_dtype

_LOCAL = object()  # a bucket's "handle" when one rank needs no reduction
_LANDING = object()  # a bucket's "handle" while its gradients are still on their way to host memory
# The autograd node running now, or None outside any node: a backward pass nested in a
# node (reentrant checkpointing) ends while its outer pass is still running.
_current_node: Callable[[], object] = getattr(torch._C, "_current_autograd_node", lambda: None)


@dataclasses.dataclass(frozen=True)
class Options:
    """The DistributedOptimizer's reduction settings (see its docstring)."""

    compression: Compressor | CommHook | AutoCompression  # a wire compressor, a stateful hook (ddl.PowerSGD), or auto
    backward_passes_per_step: int
    op: ReduceOp
    gradient_predivide_factor: float
    bucket_cap_mb: float
    first_bucket_mb: float
    sparse_as_dense: bool
    process_set: Any = None  # a ddl.ProcessSet to reduce over (None: every rank)

    def size(self) -> int:
        """The number of ranks the gradients are reduced over."""
        return ddl.size() if self.process_set is None else int(self.process_set.size() or 0)


class Reducer:
    """Averages the gradients of one set of parameters across ranks, bucket by bucket.

    A step: post-accumulate-grad hooks count each parameter's backward passes, and a
    bucket whose parameters all reached ``backward_passes_per_step`` starts its
    allreduce at once, while backward goes on. When the k-th backward pass ends (an
    autograd final callback) the buckets still waiting, those holding a parameter that
    got no gradient, start too. ``synchronize()`` waits and writes the results to
    ``.grad``; then it allgathers the sparse gradients (unless ``sparse_as_dense``), which
    the buckets' flags name alike on every rank. Under ``no_sync`` hooks only check;
    gradients accumulate locally.

    Buckets start in declared order reversed. The first step records the order in which
    gradients really arrive; at its ``synchronize()`` the ranks agree on one order (rank
    0's, then what only other ranks saw; parameters no rank saw go to buckets of their
    own at the end) and the buckets are planned again in it, once.
    """

    def __init__(self, params: Sequence[torch.Tensor], names: dict[torch.Tensor, str], options: Options,
                 prefix: str, *, order: list[int] | None = None, no_sync: bool = False, hook_state: Any = None,
                 loss_scale: Callable[[], float] | None = None) -> None:
        self.options = options
        self.hook_state = hook_state  # a stateful hook's state (the optimizer's, kept across reducers)
        self.loss_scale = loss_scale  # the loss scale the gradients carry (a GradScaler's), for the hook
        self._scale_read = False  # this step's loss scale was handed to the hook state
        # The gradients each launched bucket took, with their version counters: a change in
        # place before synchronize (GradScaler.unscale_, clipping) would be lost, so it is an error.
        self._taken: list[tuple[torch.Tensor, torch.Tensor, int]] = []
        self._hooked: list[Future] = []  # stateful hooks' futures in flight, moved on as gradients arrive
        self._auto: dict[tuple[Any, ...], Compressor | CommHook] = {}  # compression="auto": each layout's hook
        self.names = names
        self.prefix = prefix
        self.trainable = [p for p in params if p.requires_grad]
        self.frozen = [p for p in params if not p.requires_grad]
        self.index = {p: i for i, p in enumerate(self.trainable)}
        self.passes = dict.fromkeys(self.trainable, 0)
        self.no_sync = no_sync
        self.synchronized = False
        self.agreed = order  # the order the ranks agreed on, once they have
        self._observed: list[int] | None = [] if order is None else None
        self._armed = False  # an end-of-backward callback is queued
        self._backward_passes = 0
        self._build(self._plan(order), prefix)
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad)  # type: ignore[no-untyped-call]
                       for p in self.trainable]

    # -- the plan ----------------------------------------------------------------------
    def _plan(self, order: list[int] | None) -> tuple[GradientBucket, ...]:
        """The buckets, by the planner ``ddl plan`` prices with (in ``order`` once the ranks agreed
        on one; parameters no rank saw then get buckets of their own: the seen ones never wait)."""
        opts, t = self.options, self.trainable
        return gradient_buckets([p.numel() for p in t], [p.element_size() for p in t],
                                kinds=[(p.dtype, p.device) for p in t], first_cap=int(opts.first_bucket_mb * MiB),
                                cap=int(opts.bucket_cap_mb * MiB), order=order)

    def _build(self, gradient_plan: tuple[GradientBucket, ...], prefix: str) -> None:
        self.gradient_plan = gradient_plan
        plan = [list(b.members) for b in gradient_plan]
        self.plan = plan
        devices: dict[torch.device, staging.Device | None] = {}  # one side stream per device
        buckets = []
        for k, idx in enumerate(plan):
            params = [self.trainable[i] for i in idx]
            where = params[0].device
            if where not in devices:
                devices[where] = staging.device_for(params)
            buckets.append(self._bucket(k, f"{prefix}.b{k}", params, devices[where]))
            _label_bucket(buckets[-1].name, [self.names.get(p, "?") for p in params])
        self.buckets = buckets
        self._slot = {p: b for b in self.buckets for p in b.params}
        self._landing: list[Bucket] = []  # launched, gradients still being copied to the host

    def _bucket(self, index: int, name: str, params: list[torch.Tensor], device: staging.Device | None) -> Bucket:
        """One bucket of the plan (a sharded reducer lays its buffer out by owner)."""
        return Bucket(index, name, params, device)

    def _agree_order(self, observed: list[int]) -> None:
        """Re-plan the buckets in the order every rank agrees on (a collective call)."""
        orders = (api.allgather_object(observed, name=f"{self.prefix}.order", process_set=self.options.process_set)
                  if self.options.size() > 1 else [observed])
        merged: list[int] = []
        seen: set[int] = set()
        for order in orders:
            for i in order:
                if i not in seen:
                    seen.add(i)
                    merged.append(i)
        if not merged:
            self._observed = []  # no gradient anywhere yet: watch the next step
            return
        self._observed = None
        self.agreed = merged
        plan = self._plan(merged)
        # Only membership decides when a bucket can start: keep the buffers if it holds.
        if [set(b.members) for b in plan] != [set(b) for b in self.plan]:
            self._build(plan, f"{self.prefix}.r")

    def stop_observing(self) -> None:
        self._observed = None

    # -- during backward -----------------------------------------------------------------
    def _on_grad(self, p: torch.Tensor) -> None:
        bucket = self._slot[p]
        k = self.options.backward_passes_per_step
        if bucket.handle is not None:
            raise RuntimeError(
                f"the gradient of {self.names[p]!r} arrived after its bucket's allreduce started "
                f"(backward_passes_per_step={k}; buckets still waiting start when the last pass ends); "
                "call optimizer.step() or synchronize() before the next backward; to accumulate over "
                "several backward passes, wrap all but the last in `with optimizer.no_sync():` "
                "(or set backward_passes_per_step to their number)"
            )
        self.synchronized = False
        if self.no_sync:
            return  # accumulate locally; the first backward outside no_sync reduces the sum
        if not self._armed:
            try:
                torch.autograd.Variable._execution_engine.queue_callback(self._on_backward_end)  # type: ignore[attr-defined]
                self._armed = True
            except RuntimeError:
                pass  # not inside a backward pass (a hook called by hand): synchronize() starts the rest
        if self._landing:
            self._submit_landed()
        if self._hooked:  # start a hook's next collective as soon as its last one is done
            self._hooked = [f for f in self._hooked if not f.done()]
        n = self.passes[p]
        if n == 0 and self._observed is not None:
            self._observed.append(self.index[p])
        self.passes[p] = n + 1
        if n + 1 == k:
            bucket.ready += 1
            if bucket.ready == len(bucket.params):
                self._launch(bucket)

    def _on_backward_end(self) -> None:
        self._armed = False
        if _current_node() is not None:
            return  # a nested backward ended, not the pass: later hooks queue on the outer one
        self._backward_passes += 1
        if self._backward_passes >= self.options.backward_passes_per_step:
            for b in self.buckets:
                if b.handle is None:
                    self._launch(b)

    def _launch(self, bucket: Bucket) -> None:
        """Fill the bucket's buffer with its gradients and start the allreduce; for gradients
        on an accelerator, start their copy to the host and submit once it has landed."""
        opts = self.options
        grads = [p.grad for p in bucket.params]
        densify = opts.sparse_as_dense and any(g is not None and g.is_sparse for g in grads)
        if opts.size() == 1 and is_identity(self.hook_for(bucket)) and not densify:
            bucket.handle = _LOCAL  # one rank: the average is the gradient itself (a sparse one too)
            return
        with torch.no_grad():
            flags, sparse, dsts, srcs = [], [], [], []
            for j, g in enumerate(grads):
                dst = bucket.grad_slice(j)
                was_sparse = g is not None and g.is_sparse
                sparse.append(1.0 if was_sparse else 0.0)
                if g is None or (was_sparse and not opts.sparse_as_dense):
                    # A sparse gradient is allgathered after this bucket (Horovod's way): its
                    # slot goes as zeros, its flag tells every rank to join that allgather.
                    dst.zero_()
                    flags.append(0.0)
                    if g is not None:
                        bucket.sparse[j] = g
                    continue
                if was_sparse:
                    g = g.to_dense()
                if g.data_ptr() != dst.data_ptr():  # a grad left as a view of this bucket is in place already
                    dsts.append(dst)
                    srcs.append(g)
                flags.append(1.0)
            bucket.flags.copy_(torch.tensor(flags))
            bucket.sparse_flags.copy_(torch.tensor(sparse))
            if bucket.device is None:
                for dst, src in zip(dsts, srcs, strict=True):
                    dst.copy_(src)
                self._submit(bucket)
                self._take(bucket)
                return
            bucket.copy = bucket.device.to_host(dsts, srcs)
        self._take(bucket)
        bucket.handle = _LANDING
        self._landing.append(bucket)

    def _take(self, bucket: Bucket) -> None:
        """Note the version of each dense gradient the bucket took (after this reducer's own
        writes into the buffer, which a gradient left as its view shares)."""
        for p in bucket.params:
            g = p.grad
            if g is not None and not g.is_sparse:
                self._taken.append((p, g, g._version))

    def _check_taken(self) -> None:
        """Raise if a gradient a bucket took was changed or replaced before the reduction finished."""
        for p, g, version in self._taken:
            if p.grad is not g or g._version != version:
                raise RuntimeError(
                    f"the gradient of {self.names[p]!r} was changed after its bucket's reduction started (by "
                    "GradScaler.unscale_ or scaler.step(optimizer), clipping, or another in-place change before "
                    "optimizer.step()); the change would be lost and the step would use the reduced gradients "
                    "as they were. Reduce first, then change them: optimizer.synchronize(); "
                    "scaler.unscale_(optimizer); clip...; then `with optimizer.skip_synchronize(): "
                    "scaler.step(optimizer)`")

    def _submit_landed(self, *, wait: bool = False) -> None:
        """Submit the allreduce of every launched bucket whose copy has landed (``wait``: all)."""
        still = []
        for b in self._landing:
            assert b.copy is not None
            if wait:
                b.copy.wait()
            if b.copy.done():
                self._submit(b)
            else:
                still.append(b)
        self._landing = still

    def _submit(self, bucket: Bucket) -> None:
        """Start the allreduce of a bucket whose buffer holds this rank's gradients."""
        opts = self.options
        op, factor = opts.op, opts.gradient_predivide_factor
        with torch.no_grad():
            if factor != 1.0:
                bucket.buffer.div_(factor)
                op = ReduceOp.SUM
        view = host_view(bucket.buffer)
        hook = self.hook_for(bucket)
        if isinstance(hook, Compressor):
            bucket.handle = api.allreduce_async(view, op=op, name=bucket.name, process_set=opts.process_set,
                                                compression=hook, inplace=True)
            return
        # A stateful hook: the gradients, then the presence flags (uncompressed, as a vector).
        if self.loss_scale is not None and not self._scale_read:
            self.hook_state.loss_scale = float(self.loss_scale())
            self._scale_read = True
        shapes = self._shapes(bucket)
        grad_bucket = GradBucket(bucket.index, bucket.name, view, shapes, op, api.collectives(opts.process_set),
                                 matmul=kernels.matmul)
        future = apply_hook(hook, self.hook_state, grad_bucket)
        bucket.handle = future
        self._hooked.append(future)

    @staticmethod
    def _shapes(bucket: Bucket) -> tuple[tuple[int, ...], ...]:
        """What a hook sees packed in the bucket: each gradient, then the presence flags (a vector)."""
        return (*(tuple(p.shape) for p in bucket.params), (bucket.buffer.numel() - bucket.numel,))

    def hook_for(self, bucket: Bucket) -> Compressor | CommHook:
        """The bucket's hook: the one given, or, for ``compression="auto"``, what
        :meth:`~ddl.engine.auto_compression.AutoCompression.resolve` chose for its layout
        (decided once per layout, alike on every rank: the inputs are)."""
        hook = self.options.compression
        if not isinstance(hook, AutoCompression):
            return hook
        key = (bucket.index, self._shapes(bucket), bucket.buffer.dtype)
        chosen = self._auto.get(key)
        if chosen is None:
            ctx = running.context()
            chosen = self._auto[key] = hook.resolve(self._shapes(bucket), numpy_dtype(bucket.buffer.dtype),
                                                    ctx.topology, ctx.model)
        return chosen

    # -- at step() -----------------------------------------------------------------------
    def synchronize(self, extra: Sequence[Bucket] = ()) -> None:
        """Start the buckets still waiting, plus ``extra`` ones, wait, and write ``.grad``.

        Calling it again without a backward pass (or ``synchronized`` cleared, as the
        optimizer's ``zero_grad()`` does) in between reduces only ``extra``.
        """
        todo = [] if self.synchronized else self.buckets
        if not todo and not extra:
            return
        observed = self._observed
        for b in [*todo, *extra]:
            if b.handle is None:
                self._launch(b)
        self._submit_landed(wait=True)
        opts = self.options
        post = opts.gradient_predivide_factor / opts.size() if opts.gradient_predivide_factor != 1.0 else None
        try:
            for b in [*todo, *extra]:
                if b.handle is not _LOCAL:
                    b.handle.wait()  # type: ignore[attr-defined]
            self._check_taken()
            gathering = self._start_sparse([*todo, *extra])
            for b in [*todo, *extra]:
                self._unpack(b, post)
            for p, handle in gathering:
                p.grad = handle.wait()
        finally:
            for b in extra:
                b.reset()
            self.reset()
        self.synchronized = True
        if todo and observed is not None:
            self._agree_order(observed)

    def _start_sparse(self, buckets: Sequence[Bucket]) -> list[tuple[torch.Tensor, TorchHandle]]:
        """Start the allgather of each sparse gradient some rank has (the reduced flags, alike
        everywhere, say which), this rank's or an empty one; Horovod's sparse reduction."""
        todo: list[tuple[Bucket, int, torch.Tensor]] = []
        if self.options.sparse_as_dense:
            return []  # reduced with the dense ones; _unpack makes them sparse again
        for b in buckets:
            if b.handle is _LOCAL:
                continue
            dense, sparse = b.flags.tolist(), b.sparse_flags.tolist()
            for j, p in enumerate(b.params):
                if sparse[j] <= 0:
                    continue
                if dense[j] > 0:
                    raise RuntimeError(
                        f"parameter {self.names[p]!r} has a sparse gradient on some ranks and a dense one on "
                        "others; build the same model on every rank, or pass sparse_as_dense=True"
                    )
                todo.append((b, j, p))
        opts = self.options
        return [(p, sparse_allreduce_async(b.sparse.get(j, _no_sparse_grad(p)), f"{b.name}.sparse.{j}", opts.op,
                                           opts.process_set or global_process_set))
                for b, j, p in todo]

    def _unpack(self, bucket: Bucket, post: float | None) -> None:
        if bucket.handle is _LOCAL:
            return
        with torch.no_grad():
            if post is not None:
                bucket.buffer[: bucket.numel].mul_(post)
            flags = bucket.flags.tolist()
            if self.options.sparse_as_dense:
                # Densified on the wire only: a gradient sparse on some rank is sparse again
                # on every rank (Horovod's rule; SparseAdam takes nothing else), one sparse
                # dimension as nn.Embedding's. Rows whose sum is exactly zero drop out.
                for j, resparse in enumerate(bucket.sparse_flags.tolist()):
                    if resparse > 0 and flags[j] > 0:
                        p = bucket.params[j]
                        p.grad = bucket.grad_slice(j).to(p.device).to_sparse(1)
                        flags[j] = 0.0
            if bucket.device is not None:
                self._unpack_to_device(bucket, flags)
                return
            for j, p in enumerate(bucket.params):
                if flags[j] <= 0:
                    continue  # no rank had a gradient (or it is sparse): leave .grad as it is
                reduced = bucket.grad_slice(j)
                if p.device == reduced.device:
                    # .grad becomes a view of the bucket: no copy now, and none at the next
                    # launch while the user zeroes grads in place rather than to None.
                    p.grad = reduced
                elif p.grad is None or p.grad.is_sparse:
                    p.grad = reduced.to(p.device)
                else:
                    p.grad.copy_(reduced)

    def _unpack_to_device(self, bucket: Bucket, flags: list[float]) -> None:
        """Copy a reduced bucket back into its parameters' ``.grad`` on the accelerator
        (in place where a gradient exists: nothing allocated on the step's path)."""
        assert bucket.device is not None
        dsts, srcs = [], []
        for j, p in enumerate(bucket.params):
            if flags[j] <= 0:
                continue
            if p.grad is None or p.grad.is_sparse:
                p.grad = torch.empty_like(p)
            dsts.append(p.grad)
            srcs.append(bucket.grad_slice(j))
        bucket.device.to_device(dsts, srcs)

    def reset(self) -> None:
        """Forget this step's progress (after a synchronize, or at zero_grad)."""
        for b in self.buckets:
            b.reset()
        for p in self.passes:
            self.passes[p] = 0
        self._backward_passes = 0
        self._armed = False
        self._landing = []
        self._hooked = []
        self._taken = []
        self._scale_read = False
        if self._observed is not None:
            self._observed = []

    def in_flight(self) -> list[str]:
        return [b.name for b in self.buckets if b.handle is not None]

    def check_frozen(self) -> None:
        for p in self.frozen:
            if p.requires_grad:
                raise RuntimeError(
                    f"parameter {self.names[p]!r} was frozen when the DistributedOptimizer was "
                    "built and now requires grad; build the DistributedOptimizer after unfreezing"
                )

    def close(self) -> None:
        """Remove the hooks (the parameters are handed to a new Reducer)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []


def _no_sparse_grad(p: torch.Tensor) -> torch.Tensor:
    """An empty sparse gradient for ``p`` on a rank where it got none: one sparse dimension,
    as ``nn.Embedding`` and ``nn.EmbeddingBag`` make (another layout is a shape mismatch
    error in the allgather, not a wrong sum)."""
    return torch.sparse_coo_tensor(torch.zeros((1, 0), dtype=torch.int64, device=p.device),
                                   torch.zeros((0, *p.shape[1:]), dtype=p.dtype, device=p.device), p.shape,
                                   check_invariants=False)


def _label_bucket(name: str, parameters: list[str]) -> None:
    """Errors and stall reports name a bucket by its parameters, as the user named them."""
    shown = ", ".join(parameters[:4]) + (f" and {len(parameters) - 4} more" if len(parameters) > 4 else "")
    label(name, f"gradients of {shown}")


def late_buckets(params: Sequence[torch.Tensor], options: Options, prefix: str) -> list[Bucket]:
    """One-off buckets for parameters that joined the optimizer with no hooks on them yet."""
    trainable = [p for p in params if p.requires_grad]
    cap = int(options.bucket_cap_mb * MiB)
    plan = plan_buckets([p.numel() * p.element_size() for p in trainable], [(p.dtype, p.device) for p in trainable],
                        first_cap=cap, cap=cap)
    return [Bucket(k, f"{prefix}.late.b{k}", [trainable[i] for i in idx]) for k, idx in enumerate(plan)]
