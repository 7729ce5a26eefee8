"""ddl for TensorFlow 2 / Keras 3: tensor collectives, DistributedGradientTape, broadcast_variables.

The Keras optimizer wrapper and callbacks are in :mod:`ddl.tensorflow.keras`.

Example:
    >>> import ddl.tensorflow as dtf                       # doctest: +SKIP
    >>> dtf.init()                                         # doctest: +SKIP
    >>> tape = dtf.DistributedGradientTape(tape)           # doctest: +SKIP
    >>> dtf.broadcast_variables(model.variables, root_rank=0)  # doctest: +SKIP
"""

from __future__ import annotations

from ddl import Average, Compression, Max, Min, MismatchError, Product, Sum
from ddl.runtime import process
from ddl.runtime.process import *  # noqa: F403 - init, shutdown, rank, size, ...: the same on every adapter

from . import elastic as elastic  # Horovod's hvd.elastic: run, the state objects
from .collectives import allgather, allreduce, broadcast, grouped_allreduce, reducescatter
from .tape import DistributedGradientTape, broadcast_variables

__all__ = [
    *process.__all__,
    "Average", "Compression", "DistributedGradientTape", "Max", "Min", "MismatchError", "Product", "Sum",
    "allgather", "allreduce", "broadcast", "broadcast_variables", "grouped_allreduce", "reducescatter",
]
