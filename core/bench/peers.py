"""Peers measured beside ddl in the same run: MPI's own Allreduce (torch gloo: ddl.torch.peers)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


def mpi_allreduce(comm: Any) -> Callable[[np.ndarray], np.ndarray]:
    """The MPI library's own float32 sum through mpi4py (on a private communicator)."""
    from mpi4py import MPI

    def run(x: np.ndarray) -> np.ndarray:
        out = np.empty_like(x)
        comm.Allreduce(x, out, op=MPI.SUM)
        return out

    return run


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
