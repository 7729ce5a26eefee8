"""Fail fast across emulated hosts: a rank's keeper on another host reaches ddlrun and reports.

The keepers run in the hosts' network namespaces (hydra starts them through the cluster's
fake ssh) and connect back to ddlrun's address on the bridge; a rank that fails before
``ddl.init`` on host h2 ends the job within seconds, named with its host.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from emulation.cluster import Cluster, ClusterUnavailable, unavailable_reason

WORKER = Path(__file__).parent / "workers" / "worker_failfast.py"
pytestmark = [pytest.mark.mpi, pytest.mark.multihost]
if unavailable_reason():
    pytestmark.append(pytest.mark.skip(reason=str(unavailable_reason())))


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster(hosts=2, ranks_per_host=1, rate=None)
    try:
        c.up()
    except ClusterUnavailable as exc:
        pytest.skip(str(exc))
    try:
        yield c
    finally:
        c.down()


@pytest.mark.parametrize(("case", "status", "first"), [
    ("before-init", 1, r"ddlrun: rank 1 \(host h2\) exited with status 1 before ddl.init"),
    ("sigkill", 137, r"ddlrun: rank 1 \(host h2\) was killed by signal 9 \(SIGKILL\) after ddl.init"),
])
def test_a_rank_failing_on_another_host_ends_the_job_at_once_naming_that_host(
        cluster: Cluster, case: str, status: int, first: str) -> None:
    done = cluster.run([sys.executable, "-m", "ddl.launcher.cli", "-np", "2", "-H", cluster.host_list(),
                        sys.executable, str(WORKER), case], timeout=120)
    ended = time.time()
    assert done.returncode == status, done.stderr[-3000:]
    report = [x for x in done.stderr.splitlines() if x.startswith("ddlrun: ")]
    assert report and re.match(first, report[0]), report
    marks = [float(t) for t in re.findall(r"\[1\]<stdout>:T0 (\d+\.\d{3})", done.stdout)]
    assert marks and ended - marks[0] < 5.0, (marks, ended)
    assert "cannot reach ddlrun" not in done.stderr
