"""What every adapter exposes alike: start and stop, who am I, barrier, objects, process sets,
and Horovod's build and timeline queries.

``ddl.torch``, ``ddl.tensorflow`` and ``ddl.tensorflow.keras`` each re-export
:data:`__all__` from here, so the three surfaces cannot drift apart; the tensor
collectives are each adapter's own (they take that framework's tensors).
"""

from __future__ import annotations

from ddl.base.topology import Topology
from ddl.runtime.api import allgather_object, barrier, broadcast_object
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
from ddl.runtime.lifecycle import context, init, is_initialized, shutdown, topology
from ddl.runtime.process_sets import (
    ProcessSet,
    add_process_set,
    global_process_set,
    remove_process_set,
)


def _topology() -> Topology:
    return topology()


def rank() -> int:
    """This process's rank in the world."""
    return _topology().rank


def size() -> int:
    """The number of ranks in the world."""
    return _topology().size


def local_rank() -> int:
    """This process's rank among the ranks on its host."""
    return _topology().local_rank


def local_size() -> int:
    """The number of ranks on this host."""
    return _topology().local_size


def cross_rank() -> int:
    """The index of this process's host."""
    return _topology().cross_rank


def cross_size() -> int:
    """The number of hosts."""
    return _topology().cross_size


__all__ = [
    "allgather_object", "barrier", "broadcast_object", "context", "cross_rank", "cross_size", "init",
    "is_initialized", "local_rank", "local_size", "rank", "shutdown", "size", "topology",
    # process sets
    "ProcessSet", "add_process_set", "global_process_set", "remove_process_set",
    # Horovod's build and timeline queries
    "ccl_built", "cuda_built", "ddl_built", "gloo_built", "gloo_enabled", "is_homogeneous", "mpi_built",
    "mpi_enabled", "mpi_threads_supported", "nccl_built", "rocm_built", "start_timeline", "stop_timeline",
]
