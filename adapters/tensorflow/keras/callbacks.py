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
    """Before the first update, overwrite the model's and the optimizer's variables with ``root_rank``'s.

    The optimizer is built first if it is not yet (Keras 3 creates its slots lazily), so
    momentum buffers and step counters are equal on every rank too. With it, ranks that
    start from different initial weights follow the same trajectory.

    Example:
        >>> model.fit(ds, callbacks=[BroadcastGlobalVariablesCallback(root_rank=0)])  # doctest: +SKIP
    """

    def __init__(self, root_rank: int = 0) -> None:
        super().__init__()
        self.root_rank = root_rank
        self.broadcast_done = False

    def on_train_begin(self, logs: Any = None) -> None:
        if self.broadcast_done:
            return
        _check_no_xla(self.model)
        variables = list(self.model.variables)
        opt = getattr(self.model, "optimizer", None)
        if opt is not None:
            if not opt.built:
                opt.build(self.model.trainable_variables)
            variables += list(opt.variables)
        broadcast_variables(variables, root_rank=self.root_rank, name="ddl.keras.broadcast_global_variables")
        self.broadcast_done = True


class MetricAverageCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """At the end of each epoch, replace every numeric entry of ``logs`` by its average over ranks.

    Put it before callbacks that read the logs (checkpoints, early stopping); Keras's
    progress bar and History come after user callbacks, so they see the averages.
    """

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
        verbose: 1 prints the rate reached at the end of the warm-up (rank 0).
    """

    def __init__(self, initial_lr: float, warmup_epochs: float = 5, steps_per_epoch: int | None = None,
                 verbose: int = 0) -> None:
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
        if epoch > self.warmup_epochs:
            return
        self.model.optimizer.learning_rate = self.lr_at(epoch)

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if self.verbose and ddl.rank() == 0 and math.isclose(epoch + 1, self.warmup_epochs):
            print(f"LearningRateWarmupCallback: warm-up done, learning rate {self.lr_at(epoch + 1):g}")
