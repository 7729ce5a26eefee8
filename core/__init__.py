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

from typing import Any

import numpy as np

from ddl.errors import DDLError, MismatchError, NotInitializedError, TopologyError
from ddl.ops import Average, Max, Min, Product, ReduceOp, Sum
from ddl.runtime import context, init, is_initialized, shutdown, topology

__version__ = "0.1.0"


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


def allreduce(x: Any, *, op: Any = Average, name: str | None = None, algorithm: str | None = None) -> np.ndarray:
    """Reduce ``x`` over all ranks and return the result (same bits on every rank).

    Args:
        x: numpy array (any shape, contiguous or not) of a supported dtype.
        op: ``ddl.Average`` (default), ``Sum``, ``Min``, ``Max`` or ``Product``.
        name: names the tensor, for mismatch reports.
        algorithm: ``auto``, ``mpi``, ``ring``, ``multiring`` or ``halving_doubling``.

    Raises:
        TypeError: unsupported dtype, or Average on integers.
        MismatchError: ranks passed different shapes, dtypes, ops or names.

    Example:
        >>> ddl.allreduce(np.arange(4.0), op=ddl.Sum)  # doctest: +SKIP
    """
    return context().allreduce(x, op=op, name=name, algorithm=algorithm)


def allreduce_(x: np.ndarray, *, op: Any = Average, name: str | None = None, algorithm: str | None = None) -> np.ndarray:
    """In-place :func:`allreduce`; returns ``x``."""
    return context().allreduce(x, op=op, name=name, algorithm=algorithm, inplace=True)


def grouped_allreduce(
    xs: list[Any], *, op: Any = Average, name: str | None = None, algorithm: str | None = None
) -> list[np.ndarray]:
    """Allreduce several arrays at once (fused per dtype); results in input order."""
    return context().grouped_allreduce(xs, op=op, name=name, algorithm=algorithm)


def allgather(x: Any, *, name: str | None = None) -> np.ndarray:
    """Concatenate every rank's ``x`` along axis 0; first dims may differ by rank."""
    return context().allgather(x, name=name)


def broadcast(x: Any, root_rank: int = 0, *, name: str | None = None) -> np.ndarray:
    """Return ``root_rank``'s ``x`` on every rank."""
    return context().broadcast(x, root_rank=root_rank, name=name)


def broadcast_(x: np.ndarray, root_rank: int = 0, *, name: str | None = None) -> np.ndarray:
    """Overwrite ``x`` with ``root_rank``'s ``x``; returns ``x``."""
    return context().broadcast(x, root_rank=root_rank, name=name, inplace=True)


def reducescatter(x: Any, *, op: Any = Sum, name: str | None = None) -> np.ndarray:
    """Reduce ``x`` and return this rank's slice of axis 0 (the first ranks get extra rows)."""
    return context().reducescatter(x, op=op, name=name)


def broadcast_object(obj: Any, root_rank: int = 0) -> Any:
    """Return ``root_rank``'s picklable ``obj`` on every rank."""
    return context().broadcast_object(obj, root_rank=root_rank)


def allgather_object(obj: Any) -> list[Any]:
    """Return every rank's picklable ``obj``, in rank order."""
    return context().allgather_object(obj)


def barrier() -> None:
    """Block until every rank has reached the barrier."""
    context().barrier()


__all__ = [
    "Average", "DDLError", "Max", "Min", "MismatchError", "NotInitializedError", "Product",
    "ReduceOp", "Sum", "TopologyError", "allgather", "allgather_object", "allreduce",
    "allreduce_", "barrier", "broadcast", "broadcast_", "broadcast_object", "context",
    "cross_rank", "cross_size", "grouped_allreduce", "init", "is_initialized", "local_rank",
    "local_size", "rank", "reducescatter", "shutdown", "size", "topology",
]
