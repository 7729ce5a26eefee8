"""DistributedOptimizer for Keras 3: gradients reduced over all ranks in one call, then applied."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
from keras.src.utils import tracking  # the decorator Keras's own LossScaleOptimizer uses in build()

import ddl
import tensorflow as tf
from ddl.base.ops import ReduceOp
from ddl.engine.naming import manifest_name
from ddl.reduction.partition import partition_by_bytes

from ..gradients import check_gradient_op, name_for, reduce_gradients
from ..hook_reducer import HookedReducer, as_reduction, hook_config
from .lossscale import is_loss_scale
from .sharding import agree_finite, gather_from_owners, reduce_to_owners
from .wrapping import PassesThrough


def _context_key(tvs: list[Any]) -> tuple[Any, ...]:
    # The variables and the graph being traced (None eagerly): gradients that compute_gradients
    # reduced are applied as they are by an apply for the same variables in the same context.
    graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
    return (None if graph is None else id(graph), *(id(v) for v in tvs))


@keras.saving.register_keras_serializable(package="ddl")
class DistributedOptimizer(PassesThrough, keras.optimizers.Optimizer):  # type: ignore[misc]
    """Wraps any Keras 3 optimizer so ``model.fit`` trains on every rank's data.

    ``apply()`` (which ``apply_gradients`` and ``model.fit`` call) reduces all gradients
    in one grouped, fused collective and hands the result to the wrapped optimizer, so
    every rank takes the same step. Learning rate, schedules, ``iterations`` and the
    optimizer state are the wrapped optimizer's.

    ``model.save()`` stores the wrapper (registered as ``ddl>DistributedOptimizer``);
    ``keras.models.load_model`` rebuilds it once ``ddl.tensorflow.keras`` is imported
    (or pass ``custom_objects={"DistributedOptimizer": DistributedOptimizer}``).

    Args:
        optimizer: a Keras 3 optimizer (SGD, Adam, AdamW, RMSprop, ...).
        backward_passes_per_step: batches accumulated locally before one reduction and
            one update (the wrapped optimizer's ``iterations`` counts updates).
        average_aggregated_gradients: with ``backward_passes_per_step > 1``, divide the
            accumulated sum by the number of passes (True: k batches of B act like one
            batch of k*B, as with Keras's ``gradient_accumulation_steps``; Horovod's
            default, False, sums them).
        device_dense, device_sparse, gradient_predivide_factor, num_groups, groups,
            scale_local_gradients: accepted for Horovod's signature (the reduction is one
            fused host call; a predivide factor changes nothing in exact arithmetic).
        process_set: reduce over this ``ddl.ProcessSet`` only.
        op: ``ddl.Average`` (default) or ``ddl.Sum`` over ranks.
        compression: ``ddl.Compression.none`` (default), ``.fp16`` or ``.bf16`` on the wire, or
            a stateful communication hook such as ``ddl.PowerSGD(rank=4)`` (its state:
            :attr:`hook_state`; kernels are seen as (everything else) x output dimension).
        sparse_as_dense: reduce ``tf.IndexedSlices`` (Embedding) as dense tensors instead
            of allgathering their rows.
        shard_optimizer_state: ZeRO stage 1: each rank builds the wrapped optimizer (its
            slot variables) for about 1/N of the variables, balanced by bytes, and updates
            only those; gradients reach their owners by a reduce-scatter and the updated
            variables every rank by an allgather. ``model.fit`` and custom loops work
            unchanged; save with :mod:`ddl.tensorflow.keras.checkpoint` (each rank's slots
            differ, so ``model.save`` would keep one rank's part only).

    XLA cannot compile the collectives (they call into Python): with
    ``jit_compile=True`` the first step raises a ValueError saying to pass
    ``jit_compile=False``. Keras's default ``"auto"`` picks no XLA on CPU-only hosts.

    Example:
        >>> opt = DistributedOptimizer(keras.optimizers.Adam(1e-3 * ddl.size()))  # doctest: +SKIP
        >>> model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")  # doctest: +SKIP
    """

    def __init__(self, optimizer: Any, name: str | None = None, device_dense: str = "", device_sparse: str = "",
                 compression: Any = None, sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0,
                 op: Any = ReduceOp.AVERAGE, backward_passes_per_step: int = 1,
                 average_aggregated_gradients: bool = False, num_groups: int = 0, groups: Any = None,
                 process_set: Any = None, scale_local_gradients: bool = True, *,
                 shard_optimizer_state: bool = False) -> None:
        if isinstance(optimizer, DistributedOptimizer):
            raise TypeError("this optimizer is already a ddl DistributedOptimizer; wrap it once")
        if not isinstance(optimizer, keras.optimizers.Optimizer):
            raise TypeError(f"DistributedOptimizer wraps a Keras 3 optimizer (keras.optimizers.*), got "
                            f"{type(optimizer).__module__}.{type(optimizer).__name__}")
        if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be an integer >= 1, got {backward_passes_per_step!r}")
        if optimizer.gradient_accumulation_steps and backward_passes_per_step > 1:
            raise ValueError("use either backward_passes_per_step or the wrapped optimizer's "
                             "gradient_accumulation_steps, not both")
        if shard_optimizer_state:
            _check_shardable(optimizer, backward_passes_per_step, compression, process_set)
        super().__init__(learning_rate=0.0, name=name or f"distributed_{optimizer.name}")
        self.shard_optimizer_state = bool(shard_optimizer_state)
        self._owners: list[int] = []  # each variable's owning rank, at build (sharded)
        self.inner_optimizer = optimizer
        self.backward_passes_per_step = backward_passes_per_step
        self.average_aggregated_gradients = bool(average_aggregated_gradients)
        self.sparse_as_dense = bool(sparse_as_dense)
        self._op = check_gradient_op(op)
        self._compression = as_reduction(compression)
        self._process_set = None if process_set is None or process_set.process_set_id == 0 else process_set
        self._prefix = ""  # from the variables, at build
        self._computed_for: tuple[Any, ...] | None = None  # what compute_gradients last reduced
        self._reduced_for: tuple[int, ...] | None = None  # the variables an outer LossScaleOptimizer's check reduced

    @tracking.no_automatic_dependency_tracking  # type: ignore[misc,untyped-decorator]
    def build(self, var_list: list[Any]) -> None:
        """Build the wrapped optimizer (and gradient accumulators when passes > 1)."""
        k = self.backward_passes_per_step
        self._prefix = manifest_name("ddl.keras", [(tuple(v.shape), str(v.dtype)) for v in var_list])
        self._accumulators = [self.add_variable_from_reference(v, name="ddl_accumulator") for v in var_list] if k > 1 else []
        self._passes = self.add_variable(shape=(), dtype="int", initializer="zeros", aggregation="none",
                                         name="ddl_passes") if k > 1 else None
        if self.shard_optimizer_state:
            # Slots for this rank's part only; the partition depends on the manifest alone.
            self._owners = list(partition_by_bytes(
                [int(np.prod(v.shape, dtype=np.int64)) * np.dtype(v.dtype).itemsize for v in var_list],
                ddl.size()).owners)
            self.inner_optimizer.build(self.owned_variables(var_list))
        else:
            self.inner_optimizer.build(var_list)
        super().build(var_list)

    @property
    def hook_state(self) -> Any:
        """The stateful hook's state (PowerSGD's), None with a plain compressor."""
        return self._compression.state if isinstance(self._compression, HookedReducer) else None

    def compression_stats(self) -> dict[str, float]:
        """The hook's statistics (PowerSGD's: elements before and after compression, their ratio).

        Raises:
            RuntimeError: no stateful hook.
        """
        stats = getattr(self.hook_state, "compression_stats", None)
        if stats is None:
            raise RuntimeError("compression_stats(): this optimizer has no stateful hook; pass "
                               "compression=ddl.PowerSGD(...)")
        return stats()  # type: ignore[no-any-return]

    @property
    def variables(self) -> list[Any]:
        return self._variables[:] + self.inner_optimizer.variables  # type: ignore[no-any-return]

    def apply(self, grads: Any, trainable_variables: Any = None) -> None:
        """Reduce ``grads`` over all ranks (one call) and apply them with the wrapped optimizer.

        Gradients that :meth:`compute_gradients` returned for these variables, in this
        function or eager context, are reduced already: they are applied as they are.
        """
        grads = list(grads)
        if not grads:
            return
        if trainable_variables is None:
            if not self.built:
                raise ValueError("DistributedOptimizer.apply without variables needs a built optimizer; "
                                 "call optimizer.build(model.trainable_variables) first")
            tvs = list(self._trainable_variables)
        else:
            tvs = list(trainable_variables)
            if not self.built:
                self.build(tvs)
        if len(grads) != len(tvs):
            raise ValueError(f"got {len(grads)} gradients for {len(tvs)} variables")
        computed, self._computed_for = self._computed_for == _context_key(tvs), None
        if self._reduced_for == tuple(id(v) for v in tvs):  # reduced before the loss scaler's check
            computed, self._reduced_for = True, None
        if self.shard_optimizer_state:
            self._apply_sharded(grads, tvs, reduced=computed)
            return
        if self.backward_passes_per_step == 1:
            self.inner_optimizer.apply(grads if computed else self._reduce(grads, tvs), tvs)
            return
        if not computed:
            grads = self._accumulated(grads, tvs)
        tf.cond(self._step_due(), lambda: self._inner_apply(grads, tvs), lambda: tf.constant(False))

    # -- sharded optimizer state (ZeRO-1) ---------------------------------------------
    def owned_variables(self, var_list: Any = None) -> list[Any]:
        """The variables this rank updates and keeps slots for (all of them unsharded)."""
        tvs = list(self._trainable_variables if var_list is None else var_list)
        if not self.shard_optimizer_state:
            return tvs
        me = ddl.rank()
        return [v for v, owner in zip(tvs, self._owners, strict=True) if owner == me]

    def replicated_variables(self) -> list[Any]:
        """The optimizer variables every rank holds alike (what a broadcast may overwrite):
        all of them unsharded; sharded, the step counter and learning rate, not the slots."""
        if not self.shard_optimizer_state:
            return self.variables  # type: ignore[no-any-return]
        inner = self.inner_optimizer
        lr = getattr(inner, "_learning_rate", None)
        return [*self._variables, inner._iterations, *([lr] if isinstance(lr, keras.Variable) else [])]

    def _apply_sharded(self, grads: list[Any], tvs: list[Any], *, reduced: bool) -> None:
        """Reduce the gradients to their owners, update this rank's variables, gather the rest."""
        index = {id(v): i for i, v in enumerate(self._trainable_variables)}
        try:
            owners = [self._owners[index[id(v)]] for v in tvs]
        except KeyError:
            raise ValueError("a sharded DistributedOptimizer updates the variables it was built with; "
                             "build it with model.trainable_variables") from None
        present = [i for i, g in enumerate(grads) if g is not None]  # alike on every rank: same model
        dense = [tf.convert_to_tensor(grads[i]) for i in present]  # IndexedSlices travel densified
        me, size = ddl.rank(), ddl.size()
        mine = [i for i in present if owners[i] == me]
        if reduced or size == 1:
            owned = [tf.convert_to_tensor(grads[i]) for i in mine]
        else:
            owned = reduce_to_owners(dense, [owners[i] for i in present], me, size,
                                     name=name_for([tvs[i] for i in present], self._prefix), op=self._op)
        if mine:
            self.inner_optimizer.apply(owned, [tvs[i] for i in mine])
        else:
            self.inner_optimizer._iterations.assign_add(1)  # Keras's apply refuses an empty list
        if size == 1:
            return
        values = [tf.convert_to_tensor(tvs[i]) for i in present]
        others = gather_from_owners(values, [owners[i] for i in present], me, size,
                                    name=name_for([tvs[i] for i in present], self._prefix) + ".params")
        for i, value in zip([i for i in present if owners[i] != me], others, strict=True):
            tvs[i].assign(value)

    def compute_gradients(self, loss: Any, var_list: Any, tape: tf.GradientTape | None = None) -> list[Any]:
        """Horovod's: ``[(gradient, variable)]`` of ``loss`` (a tensor recorded on ``tape``, or a
        callable), reduced over all ranks; pass them to :meth:`apply_gradients`.

        With ``backward_passes_per_step=k`` the gradients are accumulated on this rank: every
        k-th call returns the reduced sum (divided by k with ``average_aggregated_gradients``)
        and the next ``apply_gradients`` applies it; the other calls return the local sum so
        far, and ``apply_gradients`` leaves the variables alone.
        """
        return self._compute_gradients(loss, var_list, tape=tape)

    def _compute_gradients(self, loss: Any, var_list: Any, grad_loss: Any = None,
                           tape: tf.GradientTape | None = None) -> list[Any]:
        tvs = list(var_list() if callable(var_list) else var_list)
        tape = tf.GradientTape() if tape is None else tape
        if callable(loss):
            with tape:
                loss = loss()
        grads = list(tape.gradient(loss, tvs, output_gradients=grad_loss))
        if not self.built:
            self.build(tvs)
        if self.backward_passes_per_step == 1:
            grads = self._reduce(grads, tvs)
        else:
            grads = self._accumulated(grads, tvs)
        self._computed_for = _context_key(tvs)
        return list(zip(grads, tvs, strict=True))

    def _reduce(self, grads: list[Any], tvs: list[Any], loss_scale: Any = None) -> list[Any]:
        if loss_scale is None and is_loss_scale(self.inner_optimizer) and self.inner_optimizer.built:
            loss_scale = self.inner_optimizer.dynamic_scale  # the scale the gradients carry (a hook follows it)
        out: list[Any] = reduce_gradients(grads, name=name_for(tvs, self._prefix), op=self._op,
                                          compression=self._compression, sparse_as_dense=self.sparse_as_dense,
                                          process_set=self._process_set, loss_scale=loss_scale)
        return out

    def _before_loss_scale_check(self, grads: list[Any], trainable_variables: Any, scaler: Any) -> list[Any]:
        """A ``LossScaleOptimizer`` around this one (``mixed_float16``'s ``compile`` puts one there) is
        about to check ``grads`` for inf and NaN (:mod:`ddl.tensorflow.keras.lossscale`): hand it
        what every rank agrees on. Unsharded: the reduced gradients (then applied as they are);
        sharded: the gradients, made non-finite on every rank if they are on any.

        Raises:
            ValueError: ``backward_passes_per_step > 1`` (the scaler would check local sums).
        """
        tvs = list(self._trainable_variables if trainable_variables is None else trainable_variables)
        if not self.built:
            self.build(tvs)
        if self.backward_passes_per_step > 1:
            raise ValueError("a LossScaleOptimizer around a DistributedOptimizer with backward_passes_per_step > 1 "
                             "would check each rank's partial sums; accumulate with the wrapped optimizer's "
                             "gradient_accumulation_steps instead")
        if self.shard_optimizer_state:
            return agree_finite(grads, name=name_for(tvs, self._prefix) + ".finite")
        reduced = self._reduce(grads, tvs, loss_scale=scaler.dynamic_scale)
        self._reduced_for = tuple(id(v) for v in tvs)
        return reduced

    def _step_due(self) -> tf.Tensor:
        assert self._passes is not None
        return tf.equal(self._passes % self.backward_passes_per_step, 0)

    def _accumulated(self, grads: list[Any], tvs: list[Any]) -> list[tf.Tensor]:
        """Add ``grads`` to this rank's sums. On every k-th pass return the sums reduced over
        all ranks (/k with ``average_aggregated_gradients``) and start new sums; on the others
        return the local sums so far."""
        k = self.backward_passes_per_step
        accs = [self._accumulators[self._get_variable_index(v)] for v in tvs]
        for g, acc in zip(grads, accs, strict=True):
            if g is not None:
                acc.assign_add(tf.convert_to_tensor(g))
        assert self._passes is not None
        self._passes.assign_add(1)

        def reduce_sums() -> list[tf.Tensor]:
            scale = 1.0 / k if self.average_aggregated_gradients else 1.0
            summed = [tf.convert_to_tensor(a) * tf.cast(scale, a.dtype) for a in accs]
            reduced = [tf.convert_to_tensor(g) for g in self._reduce(summed, tvs)]
            with tf.control_dependencies(reduced):
                for a in accs:  # zeroed, not decremented: an inf or NaN sum must not outlive its step
                    a.assign(tf.zeros(a.shape, a.dtype))
                return [tf.identity(g) for g in reduced]

        def local_sums() -> list[tf.Tensor]:
            return [tf.convert_to_tensor(a) for a in accs]

        out: list[tf.Tensor] = tf.cond(self._step_due(), reduce_sums, local_sums)
        return out

    def _inner_apply(self, grads: list[Any], tvs: list[Any]) -> tf.Tensor:
        self.inner_optimizer.apply(grads, tvs)
        return tf.constant(True)

    def get_config(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "optimizer": keras.saving.serialize_keras_object(self.inner_optimizer),
            "backward_passes_per_step": self.backward_passes_per_step,
            "average_aggregated_gradients": self.average_aggregated_gradients,
            "op": self._op.value,
            "compression": hook_config(self._compression),
            "sparse_as_dense": self.sparse_as_dense,
            "shard_optimizer_state": self.shard_optimizer_state,
        }


