"""DistributedOptimizer: gradients averaged across ranks, overlapped with backward."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import ddl
import torch
from ddl.compression import Compressor, as_compressor
from ddl.ops import ReduceOp, as_op

from .buckets import Bucket, MiB, plan_buckets
from .tensors import host_view

_ids = itertools.count()
_copies: dict[str, int] = {}  # unpickled copies made of each optimizer, for their names
_LOCAL = object()  # a bucket's "handle" when one rank needs no reduction


@dataclasses.dataclass(frozen=True)
class _Options:
    compression: Compressor
    backward_passes_per_step: int
    op: ReduceOp
    gradient_predivide_factor: float
    bucket_cap_mb: float
    first_bucket_mb: float
    sparse_as_dense: bool


class DistributedOptimizer(torch.optim.Optimizer):
    """Wraps a torch optimizer so ``step()`` applies the gradients averaged over all ranks.

    Gradients are grouped into buckets in reverse parameter order (a small first bucket,
    then up to ``bucket_cap_mb``); a bucket's allreduce starts from a post-accumulate-grad
    hook as soon as its last gradient is ready, so communication overlaps the rest of
    backward. ``step()`` waits for the buckets and then runs the wrapped optimizer.

    The wrapper holds the optimizer by composition: ``param_groups``, ``state``,
    ``defaults``, ``state_dict()`` and ``load_state_dict()`` are the wrapped optimizer's,
    so LR schedulers, ``torch.amp.GradScaler`` and checkpoints work unchanged.

    Args:
        optimizer: any ``torch.optim.Optimizer``.
        named_parameters: ``model.named_parameters()``, used to name parameters in errors.
        compression: ``ddl.Compression.none`` (default), ``.fp16`` or ``.bf16`` on the wire.
        backward_passes_per_step: backward passes accumulated locally per reduction.
            Gradients are summed over the passes (scale the loss by 1/k for a mean).
        op: ``ddl.Average`` (default) or ``ddl.Sum`` over ranks.
        gradient_predivide_factor: with Average, divide by this before the sum and by
            size/factor after it (keeps fp16 sums in range on large jobs).
        bucket_cap_mb: the size cap of every bucket but the first.
        first_bucket_mb: the size cap of the first bucket.
        sparse_as_dense: reduce sparse gradients (``Embedding(sparse=True)``) as dense.

    Example:
        >>> opt = ddl.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
        ...                                      named_parameters=model.named_parameters())  # doctest: +SKIP
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer,
        named_parameters: Iterable[tuple[str, torch.nn.Parameter]] | None = None, *,
        compression: Any = None, backward_passes_per_step: int = 1, op: Any = ReduceOp.AVERAGE,
        gradient_predivide_factor: float = 1.0, bucket_cap_mb: float = 25.0,
        first_bucket_mb: float = 1.0, sparse_as_dense: bool = False,
    ) -> None:
        if isinstance(optimizer, DistributedOptimizer):
            raise TypeError("this optimizer is already a ddl.torch.DistributedOptimizer; wrap it once")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"DistributedOptimizer wraps a torch.optim.Optimizer, got {type(optimizer).__name__}")
        reduce_op = as_op(op)
        if reduce_op not in (ReduceOp.AVERAGE, ReduceOp.SUM):
            raise ValueError(f"DistributedOptimizer reduces gradients with ddl.Average or ddl.Sum, got {reduce_op.name}")
        if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be an integer >= 1, got {backward_passes_per_step!r}")
        if not gradient_predivide_factor > 0:
            raise ValueError(f"gradient_predivide_factor must be > 0, got {gradient_predivide_factor!r}")
        if gradient_predivide_factor != 1.0 and reduce_op is not ReduceOp.AVERAGE:
            raise ValueError("gradient_predivide_factor only applies with op=ddl.Average")
        if not bucket_cap_mb > 0 or not first_bucket_mb > 0:
            raise ValueError(f"bucket sizes must be > 0 MiB, got bucket_cap_mb={bucket_cap_mb} "
                             f"and first_bucket_mb={first_bucket_mb}")
        self.__dict__["optimizer"] = optimizer
        self._options = _Options(
            compression=as_compressor(compression), backward_passes_per_step=backward_passes_per_step,
            op=reduce_op, gradient_predivide_factor=float(gradient_predivide_factor),
            bucket_cap_mb=float(bucket_cap_mb), first_bucket_mb=float(first_bucket_mb),
            sparse_as_dense=bool(sparse_as_dense),
        )
        self._names = _parameter_names(optimizer, named_parameters)
        self._attach()

    # -- the wrapped optimizer's state, passed through -----------------------------
    @property  # type: ignore[override]
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups  # type: ignore[no-any-return]

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = value

    @property  # type: ignore[override]
    def state(self) -> Any:
        return self.optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self.optimizer.state = value

    @property  # type: ignore[override]
    def defaults(self) -> dict[str, Any]:
        return self.optimizer.defaults  # type: ignore[no-any-return]

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self.optimizer.defaults = value

    def __getattr__(self, name: str) -> Any:
        # Anything else (hook registries, private fields) is the wrapped optimizer's.
        inner = self.__dict__.get("optimizer")
        if inner is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(inner, name)

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's ``state_dict()``: loads into the plain optimizer too."""
        return self.optimizer.state_dict()  # type: ignore[no-any-return]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a ``state_dict()`` of this or of the plain optimizer."""
        self.optimizer.load_state_dict(state_dict)

    def __getstate__(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer, "options": self._options, "names": list(self._names.values()),
                "prefix": self._prefix}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__["optimizer"] = state["optimizer"]
        self._options = state["options"]
        params = _all_params(self.optimizer)
        self._names = dict(zip(params, state["names"], strict=True))
        # Unpickling or deepcopy may happen on one rank alone: no cross-rank check, and
        # a name from the original's (not from the shared counter, which would then
        # differ between ranks and leave later optimizers unmatched).
        original = state.get("prefix", "ddl.torch.opt?")
        n = _copies[original] = _copies.get(original, 0) + 1
        self._attach(prefix=f"{original}.copy{n}", check=False)

    def __repr__(self) -> str:
        return f"ddl.torch.DistributedOptimizer({self.optimizer!r})"

    # -- hooks and buckets -----------------------------------------------------------
    def _attach(self, *, prefix: str | None = None, check: bool = True) -> None:
        """(Re)build buckets and hooks for the current parameters (``check``: compare the
        parameters across ranks, a collective call)."""
        for h in self.__dict__.get("_hooks", []):
            h.remove()
        self._prefix = prefix or f"ddl.torch.opt{next(_ids)}"
        params = _all_params(self.optimizer)
        trainable = [p for p in params if p.requires_grad]
        self._frozen = [p for p in params if not p.requires_grad]
        opts = self._options
        plan = plan_buckets(
            [p.numel() * p.element_size() for p in trainable], [(p.dtype, p.device) for p in trainable],
            first_cap=int(opts.first_bucket_mb * MiB), cap=int(opts.bucket_cap_mb * MiB),
        )
        self._buckets = [Bucket(k, f"{self._prefix}.b{k}", [trainable[i] for i in idx])
                         for k, idx in enumerate(plan)]
        self._slot: dict[torch.Tensor, tuple[Bucket, int]] = {}
        for b in self._buckets:
            for j, p in enumerate(b.params):
                self._slot[p] = (b, j)
        self._passes: dict[torch.Tensor, int] = dict.fromkeys(trainable, 0)
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad)  # type: ignore[no-untyped-call]
                       for p in trainable]
        self._synchronized = False
        self._skip = False
        if check:
            _check_same_model(self._prefix, [(self._names[p], tuple(p.shape), str(p.dtype)) for p in params])

    def _on_grad(self, p: torch.Tensor) -> None:
        bucket, _ = self._slot[p]
        k = self._options.backward_passes_per_step
        if bucket.handle is not None:
            raise RuntimeError(
                f"the gradient of {self._names[p]!r} was computed again after its allreduce started "
                f"({k} backward pass(es) per step); call optimizer.step() or synchronize() between "
                "backward passes, or raise backward_passes_per_step"
            )
        self._synchronized = False
        if p.grad is not None and p.grad.is_sparse and not self._options.sparse_as_dense:
            raise TypeError(
                f"parameter {self._names[p]!r} has a sparse gradient (nn.Embedding(sparse=True)?); "
                "ddl reduces dense gradients: pass sparse_as_dense=True to DistributedOptimizer "
                "or use a dense embedding"
            )
        self._passes[p] += 1
        if self._passes[p] == k:
            bucket.ready += 1
            if bucket.ready == len(bucket.params):
                self._launch(bucket)

    def _launch(self, bucket: Bucket) -> None:
        """Copy the bucket's gradients into its buffer and start the allreduce."""
        opts = self._options
        grads = [p.grad for p in bucket.params]
        if ddl.size() == 1 and opts.compression.wire is None and not any(g is not None and g.is_sparse for g in grads):
            bucket.handle = _LOCAL  # one rank: the average is the gradient itself
            return
        with torch.no_grad():
            flags = []
            for j, g in enumerate(grads):
                dst = bucket.grad_slice(j)
                if g is None:
                    dst.zero_()
                    flags.append(0.0)
                    continue
                if g.is_sparse:
                    g = g.to_dense()
                if g.data_ptr() != dst.data_ptr():  # a grad left as a view of this bucket is in place already
                    dst.copy_(g)
                flags.append(1.0)
            bucket.flags.copy_(torch.tensor(flags))
            op, factor = opts.op, opts.gradient_predivide_factor
            if factor != 1.0:
                bucket.buffer.div_(factor)
                op = ReduceOp.SUM
            view = host_view(bucket.buffer)
            bucket.handle = ddl.allreduce_async(view, op=op, name=bucket.name,
                                                compression=opts.compression, inplace=True)

    # -- the public optimizer interface ------------------------------------------------
    def synchronize(self) -> None:
        """Finish every bucket's allreduce and write the averaged gradients into ``.grad``.

        Buckets whose gradients did not all arrive (parameters unused in this step) are
        started now, with zeros for the missing ones. Calling it twice without a backward
        pass in between does nothing the second time.
        """
        for p in self._frozen:
            if p.requires_grad:
                raise RuntimeError(
                    f"parameter {self._names[p]!r} was frozen when the DistributedOptimizer was "
                    "built and now requires grad; build the DistributedOptimizer after unfreezing"
                )
        if self._synchronized:
            return
        for b in self._buckets:
            if b.handle is None:
                self._launch(b)
        opts = self._options
        post = opts.gradient_predivide_factor / ddl.size() if opts.gradient_predivide_factor != 1.0 else None
        try:
            for b in self._buckets:
                if b.handle is not _LOCAL:
                    b.handle.wait()  # type: ignore[attr-defined]
                self._unpack(b, post)
        finally:
            for b in self._buckets:
                b.reset()
            for p in self._passes:
                self._passes[p] = 0
        self._synchronized = True

    def _unpack(self, bucket: Bucket, post: float | None) -> None:
        if bucket.handle is _LOCAL:
            return
        with torch.no_grad():
            if post is not None:
                bucket.buffer[: bucket.numel].mul_(post)
            flags = bucket.flags.tolist()
            for j, p in enumerate(bucket.params):
                if flags[j] <= 0:
                    continue  # no rank had a gradient: leave .grad as it is (None)
                reduced = bucket.grad_slice(j)
                if p.device == reduced.device:
                    # .grad becomes a view of the bucket: no copy now, and none at the next
                    # launch while the user zeroes grads in place rather than to None.
                    p.grad = reduced
                elif p.grad is None or p.grad.is_sparse:
                    p.grad = reduced.to(p.device)
                else:
                    p.grad.copy_(reduced)

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Within this block ``step()`` does not synchronize (call ``synchronize()`` first).

        Example:
            >>> opt.synchronize(); clip_grad_norm_(model.parameters(), 1.0)  # doctest: +SKIP
            >>> with opt.skip_synchronize(): opt.step()                       # doctest: +SKIP
        """
        self._skip = True
        try:
            yield
        finally:
            self._skip = False

    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        """Synchronize the gradients, then run the wrapped optimizer's ``step``."""
        if closure is not None:
            def reduced_closure() -> Any:
                with torch.enable_grad():
                    loss = closure()
                self.synchronize()
                return loss

            return self.optimizer.step(reduced_closure)
        if not self._skip:
            self.synchronize()
        return self.optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The wrapped optimizer's ``zero_grad``.

        Raises:
            RuntimeError: gradient allreduces are still in flight (call ``step()`` or
                ``synchronize()`` first), since their results would land on zeroed grads.
        """
        in_flight = [b.name for b in self._buckets if b.handle is not None]
        if in_flight:
            raise RuntimeError(
                f"zero_grad() called while {len(in_flight)} gradient allreduce(s) are in flight "
                f"({', '.join(in_flight[:3])}); call optimizer.step() or optimizer.synchronize() first"
            )
        for b in self._buckets:
            b.reset()
        for p in self._passes:
            self._passes[p] = 0
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a parameter group to the wrapped optimizer and rebuild the buckets."""
        if any(b.handle is not None for b in self._buckets):
            raise RuntimeError("add_param_group() while gradient allreduces are in flight; call step() first")
        self.optimizer.add_param_group(param_group)
        for i, p in enumerate(_all_params(self.optimizer)):
            self._names.setdefault(p, f"param_groups[{len(self.param_groups) - 1}].{i}")
        self._attach()


