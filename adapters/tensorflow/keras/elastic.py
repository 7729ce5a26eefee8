"""Elastic ``model.fit`` with Horovod's names: ``KerasState`` and the callbacks that keep it current.

Example (run with ``ddlrun --elastic``; see ``examples/elastic/keras_digits.py``):
    >>> data = elastic.ElasticDataset(x, y, batch_size=32)                          # doctest: +SKIP
    >>> state = elastic.KerasState(model, data=data, epoch=0, batch=0)              # doctest: +SKIP
    >>> callbacks = [elastic.UpdateBatchStateCallback(state), elastic.UpdateEpochStateCallback(state),
    ...              elastic.CommitStateCallback(state, batches_per_commit=5)]      # doctest: +SKIP
    >>> @elastic.run
    ... def train(state):
    ...     while state.epoch < epochs:
    ...         model.fit(data, epochs=1, callbacks=callbacks)                      # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from ddl.runtime.elastic import State, run, updates_pending, world_number
from ddl.runtime.elastic.position import DataPosition, Positioned
from ddl.runtime.process import rank, size

from ..elastic import TensorFlowKerasState


class KerasState(TensorFlowKerasState):
    """State of a Keras 3 model, its optimizer, ``ElasticDataset`` s and plain values (``epoch``, ``batch``)."""


def _datasets(state: State) -> list[ElasticDataset]:
    return [obj for obj in getattr(state, "_objects", {}).values() if isinstance(obj, ElasticDataset)]


class ElasticDataset(Positioned, keras.utils.PyDataset):  # type: ignore[misc]
    """Batches of ``(x, y)`` numpy arrays: this rank's share of what is left of the epoch.

    The same :class:`~ddl.runtime.elastic.position.DataPosition` as
    ``ddl.torch.elastic.ElasticSampler``: one order per epoch (``seed + epoch``), what the
    world has processed is counted (the callbacks of this module do it), and after a change of world size the rest of the epoch is dealt over
    the new world, every rank the same number of batches. Kept by a :class:`KerasState`.
    Fit one epoch per ``model.fit`` call (its length changes between epochs).
    """

    def __init__(self, x: np.ndarray, y: np.ndarray, *, batch_size: int, shuffle: bool = True, seed: int = 0) -> None:
        super().__init__()
        if len(x) != len(y):
            raise ValueError(f"x has {len(x)} samples but y has {len(y)}")
        self.x, self.y, self.batch_size, self.shuffle, self.seed = x, y, batch_size, shuffle, seed
        self.position = DataPosition(seed=seed)
        self.indices = np.zeros(0, np.int64)
        self.reset()

    def reset(self) -> None:
        """Deal the rest of the epoch over the current world."""
        self.indices = self.position.share(len(self.x), rank=rank(), size=size(), batch_size=self.batch_size,
                                           shuffle=self.shuffle)

    def record_batch(self) -> None:
        """Count one batch of the whole world as processed."""
        self.position.advance(per_rank=self.batch_size, size=size(), limit=len(self.x))

    def __len__(self) -> int:
        return -(-len(self.indices) // self.batch_size)

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        picked = self.indices[index * self.batch_size:(index + 1) * self.batch_size]
        return self.x[picked], self.y[picked]


def _new_fit(state: State) -> None:
    object.__setattr__(state, "_recorded", (None, None))  # (last batch, last epoch) counted in this fit


def record_batch(state: State, batch: int) -> None:
    """Count batch ``batch`` of this ``fit`` once, however many callbacks call it."""
    last_batch, last_epoch = getattr(state, "_recorded", (None, None))
    if last_batch == batch:
        return
    object.__setattr__(state, "_recorded", (batch, last_epoch))
    if hasattr(state, "batch"):
        state.batch = int(state.batch) + 1
    for data in _datasets(state):
        data.record_batch()


def end_epoch(state: State, epoch: int, steps: int | None) -> None:
    """Close epoch ``epoch`` of this ``fit`` once: ``state.epoch`` + 1, ``state.batch`` 0, the next order.

    Keras ends an epoch stopped early (``stop_training``) with ``on_epoch_end`` too: when
    fewer than ``steps`` batches ran, the epoch is not over and nothing changes.
    """
    last_batch, last_epoch = getattr(state, "_recorded", (None, None))
    if last_epoch == epoch:
        return
    if steps is not None and (last_batch is None or last_batch + 1 < steps):
        return
    object.__setattr__(state, "_recorded", (None, epoch))
    if hasattr(state, "epoch"):
        state.epoch = int(state.epoch) + 1
    if hasattr(state, "batch"):
        state.batch = 0
    for data in _datasets(state):
        data.set_epoch(int(getattr(state, "epoch", data.epoch + 1)))


class UpdateBatchStateCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """Keeps ``state.batch`` (batches done this epoch) and the state's ``ElasticDataset`` counts current."""

    def __init__(self, state: State) -> None:
        super().__init__()
        self.state = state

    def on_train_begin(self, logs: Any = None) -> None:
        _new_fit(self.state)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        record_batch(self.state, batch)


class UpdateEpochStateCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """Keeps ``state.epoch`` counting epochs across ``fit`` calls and worlds; starts the next epoch's order."""

    def __init__(self, state: State) -> None:
        super().__init__()
        self.state = state

    def on_train_begin(self, logs: Any = None) -> None:
        _new_fit(self.state)

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        end_epoch(self.state, epoch, self.params.get("steps"))


class CommitStateCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """Commits the state every ``batches_per_commit`` batches and at each epoch's end.

    It brings the batch and epoch counts up to date before committing (as the two
    callbacks above would), so where it stands in the list does not matter.
    """

    def __init__(self, state: State, batches_per_commit: int = 1) -> None:
        super().__init__()
        if batches_per_commit < 1:
            raise ValueError(f"batches_per_commit must be >= 1, got {batches_per_commit}")
        self.state, self.batches_per_commit = state, batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs: Any = None) -> None:
        _new_fit(self.state)
        self.batches_remaining = self.batches_per_commit

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        record_batch(self.state, batch)
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        end_epoch(self.state, epoch, self.params.get("steps"))
        self.state.commit()


__all__ = ["CommitStateCallback", "ElasticDataset", "KerasState", "UpdateBatchStateCallback",
           "UpdateEpochStateCallback", "run", "updates_pending", "world_number"]
