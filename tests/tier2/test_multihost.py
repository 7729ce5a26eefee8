"""Multi-host: ddlrun across emulated hosts (network namespaces, shaped veths).

Every job here checks the veth byte counters: a transport that bypassed the links
(MPICH's UCX treats the namespaces as one node unless ``UCX_TLS=tcp``) fails the test.
Skips with the reason where namespaces are not permitted (not root, no ``ip``).
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from emulation.cluster import Cluster, ClusterUnavailable, unavailable_reason

WORKER = Path(__file__).parent / "workers" / "worker_hosts.py"
pytestmark = [pytest.mark.mpi, pytest.mark.multihost]
if unavailable_reason():
    pytestmark.append(pytest.mark.skip(reason=str(unavailable_reason())))


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    # 2 Gbit/s keeps the jobs short; the bench measures at 1 Gbit/s.
    c = Cluster(hosts=2, ranks_per_host=2, rate="2gbit")
    try:
        c.up()
    except ClusterUnavailable as exc:
        pytest.skip(str(exc))
    try:
        yield c
    finally:
        c.down()
    assert not c.namespaces


def ddlrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "ddl.launcher.cli", *args]


def moved(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    return {h: (after[h][0] - before[h][0], after[h][1] - before[h][1]) for h in after}


def check_link_traffic(cluster: Cluster, before: dict[str, tuple[int, int]], payload: int) -> None:
    """Each host must send and receive at least the payload reduced (any algorithm, no compression)."""
    delta = moved(before, cluster.counters())
    for host, (tx, rx) in delta.items():
        assert tx >= payload and rx >= payload, f"{host} link moved tx={tx} rx={rx} < payload {payload}: {delta}"


def run_job(cluster: Cluster, where: list[str], mode: str, *extra: str) -> tuple[str, int]:
    before = cluster.counters()
    proc = cluster.run(ddlrun("-np", "4", *where, *extra, sys.executable, str(WORKER), mode), timeout=120)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    ranks = re.findall(r"RANK (\d)/4 host=(\S+) dims=(\S+) local=(\d)/(\d) cross=(\d)/(\d)", out)
    assert len(ranks) == 4, out
    for _rank, host, dims, _, local_size, cross, cross_size in ranks:
        assert dims == "2x2" and local_size == "2" and cross_size == "2", ranks
        assert host == f"h{int(cross) + 1}", ranks  # each rank on its own emulated host
    assert sorted(h for _, h, *_ in ranks) == ["h1", "h1", "h2", "h2"]
    payloads = [int(x) for x in re.findall(r"PASS rank \d payload (\d+)", out)]
    assert len(payloads) == 4, out
    check_link_traffic(cluster, before, payloads[0])
    return out, payloads[0]


def test_every_algorithm_across_hosts_with_H(cluster: Cluster) -> None:
    # Calibration on (the default): the init probes cross the links too.
    run_job(cluster, ["-H", cluster.host_list()], "check")


def test_fp16_compression_halves_the_link_bytes_on_every_algorithm(cluster: Cluster) -> None:
    """Three 8 MiB allreduces per algorithm, with and without fp16: the bytes each host's
    link sent (its own interface counters), compressed at most 0.6x uncompressed, mpi too."""
    out, _ = run_job(cluster, ["-H", cluster.host_list()], "compression", "--calibration", "off")
    sent: dict[tuple[str, str, str], int] = {}
    for alg, comp, host, nbytes in re.findall(r"BYTES (\S+) (\S+) (h\d) (\d+)", out):
        sent[(alg, comp, host)] = int(nbytes)
    algorithms = sorted({a for a, _, _ in sent})
    assert set(algorithms) == {"mpi", "ring", "multiring", "halving_doubling", "shm", "auto"}, out
    print("\nbytes sent over each host's link, 3 x 8 MiB float32 allreduces (2 hosts x 2 ranks):")
    print(f"{'algorithm':>17} {'host':>4} {'none MiB':>9} {'fp16 MiB':>9} {'ratio':>6}")
    for alg in algorithms:
        for host in ("h1", "h2"):
            plain, half = sent[(alg, "none", host)], sent[(alg, "fp16", host)]
            print(f"{alg:>17} {host:>4} {plain / 2**20:9.2f} {half / 2**20:9.2f} {half / plain:6.2f}")
            assert half <= 0.6 * plain, f"{alg} on {host}: {half} bytes with fp16 vs {plain} without"


def test_hostfile_across_hosts(cluster: Cluster, tmp_path: Path) -> None:
    hostfile = cluster.hostfile(tmp_path / "hosts.txt")
    run_job(cluster, ["--hostfile", str(hostfile)], "small", "--calibration", "off")


def test_rank_killed_on_one_host_ends_the_job_on_all(cluster: Cluster) -> None:
    before = cluster.counters()
    job = cluster.popen(ddlrun("-np", "4", "-H", cluster.host_list(), "--calibration", "off",
                               sys.executable, str(WORKER), "loop"))
    try:
        deadline = time.monotonic() + 60
        victim = None
        while victim is None and time.monotonic() < deadline and job.poll() is None:
            time.sleep(0.3)
            workers = [pid for pid in cluster.pids("h2") if _runs_worker(pid)]
            if len(workers) == 2 and _looping(cluster, before):
                victim = workers[0]
        assert victim is not None, "the job did not start on h2 in 60 s"
        killed = time.monotonic()
        subprocess.run(["kill", "-KILL", str(victim)], check=True)
        try:
            job.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("the job still runs 30 s after a rank was killed")
        elapsed = time.monotonic() - killed
    finally:
        if job.poll() is None:
            job.send_signal(signal.SIGKILL)
            job.wait()
        job.communicate()
    print(f"job ended {elapsed:.1f} s after a rank was killed on h2")
    assert job.returncode != 0
    assert elapsed < 10, f"job took {elapsed:.1f} s to end after a rank was killed on h2"
    left = {h: [pid for pid in cluster.pids(h) if _runs_worker(pid)] for h in cluster.hosts}
    assert not any(left.values()), f"ranks still running after the job ended: {left}"


def _runs_worker(pid: int) -> bool:
    """A rank itself (not the keeper ddlrun runs it under, whose command line names it too)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return False
    return WORKER.name in cmdline and "ddl.launcher.watch.keeper" not in cmdline


