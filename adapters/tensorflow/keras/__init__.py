"""ddl for Keras 3 on TensorFlow: DistributedOptimizer for ``model.fit``; callbacks in ``.callbacks``.

Example:
    >>> import ddl.tensorflow.keras as dk                                  # doctest: +SKIP
    >>> model.compile(optimizer=dk.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss=...)  # doctest: +SKIP
    >>> model.fit(ds, callbacks=[dk.callbacks.BroadcastGlobalVariablesCallback(0)])  # doctest: +SKIP
"""

from __future__ import annotations

from ddl.runtime import process
from ddl.runtime.process import *  # noqa: F403 - init, shutdown, rank, size, ...: the same on every adapter
from ddl.tensorflow import (
    Average,
    Compression,
    Sum,
    allgather,
    allreduce,
    broadcast,
    broadcast_variables,
)

from . import callbacks
from . import elastic as elastic  # Horovod's hvd.elastic: KerasState and its callbacks
from .optimizer import DistributedOptimizer

__all__ = [
    *process.__all__,
    "Average", "Compression", "DistributedOptimizer", "Sum", "allgather", "allreduce", "broadcast",
    "broadcast_variables", "callbacks",
]
