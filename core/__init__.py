"""ddl: topology-aware distributed deep learning over MPI, after IBM PowerAI DDL.

Numpy in, numpy out; the adapters (``ddl.torch``, ``ddl.tensorflow``, ``ddl.caffe``)
build on these calls.

Example:
    >>> import ddl, numpy as np
    >>> _ = ddl.init()
    >>> ddl.allreduce(np.ones(3), op=ddl.Sum) * 0 + 1
    array([1., 1., 1.])
"""

from __future__ import annotations

from ddl.api import (
    allgather,
    allgather_object,
    allreduce,
    allreduce_,
    allreduce_async,
    barrier,
    broadcast,
    broadcast_,
    broadcast_object,
    grouped_allreduce,
    grouped_allreduce_async,
    reducescatter,
    synchronize,
)
from ddl.compression import Compression
from ddl.errors import (
    DDLError,
    MismatchError,
    NotInitializedError,
    RemoteError,
    SettingsMismatchError,
    TopologyError,
)
from ddl.handle import GroupHandle, Handle
from ddl.ops import Average, Max, Min, Product, ReduceOp, Sum
from ddl.runtime import VERSION

__version__ = VERSION
from ddl.runtime import context, init, is_initialized, shutdown, topology


def rank() -> int:
    """This process's rank in the world."""
    return context().topology.rank


def size() -> int:
    """The number of ranks in the world."""
    return context().topology.size


def local_rank() -> int:
    """This process's rank among the ranks on its host."""
    return context().topology.local_rank


def local_size() -> int:
    """The number of ranks on this host."""
    return context().topology.local_size


def cross_rank() -> int:
    """The index of this process's host."""
    return context().topology.cross_rank


def cross_size() -> int:
    """The number of hosts."""
    return context().topology.cross_size


__all__ = [
    "Average", "Compression", "GroupHandle", "Handle", "allreduce_async", "synchronize", "DDLError", "Max", "Min", "MismatchError", "NotInitializedError", "Product",
    "ReduceOp", "RemoteError", "SettingsMismatchError", "Sum", "TopologyError", "allgather", "allgather_object", "allreduce",
    "allreduce_", "barrier", "broadcast", "broadcast_", "broadcast_object", "context",
    "cross_rank", "cross_size", "grouped_allreduce", "grouped_allreduce_async", "init", "is_initialized", "local_rank",
    "local_size", "rank", "reducescatter", "shutdown", "size", "topology",
]
