"""ddl for PyTorch: tensor collectives, DistributedOptimizer and broadcasts of model state.

Example:
    >>> import ddl.torch as dt                                     # doctest: +SKIP
    >>> dt.init()                                                  # doctest: +SKIP
    >>> opt = dt.DistributedOptimizer(opt, named_parameters=model.named_parameters())  # doctest: +SKIP
    >>> dt.broadcast_parameters(model.state_dict(), root_rank=0)   # doctest: +SKIP
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

from .broadcast import broadcast_object, broadcast_optimizer_state, broadcast_parameters
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
    "Average", "Compression", "DistributedOptimizer", "MismatchError", "Max", "Min", "Product", "Sum",
    "TorchHandle", "allgather", "allgather_object", "allreduce", "allreduce_", "allreduce_async",
    "allreduce_async_", "barrier", "broadcast", "broadcast_", "broadcast_object", "broadcast_optimizer_state",
    "broadcast_parameters", "cross_rank", "cross_size", "grouped_allreduce", "init", "is_initialized",
    "local_rank", "local_size", "rank", "reducescatter", "shutdown", "size", "synchronize", "topology",
]
