"""Keras callbacks for data-parallel training: state broadcast, metric averaging, LR warm-up."""

from __future__ import annotations

import math
from typing import Any

import keras
import numpy as np

import ddl

from ..tape import broadcast_variables


def _check_no_xla(model: Any) -> None:
    if getattr(model, "jit_compile", False):
        raise ValueError("ddl.tensorflow cannot train an XLA-compiled model: its collectives call into Python "
                         "(tf.numpy_function), which XLA cannot compile. Compile the model with "
                         "model.compile(..., jit_compile=False) (Keras's default jit_compile='auto' turns "
                         "XLA on wherever TensorFlow sees a GPU).")


def _is_number(v: Any) -> bool:
    try:
        float(v)
    except (TypeError, ValueError):
        return False
    return bool(np.ndim(v) == 0)


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """Overwrite the model's and the optimizer's variables with ``root_rank``'s, once.

    A model that is built when training begins is broadcast then, before the first
    update (its optimizer built first if it is not yet: Keras 3 creates slots lazily, so
    momentum buffers and step counters are equal on every rank too). A model built by
    its first batch (a ``Sequential`` without an input shape) has no variables before
    that batch; it is broadcast at the end of the first batch, as Horovod does, after
    which every rank follows the root's trajectory.

    Args:
        root_rank: the rank whose variables win.
        device: accepted for Horovod's signature.
        local_variables: variables left out of the broadcast (Horovod's).

    Example:
        >>> model.fit(ds, callbacks=[BroadcastGlobalVariablesCallback(root_rank=0)])  # doctest: +SKIP
    """

    def __init__(self, root_rank: int = 0, device: str = "", local_variables: Any = None) -> None:
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        self.local_variables = list(local_variables or [])
        self.broadcast_done = False

    def _broadcast(self) -> None:
        variables = list(self.model.variables)
        opt = getattr(self.model, "optimizer", None)
        if opt is not None:
            if not opt.built:
                opt.build(self.model.trainable_variables)
            # A sharded optimizer's slots differ by rank: only what every rank holds alike travels.
            replicated = getattr(opt, "replicated_variables", None)
            variables += list(replicated() if replicated is not None else opt.variables)
        skip = {id(v) for v in self.local_variables}
        variables = [v for v in variables if id(v) not in skip]
        broadcast_variables(variables, root_rank=self.root_rank, name="ddl.keras.broadcast_global_variables")
        self.broadcast_done = True

    def on_train_begin(self, logs: Any = None) -> None:
        _check_no_xla(self.model)
        if not self.broadcast_done and self.model.built and self.model.trainable_variables:
            self._broadcast()

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if not self.broadcast_done:
            self._broadcast()


class MetricAverageCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """At the end of each epoch, replace every numeric entry of ``logs`` by its average over ranks.

    Put it before callbacks that read the logs (checkpoints, early stopping); Keras's
    progress bar and History come after user callbacks, so they see the averages.
    ``device`` is accepted for Horovod's signature.
    """

    def __init__(self, device: str = "") -> None:
        super().__init__()
        self.device = device

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs is None or ddl.size() == 1:
            return
        keys = sorted(k for k, v in logs.items() if _is_number(v))
        values = np.array([float(logs[k]) for k in keys], np.float64)
        avg = ddl.allreduce(values, op=ddl.Average, name=f"ddl.keras.metrics.{'|'.join(keys)}")
        for k, v in zip(keys, avg, strict=True):
            logs[k] = float(v)


class LearningRateWarmupCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """Ramp the learning rate linearly from ``initial_lr / size`` to ``initial_lr`` over ``warmup_epochs``.

    Large-batch training (Goyal et al., 2017): the rate is set before every batch from
    the fractional epoch, so it grows smoothly; after the warm-up the callback leaves
    it alone (combine with a schedule that starts at ``warmup_epochs``).

    Args:
        initial_lr: the target rate, usually the one-rank rate times ``ddl.size()``.
        warmup_epochs: epochs the ramp takes.
        steps_per_epoch: batches per epoch; taken from ``model.fit``'s when None.
        momentum_correction: accepted for Horovod's signature; Keras 3 optimizers read
            their momentum as a constant, so it is not rescaled.
        verbose: 1 prints the rate reached at the end of the warm-up (rank 0).
    """

    def __init__(self, initial_lr: float, warmup_epochs: float = 5, momentum_correction: bool = True,
                 steps_per_epoch: int | None = None, verbose: int = 0) -> None:
        super().__init__()
        if not warmup_epochs > 0:
            raise ValueError(f"warmup_epochs must be > 0, got {warmup_epochs!r}")
        self.initial_lr = float(initial_lr)
        self.warmup_epochs = warmup_epochs
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self._epoch = 0

    def on_train_begin(self, logs: Any = None) -> None:
        if self.steps_per_epoch is None:
            self.steps_per_epoch = (self.params or {}).get("steps")
        if not self.steps_per_epoch:
            raise ValueError("LearningRateWarmupCallback needs steps_per_epoch when model.fit cannot tell "
                             "the number of batches (e.g. an unbatched or infinite dataset)")

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._epoch = epoch

    def lr_at(self, epoch: float) -> float:
        """The warm-up rate at a fractional epoch."""
        size = ddl.size()
        progress = min(epoch / self.warmup_epochs, 1.0)
        return self.initial_lr / size * (1 + progress * (size - 1))

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        assert self.steps_per_epoch
        epoch = self._epoch + batch / self.steps_per_epoch
        if epoch >= self.warmup_epochs:  # Horovod's end is exclusive: a schedule may take over there
            return
        self.model.optimizer.learning_rate = self.lr_at(epoch)

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if self.verbose and ddl.rank() == 0 and math.isclose(epoch + 1, self.warmup_epochs):
            print(f"LearningRateWarmupCallback: warm-up done, learning rate {self.lr_at(epoch + 1):g}")


class LearningRateScheduleCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """Set the learning rate to ``initial_lr * multiplier(epoch)`` from ``start_epoch`` to
    ``end_epoch`` (exclusive), Horovod's: at each epoch's start (``staircase``) or before
    every batch from the fractional epoch ``epoch + batch / steps_per_epoch``.

    Args:
        initial_lr: the rate the multiplier scales.
        multiplier: a number (then ``multiplier ** (epoch - start_epoch)``, exponential
            decay) or a function of the (fractional) epoch.
        start_epoch, end_epoch: the epochs the schedule applies to.
        staircase: adjust once per epoch (True) or before every batch (False).
        momentum_correction: accepted for Horovod's signature (see LearningRateWarmupCallback).
        steps_per_epoch: batches per epoch for ``staircase=False``; taken from ``model.fit`` when None.

    Example:
        >>> LearningRateScheduleCallback(0.1, multiplier=0.1, start_epoch=30, end_epoch=60)  # doctest: +SKIP
    """

    def __init__(self, initial_lr: float, multiplier: Any, start_epoch: float = 0, end_epoch: float | None = None,
                 staircase: bool = True, momentum_correction: bool = True,
                 steps_per_epoch: int | None = None) -> None:
        super().__init__()
        if initial_lr is None:
            raise ValueError("Parameter `initial_lr` is required")
        self.initial_lr = float(initial_lr)
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier ** (epoch - start_epoch))
        self.start_epoch, self.end_epoch = start_epoch, end_epoch
        self.staircase, self.momentum_correction = staircase, momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = 0

    def _applies(self, epoch: float) -> bool:
        return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def _adjust(self, epoch: float) -> None:
        self.model.optimizer.learning_rate = self.initial_lr * float(self.multiplier(epoch))

    def on_train_begin(self, logs: Any = None) -> None:
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = (self.params or {}).get("steps")
            if not self.steps_per_epoch:
                raise ValueError("Could not autodetect the number of steps per epoch. Please specify the "
                                 "steps_per_epoch parameter to the LearningRateScheduleCallback()")

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.current_epoch = epoch
        if self.staircase and self._applies(epoch):
            self._adjust(epoch)

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        if self.staircase or not self.steps_per_epoch:
            return
        epoch = self.current_epoch + batch / self.steps_per_epoch
        if self._applies(epoch):
            self._adjust(epoch)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs is not None:
            logs["lr"] = float(np.asarray(self.model.optimizer.learning_rate))


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):  # type: ignore[misc]
    """Keras's ``ModelCheckpoint`` that keeps only the best model by ``monitor`` (Horovod's).

    Horovod leaves ``filepath`` to be set later (``callback.filepath = ...``); here it
    defaults to ``best.keras`` (``best.weights.h5`` with ``save_weights_only``).
    """

    def __init__(self, monitor: str = "val_loss", verbose: int = 0, save_weights_only: bool = False,
                 mode: str = "auto", save_freq: Any = "epoch", *, filepath: str | None = None) -> None:
        path = filepath or ("best.weights.h5" if save_weights_only else "best.keras")
        super().__init__(filepath=path, monitor=monitor, verbose=verbose, save_best_only=True,
                         save_weights_only=save_weights_only, mode=mode, save_freq=save_freq)
