"""The two lanes scripts/test.sh runs the real-rank tests in, side by side.

Every module below is marked ``timed``: they assert wall-clock bounds (failure detection,
recovery, timeouts, a stall report), or build the emulated hosts' network namespaces and
bridges, or share a checkout-wide resource (Open MPI 5's virtualenv), so two of them must
never run at once. scripts/test.sh runs them one after another (``-m timed``) while a second
pytest runs the rest (``-m "not timed"``): the equivalence modules, whose checks are bits
and tolerances, not seconds. The timed tests were written for a loaded machine (the silent
host's is held at a load average of 8), and the lane beside them adds about one core's load.

The timed lane also takes the modules in ``BALANCE``: equivalence modules with no clock in
their checks, marked ``balance`` and run there only so that the two lanes end together (the
suite is CPU-bound on 2 cores, so a lane that ends early leaves a core idle while the other
finishes: about 60-85 s of each run before, measured with ``--durations``).

Not pytest-xdist's ``--dist loadgroup``: xdist 3.8 names a test's group by rewriting
``item._nodeid``, which pytest 9.2's ``nodeid`` no longer reads, so one group's tests land on
both workers (a module-scoped fixture then runs twice at once).
"""

from __future__ import annotations

import pytest

TIMED = {
    "test_elastic_chaos", "test_elastic_hosts", "test_elastic_local", "test_examples", "test_failfast",
    "test_failfast_hosts", "test_install", "test_kubernetes", "test_mpi", "test_multihost", "test_openmpi",
    "test_openmpi5", "test_slowlinks", "test_slurm", "test_world_check",
}

#: Equivalence modules run in the timed lane to even out the lanes (``-m "timed or balance"``).
BALANCE = {"test_zero_mpi"}


def pytest_itemcollected(item: pytest.Item) -> None:
    if item.path.stem in TIMED:
        item.add_marker(pytest.mark.timed)
    elif item.path.stem in BALANCE:
        item.add_marker(pytest.mark.balance)
