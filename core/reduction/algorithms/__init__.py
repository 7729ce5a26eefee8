"""Allreduce algorithms, one module and one class each, looked up by name."""

from __future__ import annotations

from ddl.base.topology import Topology
from ddl.reduction.algorithms.base import Algorithm
from ddl.reduction.algorithms.halving_doubling import HalvingDoubling
from ddl.reduction.algorithms.multiring import MultiRing
from ddl.reduction.algorithms.ring import Ring
from ddl.reduction.algorithms.shm import SharedMemory

#: Algorithms that compile to schedules (``mpi`` and ``auto`` are resolved elsewhere).
SCHEDULED: dict[str, Algorithm] = {a.name: a for a in (Ring(), MultiRing(), HalvingDoubling(), SharedMemory())}
#: The reduce-scatter collective's algorithm (a ring in topology order).
REDUCE_SCATTER = Ring()
#: Every name ``algorithm=`` accepts.
NAMES: tuple[str, ...] = ("auto", "mpi", *SCHEDULED)


def check_name(name: str) -> str:
    """Return ``name`` if it names an algorithm.

    Raises:
        ValueError: unknown name; the message lists the known ones.
    """
    if name not in NAMES:
        raise ValueError(f"unknown allreduce algorithm {name!r}; use one of {', '.join(NAMES)}")
    return name


def check_for(name: str, topology: Topology) -> str:
    """Return ``name`` if it names an algorithm that can run on ``topology``.

    Raises:
        ValueError: unknown name, or an algorithm this topology cannot run (``shm``
            where a dim-0 ring spans hosts); the message says what to use instead.

    Example:
        >>> from ddl.base.topology import build_topology
        >>> check_for("shm", build_topology(0, ["a", "a"]))
        'shm'
    """
    check_name(name)
    alg = SCHEDULED.get(name)
    reason = alg.unavailable(topology) if alg is not None else None
    if reason is not None:
        raise ValueError(f"allreduce algorithm {name!r} cannot run here: {reason}")
    return name


__all__ = ["NAMES", "REDUCE_SCATTER", "SCHEDULED", "Algorithm", "check_for", "check_name"]
