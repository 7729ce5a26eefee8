"""ddl: topology-aware distributed deep learning over MPI, after IBM PowerAI DDL.

Numpy in, numpy out; the adapters (``ddl.torch``, ``ddl.tensorflow``, ``ddl.caffe``)
build on these calls. The code lives in layer folders, each importing only from the
ones before it: ``base`` (errors, ops, dtypes, topology, settings) -> ``wire`` (MPI)
-> ``reduction`` (schedules, algorithms, executor, cost model) -> ``engine`` (cycles,
fusion, collectives) -> ``runtime`` (init, the public functions) -> ``launcher`` ->
``onnx`` -> ``tools`` (``ddl`` commands) -> ``testing``.

Example:
    >>> import ddl, numpy as np
    >>> _ = ddl.init()
    >>> ddl.allreduce(np.ones(3), op=ddl.Sum) * 0 + 1
    array([1., 1., 1.])
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# ``import ddl`` loads nothing else (not numpy, not MPI): a launcher, ``ddl doctor`` or a
# training script that has not called ``init`` yet pays a few milliseconds. Each public
# name is imported from its module on first use, then kept here (no cost after that).
_LAZY: dict[str, str] = {
    **dict.fromkeys(("allgather", "allreduce", "allreduce_", "allreduce_async", "broadcast", "broadcast_",
                     "grouped_allreduce", "grouped_allreduce_async", "reducescatter", "synchronize"),
                    "ddl.runtime.api"),
    **dict.fromkeys(("allgather_object", "barrier", "broadcast_object", "context", "cross_rank", "cross_size",
                     "init", "is_initialized", "local_rank", "local_size", "rank", "shutdown", "size", "topology"),
                    "ddl.runtime.process"),
    "Compression": "ddl.engine.compression",
    **dict.fromkeys(("DDLError", "HorovodInternalError", "HostsUpdatedInterrupt", "MismatchError",
                     "NotInitializedError", "RemoteError", "SettingsMismatchError", "TopologyError"), "ddl.base.errors"),
    "GroupHandle": "ddl.engine.handle", "Handle": "ddl.engine.handle",
    **dict.fromkeys(("Average", "Max", "Min", "Product", "ReduceOp", "Sum"), "ddl.base.ops"),
}

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time these come from _LAZY
    from ddl.base.errors import (
        DDLError,
        HorovodInternalError,
        HostsUpdatedInterrupt,
        MismatchError,
        NotInitializedError,
        RemoteError,
        SettingsMismatchError,
        TopologyError,
    )
    from ddl.base.ops import Average, Max, Min, Product, ReduceOp, Sum
    from ddl.engine.compression import Compression
    from ddl.engine.handle import GroupHandle, Handle
    from ddl.runtime.api import (
        allgather,
        allreduce,
        allreduce_,
        allreduce_async,
        broadcast,
        broadcast_,
        grouped_allreduce,
        grouped_allreduce_async,
        reducescatter,
        synchronize,
    )
    from ddl.runtime.process import (
        allgather_object,
        barrier,
        broadcast_object,
        context,
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


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ddl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


# A literal, for type checkers; a test checks it names exactly the lazy names.
__all__ = [
    "Average", "Compression", "DDLError", "GroupHandle", "Handle", "HorovodInternalError", "HostsUpdatedInterrupt",
    "Max", "Min", "MismatchError",
    "NotInitializedError", "Product", "ReduceOp", "RemoteError", "SettingsMismatchError", "Sum",
    "TopologyError", "allgather", "allgather_object", "allreduce", "allreduce_", "allreduce_async",
    "barrier", "broadcast", "broadcast_", "broadcast_object", "context", "cross_rank", "cross_size",
    "grouped_allreduce", "grouped_allreduce_async", "init", "is_initialized", "local_rank", "local_size",
    "rank", "reducescatter", "shutdown", "size", "synchronize", "topology",
]
