"""Horovod's build and run-time queries, answered for ddl, and the timeline switched at run time.

ddl is pure Python over MPI (mpi4py and the MPI library it loads): it is built with MPI
and nothing else Horovod can be built with — no NCCL, Gloo, oneCCL, CUDA or ROCm
kernels of its own (CUDA tensors are staged through host memory), and no link to the
IBM DDL library Horovod's ``ddl_built`` asks about (ddl rebuilds that library's
algorithms; it does not load it).
"""

from __future__ import annotations

from pathlib import Path

from ddl.engine.timeline import Timeline
from ddl.runtime import lifecycle


def mpi_built() -> bool:
    """True: ddl runs its collectives over MPI."""
    return True


def mpi_enabled() -> bool:
    """True when this job runs over MPI (False for a world of one without an MPI library)."""
    try:
        from mpi4py import MPI

        return bool(MPI.Is_initialized())
    except ImportError:  # pragma: no cover - depends on the environment
        return False


def mpi_threads_supported() -> bool:
    """Whether the MPI library runs with ``MPI_THREAD_MULTIPLE`` (ddl's engine thread needs it)."""
    try:
        from mpi4py import MPI

        return bool(MPI.Is_initialized() and MPI.Query_thread() == MPI.THREAD_MULTIPLE)
    except ImportError:  # pragma: no cover
        return False


def gloo_built() -> bool:
    """False: ddl has no Gloo controller."""
    return False


def gloo_enabled() -> bool:
    """False: ddl has no Gloo controller."""
    return False


def nccl_built() -> bool:
    """False: no NCCL (CUDA tensors reduce through host memory over MPI)."""
    return False


def ddl_built() -> bool:
    """False: Horovod asks whether it links IBM's DDL library; ddl does not load it."""
    return False


def ccl_built() -> bool:
    """False: no oneCCL."""
    return False


def cuda_built() -> bool:
    """False: no CUDA kernels of ddl's own (CUDA tensors are staged through host memory)."""
    return False


def rocm_built() -> bool:
    """False: no ROCm kernels."""
    return False


def is_homogeneous() -> bool:
    """Whether every host runs the same number of ranks."""
    topo = lifecycle.topology()
    counts = [topo.hosts.count(h) for h in set(topo.hosts)]
    return len(set(counts)) == 1


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start recording a Chrome-trace timeline of the collectives into ``file_path`` (rank 0
    writes it, at :func:`stop_timeline` or shutdown); replaces a timeline being recorded.

    ``mark_cycles`` is accepted for Horovod's signature; ddl's trace has no cycle marks.
    """
    engine = lifecycle.engine()
    if engine.timeline is not None:
        engine.timeline.write()
    engine.timeline = Timeline(Path(file_path), rank=0) if lifecycle.topology().rank == 0 else None


def stop_timeline() -> None:
    """Stop the timeline and write it."""
    engine = lifecycle.engine()
    if engine.timeline is not None:
        engine.timeline.write()
        engine.timeline = None
