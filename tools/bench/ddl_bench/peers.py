"""Peers measured beside ddl in the same run: MPI's own Allreduce, and those other packages register.

A package adds a peer (``torch-gloo`` from the ddl-bench tooling package's
``ddl_bench.torch_peers``) as an entry point in the
``ddl.peers`` group: a function ``(mpi4py communicator) -> (allreduce function or None,
why not)``; a peer whose framework is not installed is skipped with the reason.
"""

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


#: A peer: float32 sum of a numpy array over every rank, returning the result.
Peer = Callable[[np.ndarray], np.ndarray]
GROUP = "ddl.peers"


def registered(comm: Any) -> dict[str, tuple[Peer | None, str]]:
    """Every registered peer, started on ``comm``: name -> (its allreduce, or None and why)."""
    import importlib.metadata

    out: dict[str, tuple[Peer | None, str]] = {}
    for entry in importlib.metadata.entry_points(group=GROUP):
        try:
            start = entry.load()
        except ImportError as exc:
            out[entry.name] = (None, f"its framework is not installed ({exc})")
            continue
        out[entry.name] = start(comm)
    return out


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
