"""The short chaos run: four emulated hosts, four faults drawn by a fixed seed, and nothing lost.

``emulation.chaos`` with a host frozen (SIGSTOP, SIGCONT later), a host dying half-way
through writing a commit, two hosts SIGKILLed at once and a rank leaving mid-step
(``sys.exit``): the job finishes with status 0 and no traceback, every recovery takes at
most 10 s, no fault costs more than one commit interval, every rank ends with the same
weights, and those equal a one-process replay of the same steps with the same world
sizes. The long run (every kind, 50 faults and more) is ``python -m emulation.chaos``;
its table is in docs/guides/elastic.md. Skipped where namespaces are not permitted.
"""

from __future__ import annotations

import pytest

from emulation.chaos import COMMIT_EVERY, RECOVERY_TARGET, run_chaos
from emulation.cluster import unavailable_reason

pytestmark = [pytest.mark.mpi, pytest.mark.multihost]
if unavailable_reason():
    pytestmark.append(pytest.mark.skip(reason=str(unavailable_reason())))


def test_four_faults_of_four_kinds_lose_nothing() -> None:
    report = run_chaos(hosts=4, faults=4, seed=7, kinds=("sigstop_host", "in_commit", "two_hosts", "rank_exit"))
    print(report.table())
    print(report.summary())
    assert report.rc == 0 and not report.tracebacks, report.summary()
    kinds = {f.kind.split(" (")[0] for f in report.faults}
    assert len(report.faults) == 4 and len(kinds) == 4, report.table()
    for fault in report.faults:
        assert fault.ended_world and not fault.problem, (fault, report.table())
        assert fault.recovery is not None and fault.recovery <= RECOVERY_TARGET, report.table()
        assert fault.steps_lost <= COMMIT_EVERY, report.table()
    assert len(report.finals) == 4 and len({d for _, _, d in report.finals.values()}) == 1, report.finals
    assert report.replay_diff is not None and report.replay_diff <= 1e-6, report.summary()
    assert all(r.seconds is not None for r in report.rejoins), report.rejoins
    assert not report.problems, report.summary()
