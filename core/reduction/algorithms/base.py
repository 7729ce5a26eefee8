"""The interface every allreduce algorithm implements."""

from __future__ import annotations

from typing import Protocol

from ddl.base.topology import Topology
from ddl.reduction.schedule import Schedule


class Algorithm(Protocol):
    """Compiles an allreduce into a per-rank :class:`~ddl.reduction.schedule.Schedule`.

    Algorithms never touch MPI: the executor runs what they compile.
    """

    name: str

    def unavailable(self, topology: Topology) -> str | None:
        """Why this algorithm cannot run on ``topology`` (with what to use instead), or None."""
        ...

    def compile(self, topology: Topology, rank: int, count: int) -> Schedule:
        """The steps ``rank`` runs to allreduce ``count`` elements over ``topology``."""
        ...
