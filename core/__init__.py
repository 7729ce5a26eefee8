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

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# ``import ddl`` loads nothing else (not numpy, not MPI): a launcher, ``ddl doctor`` or a
# training script that has not called ``init`` yet pays a few milliseconds. Each public
# name is imported from its module on first use, then kept here (no cost after that).
_LAZY: dict[str, str] = {
    **dict.fromkeys(("allgather", "allgather_object", "allreduce", "allreduce_", "allreduce_async", "barrier",
                     "broadcast", "broadcast_", "broadcast_object", "grouped_allreduce", "grouped_allreduce_async",
                     "reducescatter", "synchronize"), "ddl.api"),
    "Compression": "ddl.compression",
    **dict.fromkeys(("DDLError", "MismatchError", "NotInitializedError", "RemoteError", "SettingsMismatchError",
                     "TopologyError"), "ddl.errors"),
    "GroupHandle": "ddl.handle", "Handle": "ddl.handle",
    **dict.fromkeys(("Average", "Max", "Min", "Product", "ReduceOp", "Sum"), "ddl.ops"),
    **dict.fromkeys(("init", "is_initialized", "shutdown"), "ddl.runtime"),
}

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time these come from _LAZY
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
    from ddl.context import Context
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
    from ddl.runtime import init, is_initialized, shutdown
    from ddl.topology import Topology


def context() -> Context:
    """The running :class:`~ddl.context.Context` (raises NotInitializedError before ``init``)."""
    from ddl.runtime import context

    return context()


def topology() -> Topology:
    """This job's :class:`~ddl.topology.Topology` (dims, coordinates of a rank)."""
    return context().topology


class _Package(types.ModuleType):
    """``ddl.context`` and ``ddl.topology`` are functions, and also submodules' names. The
    import system sets a package attribute when it first loads a submodule, which here
    happens lazily, after these functions exist: keep the functions (the submodules stay
    importable by name, ``from ddl.context import Context``)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("context", "topology") and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ddl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def rank() -> int:
    """This process's rank in the world."""
    return topology().rank


def size() -> int:
    """The number of ranks in the world."""
    return topology().size


def local_rank() -> int:
    """This process's rank among the ranks on its host."""
    return topology().local_rank


def local_size() -> int:
    """The number of ranks on this host."""
    return topology().local_size


def cross_rank() -> int:
    """The index of this process's host."""
    return topology().cross_rank


def cross_size() -> int:
    """The number of hosts."""
    return topology().cross_size


__all__ = [
    "Average", "Compression", "GroupHandle", "Handle", "allreduce_async", "synchronize", "DDLError", "Max", "Min",
    "MismatchError", "NotInitializedError", "Product", "ReduceOp", "RemoteError", "SettingsMismatchError", "Sum",
    "TopologyError", "allgather", "allgather_object", "allreduce", "allreduce_", "barrier", "broadcast",
    "broadcast_", "broadcast_object", "context", "cross_rank", "cross_size", "grouped_allreduce",
    "grouped_allreduce_async", "init", "is_initialized", "local_rank", "local_size", "rank", "reducescatter",
    "shutdown", "size", "topology",
]
