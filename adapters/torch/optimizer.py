"""DistributedOptimizer: gradients averaged across ranks, overlapped with backward."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import ddl
import torch
from ddl.base.ops import ReduceOp, as_op
from ddl.engine.auto_compression import AutoCompression, as_hook_or_auto
from ddl.engine.compression import Compression, Compressor
from ddl.engine.naming import call_site_name, manifest_name
from ddl.reduction.buckets import BUCKET_BYTES, FIRST_BUCKET_BYTES, MiB
from ddl.runtime import api

from .reducer import Options, Reducer, late_buckets
from .wrapping import PassesThrough

_copies: dict[str, int] = {}  # unpickled copies made of each optimizer, for their names
# Parameter checks made by this process, per process set (only its ranks make them), for their names.


class DistributedOptimizer(PassesThrough):
    """Wraps a torch optimizer so ``step()`` applies the gradients averaged over all ranks.

    Gradients are grouped into buckets (a small first bucket, then up to
    ``bucket_cap_mb``) in the order they arrive: reverse parameter order in the first
    step, then the order observed in it, agreed across ranks. A bucket's allreduce starts
    from a post-accumulate-grad hook as soon as its last gradient is ready, so
    communication overlaps the rest of backward; buckets waiting on a parameter that got
    no gradient start when backward ends. ``step()`` waits for the buckets and then runs
    the wrapped optimizer. ``no_sync()`` accumulates gradients locally.

    The wrapper holds the optimizer by composition: ``param_groups``, ``state``,
    ``defaults``, ``state_dict()`` and ``load_state_dict()`` are the wrapped optimizer's,
    so LR schedulers, ``torch.amp.GradScaler`` and checkpoints work unchanged.

    Args:
        optimizer: any ``torch.optim.Optimizer``.
        named_parameters: ``model.named_parameters()``, used to name parameters in errors.
        compression: ``ddl.Compression.none`` (default), ``.fp16`` or ``.bf16`` on the wire, or a
            stateful communication hook such as ``ddl.PowerSGD(rank=4)`` (its state is
            :attr:`hook_state`; see also :meth:`register_comm_hook`), or ``"auto"``
            (``ddl.AutoCompression(hook)``, fp16 by default): each bucket compressed only
            where the priced link time saved exceeds the hook's own work; never on one host.
        backward_passes_per_step: backward passes accumulated locally per reduction.
            Gradients are summed over the passes (scale the loss by 1/k for a mean).
            For a count that varies from step to step use ``no_sync()`` instead.
        op: ``ddl.Average`` (default) or ``ddl.Sum`` over ranks.
        gradient_predivide_factor: with Average, divide by this before the sum and by
            size/factor after it (keeps fp16 sums in range on large jobs).
        bucket_cap_mb: the size cap of every bucket but the first (default: the planner's,
            :data:`ddl.reduction.buckets.BUCKET_BYTES`: 25 MiB, DDP's).
        first_bucket_mb: the size cap of the first bucket (default 1 MiB, the planner's
            :data:`~ddl.reduction.buckets.FIRST_BUCKET_BYTES`).
        num_groups, groups: Horovod's manual grouping of gradients into fused allreduces;
            accepted, and left to ddl's bucket planner (which groups by arrival order).
        sparse_as_dense: reduce sparse gradients (``Embedding(sparse=True)``) as dense
            (``.grad`` is made sparse again after, as Horovod's); otherwise each is
            allgathered (indices and values, Horovod's way). ``.grad`` stays sparse either way.
        process_set: reduce over this ``ddl.ProcessSet`` only (Horovod's). On a rank outside
            it the optimizer makes no collective calls and ``step()`` applies the local
            gradients, as Horovod's does (with a warning at construction).
        op=ddl.Adasum: returns Horovod's Adasum optimizer instead (each rank steps locally
            and the parameter changes are combined by Adasum).
        shard_optimizer_state: ZeRO stage 1: each rank keeps the optimizer state of about
            1/N of the parameters and updates only those; gradients reach their owners by
            a reduce-scatter and the updated parameters every rank by an allgather (see
            :class:`~ddl.torch.sharded_optimizer.ShardedOptimizer` and the sharding guide).
            grad_scaler: the ``torch.amp.GradScaler`` that scales the loss, for a stateful hook:
            PowerSGD keeps its error memory in the scale's units and follows its changes.
            Optional: the scaler that first unscales this optimizer becomes its scaler.

    ``torch.amp.GradScaler`` works as with DDP: ``scaler.step(opt)`` (and ``scaler.unscale_``)
    first finish the reduction (:mod:`ddl.torch.amp`), so every rank unscales, checks for inf
    and skips on the same, reduced gradients. With a stateful hook, a step's hook state is
    committed by ``step()``: a step that is not taken (a scaler that found inf or NaN skips
    it) leaves the hook state as it was. Other changes to gradients (clipping) need
    ``synchronize()`` first, then ``step()`` inside ``skip_synchronize()``; a gradient changed
    in place before the reduction finished is an error at ``step()``.

    Example:
        >>> opt = ddl.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
        ...                                      named_parameters=model.named_parameters())  # doctest: +SKIP

    What ``DistributedOptimizer(...)`` returns (:func:`wrapper_class`): with ``op=ddl.Adasum``
    a :class:`~ddl.torch.adasum_optimizer.DistributedAdasumOptimizer` (Horovod's; not an
    instance of this class), with ``shard_optimizer_state=True`` a
    :class:`~ddl.torch.sharded_optimizer.ShardedOptimizer` (a subclass), otherwise this class.
    """

    hook_state: Any  # the stateful hook's state (PowerSGD's), None with a plain compressor
    #: GradScaler's flag for optimizers that unscale and skip by themselves (fused ones): not
    #: this wrapper, whatever the wrapped optimizer says (``__getattr__`` would pass its flag
    #: on): the scaler unscales, after :meth:`_reduce_before_unscale` has reduced.
    _step_supports_amp_scaling = False

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        # Which optimizer a call builds is decided in one place, by name: wrapper_class.
        chosen = wrapper_class(cls, args, kwargs)
        if issubclass(chosen, DistributedOptimizer):
            return super().__new__(chosen)  # then Python runs chosen.__init__(*args, **kwargs)
        return chosen(*args, **kwargs)  # Adasum: not a DistributedOptimizer, so built here whole

    def __init__(
        self, optimizer: torch.optim.Optimizer,
        named_parameters: Iterable[tuple[str, torch.nn.Parameter]] | None = None,
        compression: Any = None, backward_passes_per_step: int = 1, op: Any = ReduceOp.AVERAGE,
        gradient_predivide_factor: float = 1.0, num_groups: int = 0, groups: Any = None,
        sparse_as_dense: bool = False, process_set: Any = None, *, bucket_cap_mb: float = BUCKET_BYTES / MiB,
        first_bucket_mb: float = FIRST_BUCKET_BYTES / MiB, shard_optimizer_state: bool = False,
        grad_scaler: Any = None,
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
        if shard_optimizer_state:
            _check_shardable(optimizer, compression, process_set)
        if grad_scaler is not None and not callable(getattr(grad_scaler, "get_scale", None)):
            raise TypeError(f"grad_scaler must be a torch.amp.GradScaler (something with get_scale()), got "
                            f"{type(grad_scaler).__name__}")
        self.__dict__["optimizer"] = optimizer
        self.__dict__["_grad_scaler"] = grad_scaler
        hook = as_hook_or_auto(compression)
        if shard_optimizer_state and isinstance(hook, AutoCompression):
            hook = Compression.none  # sharded gradients travel in their own dtype: auto has nothing to choose
        state = None if isinstance(hook, Compressor) else hook.new_state()
        self.__dict__["hook_state"] = None if state is None else _deferred(state)
        self._options = Options(
            compression=hook, backward_passes_per_step=backward_passes_per_step,
            op=reduce_op, gradient_predivide_factor=float(gradient_predivide_factor),
            bucket_cap_mb=float(bucket_cap_mb), first_bucket_mb=float(first_bucket_mb),
            sparse_as_dense=bool(sparse_as_dense or shard_optimizer_state),  # sharded: owners re-sparsify
            process_set=None if process_set is None or process_set.process_set_id == 0 else process_set,
        )
        self._names = _names_of(optimizer, named_parameters)
        self._no_sync = False
        # Horovod's rule for a rank outside the optimizer's process set: no communication,
        # and step() applies this rank's own gradients (it is no replica of the set's ranks).
        self._outside = process_set is not None and process_set.included() is False
        if self._outside:
            warnings.warn(f"rank {ddl.rank()} is not in {process_set}: this DistributedOptimizer reduces nothing "
                          f"here, and step() applies rank {ddl.rank()}'s own gradients", stacklevel=2)
        self._attach()

    @property
    def _parameter_names(self) -> dict[torch.Tensor, str]:
        """Each parameter's name, under the attribute Horovod's optimizer has (code written for
        Horovod reads it): ``named_parameters``' names, or ``param.<i>`` without them."""
        return self._names

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's ``state_dict()``: loads into the plain optimizer too."""
        return self.optimizer.state_dict()  # type: ignore[no-any-return]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a ``state_dict()`` of this or of the plain optimizer."""
        self.optimizer.load_state_dict(state_dict)

    def __getstate__(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer, "options": self._options,
                "names": [self._names[p] for p in _all_params(self.optimizer)], "prefix": self._prefix,
                "order": self._reducer.agreed, "outside": self._outside, "hook_state": self.hook_state}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__["optimizer"] = state["optimizer"]
        self.__dict__["hook_state"] = state.get("hook_state")
        self.__dict__["_grad_scaler"] = None  # a copy is stepped by its own scaler: pass it again to the copy
        self._options = state["options"]
        self._outside = state.get("outside", False)
        params = _all_params(self.optimizer)
        self._names = dict(zip(params, state["names"], strict=True))
        # Unpickling or deepcopy may happen on one rank alone: no cross-rank check, and
        # a name from the original's (not from the shared counter, which would then
        # differ between ranks and leave later optimizers unmatched).
        # The copy keeps the bucket order its original's ranks agreed on, if they have.
        original = state.get("prefix", "ddl.torch.opt?")
        n = _copies[original] = _copies.get(original, 0) + 1
        self._base, self._version, self._no_sync = f"{original}.copy{n}", 0, False
        self._attach(prefix=self._base, check=False, order=state.get("order"))

    def __repr__(self) -> str:
        return f"ddl.torch.DistributedOptimizer({self.optimizer!r})"

    # -- hooks and buckets -----------------------------------------------------------
    def _attach(self, *, prefix: str | None = None, check: bool = True, order: list[int] | None = None) -> None:
        """(Re)build the reducer for the current parameters (``check``: compare the
        parameters across ranks, a collective call)."""
        old = self.__dict__.get("_reducer")
        if old is not None:
            old.close()
        params = _all_params(self.optimizer)
        if prefix is None:
            self._base, self._version = manifest_name("ddl.torch.opt", _manifest(params, self._names)), 0
            prefix = self._base
        self._prefix = prefix
        self._known = params
        if check and not self.__dict__.get("_outside", False):
            _check_same_model(_manifest(params, self._names), self._options.process_set)
        self._reducer = self._new_reducer(params, prefix, order=order, check=check)
        self._skip = False

    def _new_reducer(self, params: list[torch.Tensor], prefix: str, *, order: list[int] | None,
                     check: bool) -> Reducer:
        """The reducer for ``params`` (``check``: a collective call is allowed, as at construction)."""
        outside = self.__dict__.get("_outside", False)
        scaler = self.__dict__.get("_grad_scaler")
        return Reducer([] if outside else params, self._names, self._options, prefix, order=order,
                       no_sync=self.__dict__.get("_no_sync", False), hook_state=self.hook_state,
                       loss_scale=None if scaler is None else scaler.get_scale)

    def _next_prefix(self) -> str:
        self._version += 1
        return f"{self._base}.v{self._version}"

    def _name_new(self) -> None:
        for g, group in enumerate(self.param_groups):
            for i, p in enumerate(group["params"]):
                self._names.setdefault(p, f"param_groups[{g}].params[{i}]")

    # -- the public optimizer interface ------------------------------------------------
    def gradient_order(self) -> list[int] | None:
        """The order of the gradients (indices of the trainable parameters, in parameter
        order) the ranks agreed on after the first step, which the buckets follow since;
        None before. ``ddl plan --order`` takes it to price exactly these buckets.

        Example:
            >>> json.dump(opt.gradient_order(), open("order.json", "w"))   # doctest: +SKIP
            >>> # ddl plan ... --model pkg.mod:factory --order order.json
        """
        return None if self._reducer.agreed is None else list(self._reducer.agreed)

    def _adopt_order(self, order: list[int]) -> None:
        """Plan the buckets in ``order`` (a checkpoint's: the same on every rank, so no
        collective), as the ranks that saved it had agreed: a stateful hook's per-bucket
        state then meets the same buckets."""
        if self._reducer.agreed == list(order) or self.__dict__.get("_outside", False):
            return
        if self._reducer.in_flight():
            raise RuntimeError("loading a checkpoint while gradient allreduces are in flight; call step() first")
        self._attach(prefix=self._prefix, check=False, order=list(order))

    def register_comm_hook(self, state: Any, hook: Any) -> None:
        """Reduce the gradient buckets with ``hook(state, bucket)`` (DDP's ``register_comm_hook``).

        ``hook`` is a stateful hook object (``ddl.PowerSGD(...)``, with ``state`` from its
        ``new_state()``, or None to make one) or a compressor (``state`` unused). Call it
        before the first backward pass, on every rank alike.

        Example:
            >>> hook = ddl.PowerSGD(rank=4, start_iter=10)                  # doctest: +SKIP
            >>> opt.register_comm_hook(hook.new_state(), hook)              # doctest: +SKIP
        """
        if self._reducer.in_flight():
            raise RuntimeError("register_comm_hook() while gradient allreduces are in flight; call step() first")
        checked = as_hook_or_auto(hook)
        if isinstance(checked, Compressor):
            state = None
        elif state is None:
            state = checked.new_state()
        self.__dict__["hook_state"] = _deferred(state)
        self._options = dataclasses.replace(self._options, compression=checked)
        self._attach(prefix=self._prefix, check=False, order=self._reducer.agreed)

    def compression_stats(self) -> dict[str, float]:
        """The communication hook's statistics (PowerSGD's: elements before and after, their ratio).

        Raises:
            RuntimeError: the optimizer has no stateful hook, or its hook keeps no statistics.
        """
        stats = getattr(self.hook_state, "compression_stats", None)
        if stats is None:
            raise RuntimeError(f"compression_stats(): this optimizer reduces with {self._options.compression!r}, "
                               "which keeps no statistics; pass compression=ddl.PowerSGD(...)")
        return stats()  # type: ignore[no-any-return]

    def synchronize(self) -> None:
        """Finish every bucket's allreduce and write the averaged gradients into ``.grad``.

        A ``step()`` after it outside ``skip_synchronize()`` warns, as Horovod's does.

        Buckets whose gradients did not all arrive (parameters unused in this step) are
        started now if the end of backward has not started them, with zeros for the
        missing ones. Calling it twice without a backward pass or ``zero_grad()`` in
        between does nothing the second time (a rank whose step had no backward pass still
        reduces its part after ``zero_grad()``). Parameters put into ``param_groups`` since the last call (by
        ``append`` or the wrapped optimizer's ``add_param_group``) are reduced too, and
        hooked from now on: every rank must add the same ones.
        """
        self.__dict__["_user_synchronized"] = True
        self._sync()

    def _sync(self) -> None:
        self._reducer.check_frozen()
        if self._no_sync:
            raise RuntimeError(
                "optimizer.step() or synchronize() inside no_sync() would reduce this rank's gradients "
                "alone; leave the no_sync() block and run the step's last backward pass outside it first"
            )
        params = _all_params(self.optimizer)
        if len(params) == len(self._known) and all(a is b for a, b in zip(params, self._known, strict=True)):
            self._reducer.synchronize()
            return
        if self._outside:  # nothing to reduce or agree on: just watch the new set
            self._name_new()
            self._attach(prefix=self._next_prefix(), check=False)
            return
        # The parameters changed behind the wrapper's back: agree on the new set, reduce
        # the new ones with this step's buckets, then plan and hook them all.
        self._name_new()
        prefix = self._next_prefix()
        _check_same_model(_manifest(params, self._names), self._options.process_set)
        hooked = set(self._reducer.index) | set(self._reducer.frozen)
        self._reducer.stop_observing()
        self._reducer.synchronize(extra=late_buckets([p for p in params if p not in hooked], self._options, prefix))
        self._attach(prefix=prefix, check=False)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Within this block backward passes accumulate gradients locally, with no communication.

        The first backward pass after the block reduces the accumulated sum (as
        ``DistributedDataParallel.no_sync``), so any number of passes per step works:
        scale each loss so that their sum is the step's loss. Passes inside the block do
        not count towards ``backward_passes_per_step`` (leave it at 1 with ``no_sync``).
        ``step()`` inside the block is an error.

        Example:
            >>> for i, (x, y) in enumerate(micro_batches):                  # doctest: +SKIP
            ...     ctx = opt.no_sync() if i < len(micro_batches) - 1 else contextlib.nullcontext()
            ...     with ctx: (loss_fn(model(x), y) / len(micro_batches)).backward()
            >>> opt.step()                                                   # doctest: +SKIP
        """
        in_flight = self._reducer.in_flight()
        if in_flight and not self._no_sync:
            raise RuntimeError(
                f"no_sync() entered while {len(in_flight)} gradient allreduce(s) are in flight "
                f"({', '.join(in_flight[:3])}); call optimizer.step() first"
            )
        outer = self._no_sync
        self._no_sync = self._reducer.no_sync = True
        try:
            yield
        finally:
            self._no_sync = self._reducer.no_sync = outer

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
        """Synchronize the gradients, then run the wrapped optimizer's ``step`` (and commit a
        stateful hook's state of this step)."""
        if closure is not None:
            def reduced_closure() -> Any:
                with torch.enable_grad():
                    loss = closure()
                self._sync()
                return loss

            loss = self.optimizer.step(reduced_closure)
            self._commit_hook()
            return loss
        if not self._skip:
            if self.__dict__.get("_user_synchronized"):
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() context after "
                              "optimizer.synchronize(). This can cause training slowdown. You may want to consider "
                              "using optimizer.skip_synchronize() context if you use optimizer.synchronize() in "
                              "your code.", stacklevel=2)
            self._sync()
        self.__dict__["_user_synchronized"] = False
        loss = self.optimizer.step()
        self._commit_hook()
        return loss

    def _reduce_before_unscale(self, scaler: Any) -> None:
        """``GradScaler.unscale_(self)`` is about to read ``.grad`` (:mod:`ddl.torch.amp`): finish
        the reduction, so every rank reads the same gradients. The scaler is this optimizer's
        loss scaler from now on if none was given (a stateful hook follows its scale; this
        step's hook values carried its current scale)."""
        if self.__dict__.get("_grad_scaler") is None and self.hook_state is not None:
            self.__dict__["_grad_scaler"] = scaler
            self._reducer.loss_scale = scaler.get_scale
            relabel = getattr(self.hook_state, "relabel", None)
            if relabel is not None:
                relabel(float(scaler.get_scale()))
        if not self._outside:
            self._sync()

    def _commit_hook(self) -> None:
        """The step was taken: a stateful hook's update of it stands. Say once if an earlier
        step was not (a GradScaler's skip) while the hook does not know the loss scale."""
        state = self.hook_state
        commit = getattr(state, "commit", None)
        if commit is None:
            return
        commit()
        if getattr(state, "skipped", 0) and self.__dict__.get("_grad_scaler") is None \
                and not self.__dict__.get("_told_dropped"):
            self.__dict__["_told_dropped"] = True
            warnings.warn(f"{self._options.compression!r}: a step's gradients were not finite, or optimizer.step() "
                          "did not follow their reduction (a GradScaler that found inf or NaN skips it); the hook "
                          "state of that step was left out, as it should be. If a GradScaler scales the loss, pass "
                          "grad_scaler=scaler to DistributedOptimizer: the hook's error memory must follow the "
                          "scale's changes", stacklevel=3)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The wrapped optimizer's ``zero_grad``.

        Raises:
            RuntimeError: gradient allreduces are still in flight (call ``step()`` or
                ``synchronize()`` first), since their results would land on zeroed grads.
        """
        in_flight = self._reducer.in_flight()
        if in_flight:
            raise RuntimeError(
                f"zero_grad() called while {len(in_flight)} gradient allreduce(s) are in flight "
                f"({', '.join(in_flight[:3])}); call optimizer.step() or optimizer.synchronize() first"
            )
        self._reducer.reset()
        # A new step: the next synchronize() reduces even if this rank gets no gradient at
        # all (no backward here), since the other ranks' step reduces theirs.
        self._reducer.synchronized = False
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a parameter group to the wrapped optimizer and rebuild the buckets (every rank
        must add the same group)."""
        if self._reducer.in_flight():
            raise RuntimeError("add_param_group() while gradient allreduces are in flight; call step() first")
        self.optimizer.add_param_group(param_group)
        self._name_new()
        self._attach(prefix=self._next_prefix())


def wrapper_class(cls: type[DistributedOptimizer], args: tuple[Any, ...], kwargs: dict[str, Any]) -> type[Any]:
    """The optimizer class that ``cls(*args, **kwargs)`` builds.

    ``op=ddl.Adasum`` is a different algorithm (Horovod's ``_DistributedAdasumOptimizer``:
    the model's change from each local step is combined, not the gradients), so
    ``DistributedOptimizer(..., op=ddl.Adasum)`` returns
    :class:`~ddl.torch.adasum_optimizer.DistributedAdasumOptimizer`, as Horovod's does.
    ``DistributedOptimizer(..., shard_optimizer_state=True)`` is ZeRO stage 1:
    :class:`~ddl.torch.sharded_optimizer.ShardedOptimizer` (:data:`sharded_class`). Otherwise ``cls`` itself. The
    arguments are read by name through ``DistributedOptimizer.__init__``'s signature, so
    ``op`` counts wherever it stands; arguments that do not fit it are left for
    ``__init__`` to refuse (unpickling makes one with none).

    Example:
        >>> wrapper_class(DistributedOptimizer, (), {}).__name__
        'DistributedOptimizer'
        >>> wrapper_class(DistributedOptimizer, ("sgd",), {"shard_optimizer_state": True}).__name__
        'ShardedOptimizer'
        >>> wrapper_class(DistributedOptimizer, ("sgd", None, None, 1, ddl.Adasum), {}).__name__
        'DistributedAdasumOptimizer'
    """
    try:
        given = _SIGNATURE.bind(None, *args, **kwargs).arguments
    except TypeError:
        return cls
    op = given.get("op")
    if given.get("optimizer") is not None and op is not None and as_op(op) is ReduceOp.ADASUM:
        from .adasum_optimizer import DistributedAdasumOptimizer

        return DistributedAdasumOptimizer
    if given.get("shard_optimizer_state") and cls is DistributedOptimizer:
        if sharded_class is None:
            raise RuntimeError("shard_optimizer_state=True needs ddl.torch.sharded_optimizer; import ddl.torch")
        return sharded_class
    return cls


#: The class ``DistributedOptimizer(..., shard_optimizer_state=True)`` builds:
#: :class:`~ddl.torch.sharded_optimizer.ShardedOptimizer`. It subclasses DistributedOptimizer,
#: so this module cannot import it (no two modules import each other): ``ddl.torch``'s
#: ``__init__`` sets it, in one line, right after importing both.
sharded_class: type[DistributedOptimizer] | None = None


_SIGNATURE = inspect.signature(DistributedOptimizer.__init__)

def _deferred(state: Any) -> Any:
    """A stateful hook's state whose updates wait for ``step()`` (when it can: PowerSGD's)."""
    if callable(getattr(state, "commit", None)) and hasattr(state, "deferred"):
        state.deferred = True
    return state


def _check_shardable(optimizer: torch.optim.Optimizer, compression: Any, process_set: Any) -> None:
    """Refuse what a sharded optimizer cannot do, before any collective call."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("shard_optimizer_state=True cannot shard LBFGS: its step looks at every parameter at once "
                         "(a flat view of all of them); use it unsharded")
    hook = as_hook_or_auto(compression)
    if isinstance(hook, AutoCompression):  # sharded gradients travel plainly: nothing for auto to choose
        hook = Compression.none
    if not isinstance(hook, Compressor):
        raise ValueError(f"shard_optimizer_state=True cannot take a communication hook ({hook.name}): its "
                         "gradients reach their owners by a reduce-scatter, which a hook such as PowerSGD does "
                         "not produce; drop one of the two")
    if hook.wire is not None:
        raise ValueError("shard_optimizer_state=True reduces gradients in their own dtype; drop compression= "
                         "(or train unsharded to compress them)")
    if process_set is not None and process_set.process_set_id != 0:
        raise ValueError("shard_optimizer_state=True shards over every rank; drop process_set= "
                         "(or train unsharded within the process set)")


def _all_params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _names_of(optimizer: torch.optim.Optimizer,
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


def _manifest(params: list[torch.Tensor], names: dict[torch.Tensor, str]) -> list[tuple[str, tuple[int, ...], str]]:
    return [(names[p], tuple(p.shape), str(p.dtype)) for p in params]


def _check_same_model(manifest: list[tuple[str, tuple[int, ...], str]], process_set: Any = None) -> None:
    """Every rank must wrap the same parameters, or buckets would not line up: say which differ."""
    if not ddl.is_initialized() or ddl.size() == 1:
        return
    # Named by where the program built the optimizer (and in which process set): a name
    # from the manifest would differ exactly where this check must catch it, and an unnamed
    # call would be matched per thread, whose names differ when ranks start their threads
    # in another order.
    pid = 0 if process_set is None else int(process_set.process_set_id or 0)
    everyone = api.allgather_object(manifest, name=call_site_name(f"ddl.torch.opt.check.{pid}"), process_set=process_set)
    for r, other in enumerate(everyone):
        if other != manifest:
            diff = next(((a, b) for a, b in zip(manifest, other, strict=False) if a != b), None)
            what = (f"first difference: here {diff[0]}, rank {r} {diff[1]}" if diff
                    else f"{len(manifest)} parameters here, {len(other)} on rank {r}")
            raise ddl.MismatchError(
                f"rank {ddl.rank()} and rank {r} wrap different parameters in DistributedOptimizer ({what}); "
                "build the same model and optimizer on every rank"
            )