def _all_params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _parameter_names(optimizer: torch.optim.Optimizer,
                     named: Iterable[tuple[str, torch.nn.Parameter]] | None) -> dict[torch.Tensor, str]:
    params = _all_params(optimizer)
    if named is None:
        return {p: f"param.{i}" for i, p in enumerate(params)}
    pairs = list(named)
    if not all(isinstance(n, str) and isinstance(p, torch.Tensor) for n, p in pairs):
        raise TypeError("named_parameters must be (name, tensor) pairs, as model.named_parameters() gives")
    names: dict[torch.Tensor, str] = {}
    seen: set[str] = set()
    for n, p in pairs:
        if n in seen:
            raise ValueError(f"named_parameters lists the name {n!r} twice")
        seen.add(n)
        names.setdefault(p, n)
    missing = [i for i, p in enumerate(params) if p not in names]
    if missing:
        raise ValueError(
            f"{len(missing)} of the optimizer's {len(params)} parameters are not in named_parameters "
            f"(first: param_groups index {missing[0]}); pass the named_parameters of the model the optimizer trains"
        )
    return {p: names[p] for p in params}


def _check_same_model(prefix: str, manifest: list[tuple[str, tuple[int, ...], str]]) -> None:
    """Every rank must wrap the same parameters, or buckets would not line up: say which differ."""
    if not ddl.is_initialized() or ddl.size() == 1:
        return
    everyone = ddl.allgather_object(manifest, name=f"{prefix}.manifest")
    for r, other in enumerate(everyone):
        if other != manifest:
            diff = next(((a, b) for a, b in zip(manifest, other, strict=False) if a != b), None)
            what = (f"first difference: here {diff[0]}, rank {r} {diff[1]}" if diff
                    else f"{len(manifest)} parameters here, {len(other)} on rank {r}")
            raise ddl.MismatchError(
                f"rank {ddl.rank()} and rank {r} wrap different parameters in DistributedOptimizer ({what}); "
                "build the same model and optimizer on every rank"
            )

