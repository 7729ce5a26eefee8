"""Allreduce algorithms, one module and one class each, looked up by name."""

from __future__ import annotations

from ddl.algorithms.base import Algorithm
from ddl.algorithms.halving_doubling import HalvingDoubling
from ddl.algorithms.multiring import MultiRing
from ddl.algorithms.ring import Ring

#: Algorithms that compile to schedules (``mpi`` and ``auto`` are resolved elsewhere).
SCHEDULED: dict[str, Algorithm] = {a.name: a for a in (Ring(), MultiRing(), HalvingDoubling())}
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


__all__ = ["NAMES", "REDUCE_SCATTER", "SCHEDULED", "Algorithm", "check_name"]