def _check_shardable(optimizer: Any, backward_passes_per_step: int, compression: Any, process_set: Any) -> None:
    """Refuse what a sharded optimizer cannot do, at construction."""
    if optimizer.global_clipnorm:
        raise ValueError("shard_optimizer_state=True: global_clipnorm would measure this rank's gradients only; "
                         "use clipnorm (per variable) or clip the gradients before apply_gradients")
    if is_loss_scale(optimizer):
        raise ValueError("shard_optimizer_state=True: a LossScaleOptimizer inside would check each rank's own "
                         "variables' gradients and skip steps alone; put it outside: "
                         "keras.optimizers.LossScaleOptimizer(DistributedOptimizer(opt, shard_optimizer_state=True)) "
                         "(model.compile does so under the mixed_float16 policy)")
    if optimizer.use_ema:
        raise ValueError("shard_optimizer_state=True cannot keep an exponential moving average of every variable "
                         "(use_ema): each rank updates its part only; train unsharded to use it")
    if backward_passes_per_step > 1:
        raise ValueError("shard_optimizer_state=True takes backward_passes_per_step=1; accumulate with the wrapped "
                         "optimizer's gradient_accumulation_steps instead")
    reduction = as_reduction(compression)
    if isinstance(reduction, HookedReducer):
        raise ValueError(f"shard_optimizer_state=True cannot take a communication hook ({reduction.hook.name}): its "
                         "gradients reach their owners by a reduce-scatter, which a hook such as PowerSGD does not "
                         "produce; drop one of the two")
    if reduction.wire is not None:
        raise ValueError("shard_optimizer_state=True reduces gradients in their own dtype; drop compression=")
    if process_set is not None and process_set.process_set_id != 0:
        raise ValueError("shard_optimizer_state=True shards over every rank; drop process_set=")
