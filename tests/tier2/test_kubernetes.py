"""ddlrun in Kubernetes pods, on MPICH: an MPIJob whose launcher starts before its workers, a
TrainJob's nodes without ssh, and (no root needed) nodes without ssh on this one machine.

The pods are :mod:`emulation.pods`: network namespaces named and resolved as the MPI
Operator's and JobSet's pods are, ``/etc/mpi`` and ``/root/.ssh`` mounted per pod, Debian's
real sshd on the MPIJob's workers (installed with apt when missing). Emulated pods share
this machine's kernel, so ``UCX_TLS=tcp`` keeps the traffic on the veths, whose counters
every test checks; skipped without root, as the other multi-host tests.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from emulation.pods import MpiJobPods, Pods, PodsUnavailable, TrainJobPods, install_sshd
from emulation.pods import unavailable_reason as pods_unavailable

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).parent / "workers" / "worker_pods.py"
DDLRUN = str(Path(sys.executable).parent / "ddlrun")
TCP = {"UCX_TLS": "tcp", "MPIR_CVAR_ENABLE_HEAVY_YIELD": "1"}
LATE_S = 10.0
pytestmark = pytest.mark.mpi


def equivalence(stdout: str, ranks: int) -> list[str]:
    """Every rank trained like one process and holds the same weights; returns the lines."""
    lines = re.findall(rf"EQUIV \w+ ranks={ranks} max_abs_diff=([0-9.e+-]+) identical=(yes|no) digest=([0-9a-f]{{16}})", stdout)
    assert len(lines) == ranks, stdout[-3000:]
    assert all(float(diff) <= 1e-6 and same == "yes" for diff, same, _ in lines), lines
    assert len({digest for _, _, digest in lines}) == 1, lines
    return [f"max_abs_diff={diff} digest={digest}" for diff, _, digest in lines]


def link_traffic(pods: Pods, before: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    moved = {pod: (tx - before[pod][0], rx - before[pod][1]) for pod, (tx, rx) in pods.counters().items()}
    assert all(tx > 100_000 and rx > 100_000 for tx, rx in moved.values()), f"the links carried too little: {moved}"
    return moved


def test_nodes_without_ssh_form_one_world_on_this_machine() -> None:
    """Two ddlrun processes, torchrun's flags, node 0 on a free port: one world of 2 ranks, no ssh.

    Hydra keeps one proxy per node, so MPI sees two nodes; DDL_HOSTNAME says so to ddl too."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    nodes = [subprocess.Popen([DDLRUN, "--nnodes", "2", "--node-rank", str(rank), "--master-addr", "127.0.0.1",
                               "--master-port", port, "python", str(WORKER), "numpy"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                              env={**os.environ, "DDL_HOSTNAME": f"node{rank}"})
             for rank in (1, 0)]  # node 1 first: it waits for node 0
    outs = [node.communicate(timeout=120) for node in nodes]
    for node, (out, err) in zip(nodes, outs, strict=True):
        assert node.returncode == 0, out[-2000:] + err[-3000:]
    worker_out, worker_err = outs[0]
    master_out, master_err = outs[1]
    equivalence(master_out, 2)  # every rank's output comes through node 0's mpiexec
    assert "node 1 joined from" in master_err and "the job ended with status 0" in master_err, master_err
    assert f"node 1 of 2 ({socket.gethostname()}): joined 127.0.0.1:{port}" in worker_err, worker_err


# -- emulated pods -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sshd() -> None:
    reason = pods_unavailable() or install_sshd() or pods_unavailable(sshd=True)
    if reason:
        pytest.skip(reason)


@pytest.fixture
def mpijob(sshd: None) -> Iterator[MpiJobPods]:
    job = MpiJobPods("train", workers=3, implementation="MPICH")
    try:
        job.up()
    except PodsUnavailable as exc:
        pytest.skip(str(exc))
    try:
        yield job
    finally:
        job.down()
    assert not job.cluster.namespaces


def test_an_mpijob_whose_workers_come_10_s_late_trains_like_one_process(mpijob: MpiJobPods) -> None:
    """The launcher pod runs `ddlrun python train.py` (no flag) 10 s before its 3 workers exist: ddlrun
    reads /etc/mpi/hostfile, prints what it waits for, launches once each worker resolves and
    accepts ssh, and 3 ranks on the 3 worker pods train to the one-process weights."""
    mpijob.start_launcher()
    before = mpijob.counters()
    run = mpijob.popen(mpijob.launcher, [DDLRUN, "python", str(WORKER), "numpy"], env=TCP, cwd=str(ROOT))
    time.sleep(LATE_S)
    workers_up = time.monotonic()
    mpijob.start_workers()
    out, err = run.communicate(timeout=240)
    ended = time.monotonic()
    assert run.returncode == 0, out[-3000:] + err[-3000:]
    lines = equivalence(out, 3)
    hosts = sorted(re.findall(r"RANK \d/3 host=(\S+) cross=\d/3", out))
    assert hosts == mpijob.workers, out
    assert "checking that 3 host(s) resolve and accept ssh" in err, err
    waiting = re.search(r"waiting for 3 of 3 hosts \(\d+ s of 300 s\): (.*)", err)  # the first line
    assert waiting and all(f"{w}.train.default.svc" in waiting.group(1) for w in mpijob.workers), err
    assert "does not resolve" in waiting.group(1)
    # ddlrun's own start-up (imports, finding the MPI) takes some of the 10 s on a loaded machine.
    ready = re.search(r"all 3 hosts resolve and accept ssh \((\d+) s\)", err)
    assert ready and int(ready.group(1)) >= 1, err
    moved = link_traffic(mpijob, before)
    print(f"MPIJob (MPICH, 3 workers {LATE_S:.0f} s late): waited {ready.group(1)} s, trained "
          f"{ended - workers_up:.1f} s after the workers came; {lines[0]}; link bytes {moved}")


