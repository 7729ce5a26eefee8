"""ddl: topology-aware distributed deep learning over MPI, after IBM PowerAI DDL.

Numpy in, numpy out; the adapters (``ddl.torch``, ``ddl.tensorflow``, ``ddl.caffe``)
build on these calls. The code lives in layer folders, each importing only from the
ones before it: ``base`` (errors, ops, dtypes, topology, settings) -> ``wire`` (MPI)
-> ``reduction`` (schedules, algorithms, executor, cost model) -> ``engine`` (cycles,
fusion, collectives) -> ``runtime`` (init, the public functions) -> ``checkpoint``
(sharded checkpoints) -> ``launcher`` ->
``onnx`` -> ``tools`` (``ddl`` commands) -> ``testing``.

Example:
    >>> import ddl, numpy as np
    >>> _ = ddl.init()
    >>> ddl.allreduce(np.ones(3), op=ddl.Sum) * 0 + 1
    array([1., 1., 1.])
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddl.base.lazy import attributes

__version__ = "0.1.0"

# ``import ddl`` loads nothing else (not numpy, not MPI): a launcher, ``ddl doctor`` or a
# training script that has not called ``init`` yet pays a few milliseconds. Each public
# name is imported from its module on first use, then kept here (no cost after that).
_LAZY: dict[str, str] = {
    **dict.fromkeys(("allgather", "allgather_async", "allreduce", "allreduce_", "allreduce_async", "alltoall",
                     "alltoall_async", "broadcast", "broadcast_", "broadcast_async", "grouped_allgather",
                     "grouped_allgather_async", "grouped_allreduce", "grouped_allreduce_async",
                     "grouped_reducescatter", "grouped_reducescatter_async", "join", "poll", "reducescatter",
                     "reducescatter_async", "synchronize"),
                    "ddl.runtime.api"),
    **dict.fromkeys(("ProcessSet", "add_process_set", "global_process_set", "remove_process_set"),
                    "ddl.runtime.process_sets"),
    **dict.fromkeys(("ccl_built", "cuda_built", "ddl_built", "gloo_built", "gloo_enabled", "is_homogeneous",
                     "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built", "rocm_built",
                     "start_timeline", "stop_timeline"), "ddl.runtime.basics"),
    **dict.fromkeys(("allgather_object", "barrier", "broadcast_object", "context", "cross_rank", "cross_size",
                     "init", "is_initialized", "local_rank", "local_size", "rank", "shutdown", "size", "topology"),
                    "ddl.runtime.process"),
    "AutoCompression": "ddl.engine.auto_compression",
    "Compression": "ddl.engine.compression",
    "PowerSGD": "ddl.engine.powersgd",
    **dict.fromkeys(("DDLError", "HorovodInternalError", "HostsUpdatedInterrupt", "MismatchError",
                     "NotInitializedError", "RankLeftError", "RemoteError", "SettingsMismatchError",
                     "StalledWaitError", "TopologyError", "WorldMismatchError"), "ddl.base.errors"),
    "GroupHandle": "ddl.engine.handle", "Handle": "ddl.engine.handle",
    **dict.fromkeys(("Adasum", "Average", "Max", "Min", "Product", "ReduceOp", "Sum"), "ddl.base.ops"),
}

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time these come from _LAZY
    from ddl.base.errors import (
        DDLError,
        HorovodInternalError,
        HostsUpdatedInterrupt,
        MismatchError,
        NotInitializedError,
        RankLeftError,
        RemoteError,
        SettingsMismatchError,
        StalledWaitError,
        TopologyError,
        WorldMismatchError,
    )
    from ddl.base.ops import Adasum, Average, Max, Min, Product, ReduceOp, Sum
    from ddl.engine.auto_compression import AutoCompression
    from ddl.engine.compression import Compression
    from ddl.engine.handle import GroupHandle, Handle
    from ddl.engine.powersgd import PowerSGD
    from ddl.runtime.api import (
        allgather,
        allgather_async,
        allreduce,
        allreduce_,
        allreduce_async,
        alltoall,
        alltoall_async,
        broadcast,
        broadcast_,
        broadcast_async,
        grouped_allgather,
        grouped_allgather_async,
        grouped_allreduce,
        grouped_allreduce_async,
        grouped_reducescatter,
        grouped_reducescatter_async,
        join,
        poll,
        reducescatter,
        reducescatter_async,
        synchronize,
    )
    from ddl.runtime.basics import (
        ccl_built,
        cuda_built,
        ddl_built,
        gloo_built,
        gloo_enabled,
        is_homogeneous,
        mpi_built,
        mpi_enabled,
        mpi_threads_supported,
        nccl_built,
        rocm_built,
        start_timeline,
        stop_timeline,
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
    from ddl.runtime.process_sets import (
        ProcessSet,
        add_process_set,
        global_process_set,
        remove_process_set,
    )


__getattr__ = attributes("ddl", _LAZY, globals())


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


# A literal, for type checkers; a test checks it names exactly the lazy names.
__all__ = [
    "Adasum", "AutoCompression", "Average", "Compression", "DDLError", "GroupHandle", "Handle", "HorovodInternalError",
    "HostsUpdatedInterrupt", "Max", "Min", "MismatchError", "NotInitializedError", "PowerSGD", "ProcessSet", "Product",
    "RankLeftError", "ReduceOp", "RemoteError", "SettingsMismatchError", "StalledWaitError", "Sum", "TopologyError",
    "WorldMismatchError",
    "add_process_set", "allgather",
    "allgather_async", "allgather_object", "allreduce", "allreduce_", "allreduce_async", "alltoall",
    "alltoall_async", "barrier", "broadcast", "broadcast_", "broadcast_async", "broadcast_object", "ccl_built",
    "context", "cross_rank", "cross_size", "cuda_built", "ddl_built", "global_process_set", "gloo_built",
    "gloo_enabled", "grouped_allgather", "grouped_allgather_async", "grouped_allreduce",
    "grouped_allreduce_async", "grouped_reducescatter", "grouped_reducescatter_async", "init", "is_homogeneous",
    "is_initialized", "join", "local_rank", "local_size", "mpi_built", "mpi_enabled", "mpi_threads_supported",
    "nccl_built", "poll", "rank", "reducescatter", "reducescatter_async", "remove_process_set", "rocm_built",
    "shutdown", "size", "start_timeline", "stop_timeline", "synchronize", "topology",
]
