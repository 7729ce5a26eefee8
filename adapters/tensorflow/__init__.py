"""ddl for TensorFlow 2 / Keras 3: tensor collectives, DistributedGradientTape, broadcast_variables.

The Keras optimizer wrapper and callbacks are in :mod:`ddl.tensorflow.keras`.

Example:
    >>> import ddl.tensorflow as dtf                       # doctest: +SKIP
    >>> dtf.init()                                         # doctest: +SKIP
    >>> tape = dtf.DistributedGradientTape(tape)           # doctest: +SKIP
    >>> dtf.broadcast_variables(model.variables, root_rank=0)  # doctest: +SKIP
"""

from __future__ import annotations

from ddl import (
    Average,
    Compression,
    Max,
    Min,
    MismatchError,
    Product,
    Sum,
    allgather_object,
    barrier,
    broadcast_object,
    cross_rank,
    cross_size,
    init,
    is_initialized,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
    topology,
)

from .collectives import allgather, allreduce, broadcast, grouped_allreduce, reducescatter
from .tape import DistributedGradientTape, broadcast_variables

__all__ = [
    "Average", "Compression", "DistributedGradientTape", "Max", "Min", "MismatchError", "Product", "Sum",
    "allgather", "allgather_object", "allreduce", "barrier", "broadcast", "broadcast_object",
    "broadcast_variables", "cross_rank", "cross_size", "grouped_allreduce", "init", "is_initialized",
    "local_rank", "local_size", "rank", "reducescatter", "shutdown", "size", "topology",
]
