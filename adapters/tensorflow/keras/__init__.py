"""ddl for Keras 3 on TensorFlow: DistributedOptimizer for ``model.fit``; callbacks in ``.callbacks``.

Example:
    >>> import ddl.tensorflow.keras as dk                                  # doctest: +SKIP
    >>> model.compile(optimizer=dk.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss=...)  # doctest: +SKIP
    >>> model.fit(ds, callbacks=[dk.callbacks.BroadcastGlobalVariablesCallback(0)])  # doctest: +SKIP
"""

from __future__ import annotations

from ddl.tensorflow import (
    Average,
    Compression,
    Sum,
    allgather,
    allreduce,
    broadcast,
    broadcast_variables,
    init,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
)

from . import callbacks
from .optimizer import DistributedOptimizer

__all__ = [
    "Average", "Compression", "DistributedOptimizer", "Sum", "allgather", "allreduce", "broadcast",
    "broadcast_variables", "callbacks", "init", "local_rank", "local_size", "rank", "shutdown", "size",
]
