"""ddl for PyTorch: tensor collectives, DistributedOptimizer and broadcasts of model state.

Example:
    >>> import ddl.torch as dt                                     # doctest: +SKIP
    >>> dt.init()                                                  # doctest: +SKIP
    >>> opt = dt.DistributedOptimizer(opt, named_parameters=model.named_parameters())  # doctest: +SKIP
    >>> dt.broadcast_parameters(model.state_dict(), root_rank=0)   # doctest: +SKIP
"""

from __future__ import annotations

from ddl import Average, Compression, Max, Min, MismatchError, Product, Sum
from ddl.runtime import process
from ddl.runtime.process import *  # noqa: F403 - init, shutdown, rank, size, ...: the same on every adapter

from . import elastic as elastic  # TorchState, run, ElasticSampler (Horovod's hvd.elastic)
from .broadcast import (
    broadcast_object as broadcast_object,  # replaces the core's: tensors go to CPU first
)
from .broadcast import (
    broadcast_optimizer_state,
    broadcast_parameters,
)
from .collectives import (
    TorchHandle,
    allgather,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    broadcast,
    broadcast_,
    grouped_allreduce,
    reducescatter,
    synchronize,
)
from .optimizer import DistributedOptimizer

__all__ = [
    *process.__all__,
    "Average", "Compression", "DistributedOptimizer", "MismatchError", "Max", "Min", "Product", "Sum",
    "TorchHandle", "allgather", "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "broadcast",
    "broadcast_", "broadcast_optimizer_state", "broadcast_parameters", "grouped_allreduce", "reducescatter",
    "synchronize",
]