def _looping(cluster: Cluster, before: dict[str, tuple[int, int]]) -> bool:
    # Allreduces of 256 KiB every 10 ms: a few MiB across each link means they cross it.
    return all(tx > 2 << 20 and rx > 2 << 20 for tx, rx in moved(before, cluster.counters()).values())


def test_unresolvable_host_is_an_error_before_anything_starts(cluster: Cluster) -> None:
    before = cluster.counters()
    start = time.monotonic()
    proc = cluster.run(ddlrun("-np", "4", "-H", "h1:2,nosuchhost.invalid:2", sys.executable, str(WORKER), "small"),
                       timeout=60)
    elapsed = time.monotonic() - start
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "'nosuchhost.invalid' does not resolve" in proc.stderr, proc.stderr
    assert elapsed < 10
    assert moved(before, cluster.counters()) == {h: (0, 0) for h in cluster.hosts}  # nothing started


def test_sixteen_hosts_of_one_rank_each() -> None:
    """The largest emulated cluster (link names at Linux's 15-character limit): every rank
    on a host of its own, a 1 MiB multi-ring allreduce through every host's link."""
    with Cluster(hosts=16, ranks_per_host=1, rate="1gbit") as c:
        before = c.counters()
        proc = c.run(ddlrun("-np", "16", "-H", c.host_list(), "--calibration", "off", sys.executable, str(WORKER),
                            "small"), timeout=180)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        ranks = re.findall(r"RANK (\d+)/16 host=(\S+) dims=\S+ local=0/1 cross=(\d+)/16", proc.stdout)
        assert sorted(h for _, h, _ in ranks) == sorted(f"h{i}" for i in range(1, 17)), proc.stdout
        assert all(h == f"h{int(cross) + 1}" for _, h, cross in ranks)
        payloads = [int(x) for x in re.findall(r"PASS rank \d+ payload (\d+)", proc.stdout)]
        assert len(payloads) == 16, proc.stdout
        check_link_traffic(c, before, payloads[0])
    assert not c.namespaces
