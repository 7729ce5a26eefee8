"""How many cores this process may run on: the affinity mask, the one CPU count ddl uses.

``os.cpu_count()`` counts the machine's cores; inside a cpuset (a Slurm step, a
container with ``--cpuset-cpus``) fewer are ours, and the launcher, the runtime and
calibration must agree on how many ranks share them.
"""

from __future__ import annotations

import os


def available_cpus() -> int:
    """Cores this process may use (``sched_getaffinity`` where the OS has it), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1
