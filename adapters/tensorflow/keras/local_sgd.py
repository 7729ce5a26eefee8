"""Local SGD and DiLoCo for Keras 3: optimizer wrappers that ``model.fit`` takes.

The same algorithms as ``ddl.torch.LocalSGD`` and ``ddl.torch.DiLoCo`` (see that
module): each rank runs the wrapped (inner) optimizer on its own gradients; every
``period`` steps the pseudo-gradients anchor - weights are averaged over the ranks
through a communication hook (plain, fp16, or PowerSGD, with kernels seen as
(everything else) x output dimension), and an outer update moves the anchor that every
rank continues from. The anchor, the step count and the outer optimizer's slots are
optimizer variables, so ``KerasState`` keeps them through elastic world changes; a
round still in flight at a restore is started again from the saved weights.

Inside ``model.fit`` the rounds are ``tf.numpy_function`` calls under ``tf.cond`` (no
XLA: ``jit_compile=False``). After ``fit`` with ``overlap`` on (or mid-period), call
``optimizer.synchronize()`` to bring every rank to the same weights.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
from keras.src.utils import tracking  # the decorator Keras's own wrappers use in build()

import tensorflow as tf
from ddl.checkpoint.replicas import mean
from ddl.engine.hooked import HookedBuckets, Pending
from ddl.engine.hooks import as_hook
from ddl.engine.naming import manifest_name
from ddl.engine.periodic import RoundSchedule
from ddl.runtime import api

from ..bridge import host_call
from ..hook_reducer import hook_config, hook_from_config
from .lossscale import is_loss_scale
from .wrapping import PassesThrough

__all__ = ["DiLoCo", "LocalSGD"]


class _Periodic(PassesThrough, keras.optimizers.Optimizer):  # type: ignore[misc]
    """The shared machinery: anchors, rounds (blocking or overlapped), synchronize."""

    _kind = "periodic"

    def __init__(self, inner_optimizer: Any, *, period: int, compression: Any, overlap: int, process_set: Any,
                 name: str | None) -> None:
        if not isinstance(inner_optimizer, keras.optimizers.Optimizer):
            raise TypeError(f"{type(self).__name__} wraps a Keras 3 optimizer, got "
                            f"{type(inner_optimizer).__module__}.{type(inner_optimizer).__name__}")
        held = getattr(inner_optimizer, "inner_optimizer", None)
        if held is not None and not (is_loss_scale(inner_optimizer) and not hasattr(held, "inner_optimizer")):
            raise TypeError(f"{type(self).__name__} wraps a plain Keras optimizer (each rank steps alone), or a "
                            f"LossScaleOptimizer around one; not {type(inner_optimizer).__name__}: pass the optimizer "
                            "it wraps")
        schedule = RoundSchedule.checked(type(self).__name__, period, overlap)
        super().__init__(learning_rate=0.0, name=name or f"{self._kind}_{inner_optimizer.name}")
        self.inner_optimizer = inner_optimizer
        self.period, self.overlap = period, overlap
        self._schedule = schedule  # decided on the counter variables, in the graph (ddl.engine.periodic)
        self._hook = as_hook(compression)
        self._process_set = None if process_set is None or process_set.process_set_id == 0 else process_set
        self._rounds: HookedBuckets | None = None
        self._pending: Pending | None = None

    # -- variables -------------------------------------------------------------------
    @tracking.no_automatic_dependency_tracking  # type: ignore[misc,untyped-decorator]
    def build(self, var_list: list[Any]) -> None:
        """Build the inner (and outer) optimizer, the anchors and the counters."""
        for v in var_list:
            if not v.dtype.startswith("float") and v.dtype != "bfloat16":
                raise TypeError(f"{type(self).__name__} averages floating-point variables, got {v.path} of {v.dtype}")
        self._anchors = [self.add_variable_from_reference(v, name="ddl_anchor") for v in var_list]
        self._boundary = [self.add_variable_from_reference(v, name="ddl_boundary") for v in var_list] \
            if self.overlap else []
        counter = {"shape": (), "dtype": "int64", "initializer": "zeros", "aggregation": "none"}
        self._steps = self.add_variable(name="ddl_steps", **counter)
        self._unsent = self.add_variable(name="ddl_unsent", **counter)
        self._anchored = self.add_variable(name="ddl_anchored", **counter)
        self._merge_at = self.add_variable(name="ddl_merge_at", **counter)
        self._in_flight = self.add_variable(name="ddl_in_flight", **counter)
        self.inner_optimizer.build(var_list)
        self._build_outer(var_list)
        super().build(var_list)
        shapes = [tuple(int(d) for d in v.shape) for v in var_list]
        self._rounds = HookedBuckets(shapes, [tf.as_dtype(v.dtype).as_numpy_dtype for v in var_list], hook=self._hook,
                                     name=manifest_name(f"ddl.keras.{self._kind}", [(s, str(v.dtype)) for s, v in
                                                                                   zip(shapes, var_list, strict=True)]),
                                     out_axis=-1)

    def _build_outer(self, var_list: list[Any]) -> None:
        """DiLoCo builds its outer optimizer here."""

    @property
    def variables(self) -> list[Any]:
        return self._variables[:] + self.inner_optimizer.variables + self._outer_variables()  # type: ignore[no-any-return]

    def _outer_variables(self) -> list[Any]:
        return []

    @property
    def hook_state(self) -> Any:
        """The pseudo-gradients' hook state (PowerSGD's), None for a plain compressor."""
        return None if self._rounds is None else self._rounds.state

    # -- the steps -------------------------------------------------------------------
    def apply(self, grads: Any, trainable_variables: Any = None) -> None:
        """One inner step with the wrapped optimizer; every ``period`` steps, an outer step."""
        grads = list(grads)
        tvs = list(self._trainable_variables) if trainable_variables is None else list(trainable_variables)
        if not self.built:
            self.build(tvs)
        tf.cond(tf.equal(self._anchored, 0), lambda: self._take_anchor(tvs), lambda: tf.constant(False))
        self.inner_optimizer.apply(grads, tvs)
        self._count(tvs)

    def _count(self, tvs: list[Any]) -> tf.Tensor:
        """Count an inner step (taken or skipped) and do the outer step it makes due."""
        self._steps.assign_add(1)
        self._unsent.assign_add(1)
        if not self._schedule.waits:
            due = self._schedule.merge_due(self._steps, tf.equal(self._in_flight, 1), self._merge_at)
            tf.cond(due, lambda: self._merge(tvs), lambda: tf.constant(False))
        tf.cond(self._schedule.round_due(self._steps), lambda: self._round(tvs), lambda: tf.constant(False))
        return tf.constant(True)

    def _before_loss_scale_check(self, grads: list[Any], trainable_variables: Any, scaler: Any) -> list[Any]:
        """A ``LossScaleOptimizer`` around this one is about to check this rank's ``grads``
        (:mod:`ddl.tensorflow.keras.lossscale`): each rank decides alone, as it steps alone, but
        a rank that will skip its inner step still counts it here, so every rank starts the
        rounds at the same steps."""
        tvs = list(self._trainable_variables if trainable_variables is None else trainable_variables)
        if not self.built:
            self.build(tvs)
        dense = [tf.convert_to_tensor(g) for g in grads if g is not None]
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in dense])

        def skipped() -> tf.Tensor:
            tf.cond(tf.equal(self._anchored, 0), lambda: self._take_anchor(tvs), lambda: tf.constant(False))
            return self._count(tvs)

        tf.cond(finite, lambda: tf.constant(False), skipped)
        return grads

    def synchronize(self) -> None:
        """Every rank to the same weights now (eagerly, after ``fit``): finish the round in
        flight, then average the steps taken since, if any. A collective call.

        Example:
            >>> model.fit(data, epochs=3); model.optimizer.synchronize()  # doctest: +SKIP
        """
        if not self.built:
            return
        tvs = list(self._trainable_variables)
        if int(self._in_flight.numpy()):
            self._merge(tvs)
        if self._schedule.last_round_due(int(self._unsent.numpy()), bool(self._anchored.numpy())):
            self._round(tvs, wait=True)

    def _take_anchor(self, tvs: list[Any]) -> tf.Tensor:
        # At the first step, not at build: after BroadcastGlobalVariablesCallback has run.
        for a, v in zip(self._anchors, tvs, strict=True):
            a.assign(v)
        self._anchored.assign(1)
        return tf.constant(True)

    def _round(self, tvs: list[Any], *, wait: bool = False) -> tf.Tensor:
        """Start averaging anchor - weights; without overlap, apply it at once."""
        deltas = [tf.convert_to_tensor(a) - tf.convert_to_tensor(v) for a, v in zip(self._anchors, tvs, strict=True)]
        self._unsent.assign(0)
        if self._schedule.waits or wait:
            averaged = host_call(self._reduce_now, deltas, [d.dtype for d in deltas], [d.shape for d in deltas],
                                 what=f"{self._kind} round")
            self._outer_update(averaged, tvs)
            for a, v in zip(self._anchors, tvs, strict=True):
                v.assign(a)
            return tf.constant(True)
        for b, v in zip(self._boundary, tvs, strict=True):
            b.assign(v)
        host_call(self._start, deltas, [tf.int32], [()], what=f"{self._kind} round start")
        self._in_flight.assign(1)
        self._merge_at.assign(self._schedule.merge_at(self._steps))
        return tf.constant(True)

    def _merge(self, tvs: list[Any]) -> tf.Tensor:
        """Apply the round in flight: the outer update, then weights = anchor + what this rank moved since."""
        # The deltas again: a round lost in a restore (no Python side left) is started over from them.
        deltas = [tf.convert_to_tensor(a) - tf.convert_to_tensor(b) for a, b in zip(self._anchors, self._boundary,
                                                                                  strict=True)]
        averaged = host_call(self._finish, deltas, [d.dtype for d in deltas], [d.shape for d in deltas],
                             what=f"{self._kind} round end")
        moved = [tf.convert_to_tensor(v) - tf.convert_to_tensor(b) for v, b in zip(tvs, self._boundary, strict=True)]
        self._outer_update(averaged, tvs)
        for a, v, d in zip(self._anchors, tvs, moved, strict=True):
            v.assign(tf.convert_to_tensor(a) + d)
        self._in_flight.assign(0)
        return tf.constant(True)

    def _outer_update(self, averaged: list[tf.Tensor], tvs: list[Any]) -> None:
        raise NotImplementedError

    # -- checkpoints ------------------------------------------------------------------
    def _restored(self) -> None:
        """After a load (:mod:`ddl.tensorflow.keras.checkpoint`): no Python side of a round is left;
        a round the variables say is in flight starts again from them when it is due."""
        self._pending = None

    def _synchronize_saved(self, replicas: list[list[np.ndarray]], boundaries: list[list[np.ndarray]] | None) -> None:
        """What :meth:`synchronize` would have done at a checkpoint's save, from every saved
        rank's trained weights (``boundaries``: where each started the round in flight),
        without a collective: a world of another size goes on from that one point. Eager; the
        anchors and counters are loaded already."""
        tvs = list(self._trainable_variables)
        anchors = [np.asarray(a) for a in self._anchors]
        if int(self._in_flight.numpy()):
            assert boundaries is not None
            self._outer_update([tf.constant(mean([a - b[i] for b in boundaries])) for i, a in enumerate(anchors)], tvs)
            replicas = [[np.asarray(a) + (w[i] - b[i]) for i, a in enumerate(self._anchors)]
                        for w, b in zip(replicas, boundaries, strict=True)]
            self._in_flight.assign(0)
            anchors = [np.asarray(a) for a in self._anchors]
        if int(self._unsent.numpy()):
            self._outer_update([tf.constant(mean([a - w[i] for w in replicas])) for i, a in enumerate(anchors)], tvs)
        for v, a in zip(tvs, self._anchors, strict=True):
            v.assign(a)
        self._unsent.assign(0)
        self._pending = None

    # -- the host side ----------------------------------------------------------------
    def _start(self, *deltas: Any) -> list[Any]:
        assert self._rounds is not None
        for view, d in zip(self._rounds.views(), deltas, strict=True):
            view[...] = d
        self._pending = self._rounds.start(api.collectives(self._process_set))
        return [np.int32(0)]

    def _finish(self, *deltas: Any) -> list[Any]:
        if self._pending is None:  # restored with a round in flight: run it again
            self._start(*deltas)
        assert self._pending is not None
        out = [v.copy() for v in self._pending.wait()]
        self._pending = None
        return out

    def _reduce_now(self, *deltas: Any) -> list[Any]:
        self._start(*deltas)
        return self._finish(*deltas)

    def get_config(self) -> dict[str, Any]:
        return {"name": self.name, "optimizer": keras.saving.serialize_keras_object(self.inner_optimizer),
                "period": self.period, "overlap": self.overlap,
                "compression": hook_config(self._hook)}


@keras.saving.register_keras_serializable(package="ddl")
class LocalSGD(_Periodic):
    """Local SGD for Keras: each rank steps alone; every ``period`` steps the weights are averaged.

    Args:
        optimizer: a plain Keras 3 optimizer (not a ``DistributedOptimizer``).
        period: H, steps between averages (>= 1). With 1 and plain SGD it is synchronous SGD.
        compression: how each rank's change travels: ``ddl.Compression.none`` (default),
            ``.fp16``, ``.bf16`` or ``ddl.PowerSGD(...)``.
        overlap: steps the average may take in the background (0: wait; up to ``period``).
        process_set: average over this ``ddl.ProcessSet`` only.

    Raises:
        ValueError: ``period`` < 1 or ``overlap`` outside 0..period. TypeError: not a plain
            Keras optimizer; a variable that is not floating-point (at build).

    Example:
        >>> model.compile(optimizer=ddl.tensorflow.keras.LocalSGD(keras.optimizers.SGD(0.1), period=8),
        ...               loss="sparse_categorical_crossentropy")  # doctest: +SKIP
    """

    _kind = "localsgd"

    def __init__(self, optimizer: Any, period: int, *, compression: Any = None, overlap: int = 0,
                 process_set: Any = None, name: str | None = None) -> None:
        super().__init__(optimizer, period=period, compression=compression, overlap=overlap,
                         process_set=process_set, name=name)

    def _outer_update(self, averaged: list[tf.Tensor], tvs: list[Any]) -> None:
        for a, d in zip(self._anchors, averaged, strict=True):
            a.assign_sub(d)  # anchor - mean(anchor - w_i) = mean(w_i)


@keras.saving.register_keras_serializable(package="ddl")
class DiLoCo(_Periodic):
    """DiLoCo for Keras: inner steps alone, an outer optimizer on the averaged pseudo-gradient.

    Args:
        inner_optimizer: a plain Keras 3 optimizer (AdamW in the paper).
        outer_optimizer: the outer one; default ``SGD(0.7, momentum=0.9, nesterov=True)``,
            the paper's.
        period: H, inner steps per outer step (>= 1). With 1, inner SGD and outer SGD at
            learning rate 1 without momentum it is synchronous SGD.
        compression: how pseudo-gradients travel: ``ddl.Compression.none`` (default),
            ``.fp16``, ``.bf16`` or ``ddl.PowerSGD(...)``.
        overlap: inner steps the average may take in the background (0: wait; up to ``period``).
        process_set: average over this ``ddl.ProcessSet`` only.

    Raises:
        ValueError: ``period`` < 1 or ``overlap`` outside 0..period. TypeError: not plain
            Keras optimizers; a variable that is not floating-point (at build).

    Example:
        >>> opt = ddl.tensorflow.keras.DiLoCo(keras.optimizers.AdamW(1e-3), period=50,
        ...                                   compression=ddl.Compression.fp16)   # doctest: +SKIP
        >>> model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")  # doctest: +SKIP
    """

    _kind = "diloco"

    def __init__(self, inner_optimizer: Any, outer_optimizer: Any = None, *, period: int, compression: Any = None,
                 overlap: int = 0, process_set: Any = None, name: str | None = None) -> None:
        if outer_optimizer is None:
            outer_optimizer = keras.optimizers.SGD(learning_rate=0.7, momentum=0.9, nesterov=True)
        if not isinstance(outer_optimizer, keras.optimizers.Optimizer):
            raise TypeError(f"outer_optimizer must be a Keras 3 optimizer, got {type(outer_optimizer).__name__}")
        super().__init__(inner_optimizer, period=period, compression=compression, overlap=overlap,
                         process_set=process_set, name=name)
        self.outer_optimizer = outer_optimizer

    def _build_outer(self, var_list: list[Any]) -> None:
        self.outer_optimizer.build(var_list)

    def _outer_variables(self) -> list[Any]:
        return list(self.outer_optimizer.variables)

    def _outer_update(self, averaged: list[tf.Tensor], tvs: list[Any]) -> None:
        # The outer optimizer steps the anchor weights: put them in the variables, step, keep them.
        for v, a in zip(tvs, self._anchors, strict=True):
            v.assign(a)
        self.outer_optimizer.apply(averaged, tvs)
        for a, v in zip(self._anchors, tvs, strict=True):
            a.assign(v)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "outer_optimizer": keras.saving.serialize_keras_object(self.outer_optimizer)}

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects: Any = None) -> DiLoCo:
        config = dict(config)
        inner = keras.saving.deserialize_keras_object(config.pop("optimizer"), custom_objects=custom_objects)
        outer = keras.saving.deserialize_keras_object(config.pop("outer_optimizer"), custom_objects=custom_objects)
        config["compression"] = hook_from_config(config.get("compression"))
        return cls(inner, outer, **config)