def test_a_trainjob_of_two_pods_trains_without_ssh(sshd: None) -> None:
    """Every pod runs `ddlrun python train.py` with Trainer's PET_* variables; no pod runs sshd."""
    job = TrainJobPods("tj", nodes=2)
    try:
        job.up()
    except PodsUnavailable as exc:
        pytest.skip(str(exc))
    try:
        job.start(job.nodes)
        before = job.counters()
        start = time.monotonic()
        # numpy, not torch: two torch imports cost a minute on this shared 2-core machine (the
        # guide's torch run of this TrainJob is measured in docs/guides/kubernetes.md).
        runs = [job.popen(node, [DDLRUN, "python", str(WORKER), "numpy"], env=TCP, cwd=str(ROOT))
                for node in reversed(job.nodes)]
        outs = [run.communicate(timeout=300) for run in runs]
        elapsed = time.monotonic() - start
        for run, (out, err) in zip(runs, outs, strict=True):
            assert run.returncode == 0, out[-3000:] + err[-3000:]
        (_, node1_err), (out, node0_err) = outs
        lines = equivalence(out, 2)
        assert sorted(re.findall(r"RANK \d/2 host=(\S+) cross=\d/2 node_rank=(\d)", out)) == [
            ("tj-node-0-0", "0"), ("tj-node-0-1", "1")], out  # each pod's ranks keep their pod's variables
        assert "node 1 joined from tj-node-0-1" in node0_err, node0_err
        assert "joined tj-node-0-0.tj:29500" in node1_err, node1_err
        assert not [pid for node in job.nodes for pid in job.cluster.pids(job.pods[node].where)
                    if Path(f"/proc/{pid}/comm").read_text().strip() == "sshd"], "a TrainJob pod runs no sshd"
        moved = link_traffic(job, before)
        print(f"TrainJob (2 pods, no ssh): {elapsed:.1f} s; {lines[0]}; link bytes {moved}")
    finally:
        job.down()


ELASTIC_WORKER = Path(__file__).parent / "workers" / "worker_elastic.py"
ELASTIC_SIZE = 4096  # worker_elastic.py's default vector


def test_an_elastic_mpijob_takes_its_hosts_from_discover_hosts_and_survives_a_lost_pod(mpijob: MpiJobPods) -> None:
    """`ddlrun --elastic` in the launcher pod, no discovery flag: the operator's discover_hosts.sh
    lists the 3 running workers; one pod is deleted at step 10, the script stops listing it, and
    the job ends on the 2 others with the exact weights of the world sizes that ran each step."""
    mpijob.start_launcher()
    mpijob.start_workers()
    run = mpijob.popen(mpijob.launcher, [DDLRUN, "--elastic", "--min-np", "2", "--max-np", "3", "--calibration",
                                         "off", "python", str(ELASTIC_WORKER), "--steps", "30", "--step-seconds",
                                         "0.2"], env=TCP, cwd=str(ROOT))
    assert run.stdout is not None
    lines: list[str] = []
    lost = None
    for line in run.stdout:
        lines.append(line)
        if lost is None and re.search(r"STEP 10 world=\d+ size=3 rank=0 ", line):  # ranks share stdout
            mpijob.stop(mpijob.workers[2])
            lost = time.time()
    _, err = run.communicate(timeout=180)
    out = "".join(lines)
    assert run.returncode == 0 and lost is not None, out[-3000:] + err[-3000:]
    assert "hosts from /etc/mpi/discover_hosts.sh" in err and "--slots 1: the slots per worker" in err, err
    steps = [(int(s), int(w), int(n)) for s, w, n in re.findall(r"STEP (\d+) world=(\d+) size=(\d+) rank=0 ", out)]
    size_of = {step: size for step, _, size in sorted(steps, key=lambda s: s[1])}  # the last world to run a step
    assert size_of[1] == 3 and size_of[30] == 2, steps
    weights = np.zeros(ELASTIC_SIZE, np.float32)
    for step, size in sorted(size_of.items()):
        for rank in range(size):
            weights -= np.random.default_rng((step - 1) * 1000 + rank).integers(-8, 9, ELASTIC_SIZE).astype(np.float32)
    expected = hashlib.sha256(weights.tobytes()).hexdigest()[:16]
    done = re.findall(r"DONE rank=(\d) size=2 world=\d+ step=30 digest=([0-9a-f]{16})", out)
    assert sorted(r for r, _ in done) == ["0", "1"] and {d for _, d in done} == {expected}, (done, expected)
    recovered = min(float(t) for n, t in re.findall(r"STEP \d+ world=\d+ size=(\d+) rank=0 t=([\d.]+)", out) if n == "2")
    print(f"elastic MPIJob: a worker pod deleted at step 10; the 2-rank world's first step {recovered - lost:.1f} s later")
