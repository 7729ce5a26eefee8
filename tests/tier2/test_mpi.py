"""Tier 2: worker modules under a real mpiexec at 1-4 ranks, each run with a timeout."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

WORKERS = Path(__file__).parent / "workers"
pytestmark = pytest.mark.mpi


def ddlrun(np_: int, script: str, *extra: str, timeout: float = 120, env: dict[str, str] | None = None):
    cmd = [sys.executable, "-m", "ddl.launcher.cli", "-np", str(np_), *extra, sys.executable, str(WORKERS / script)]
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    return proc, time.monotonic() - start


@pytest.mark.parametrize(
    ("np_", "topology"), [(1, None), (2, None), (3, None), (4, "4"), (4, "2x2"), (4, "1x4")],
)
def test_collectives_under_mpiexec(np_: int, topology: str | None) -> None:
    extra = ["--topology", topology] if topology else []
    proc, _ = ddlrun(np_, "worker_collectives.py", *extra)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    passed = [line for line in proc.stdout.splitlines() if line.startswith("PASS rank")]
    assert len(passed) == np_, proc.stdout
    if topology:
        assert all(f"topology {topology}" in line for line in passed)


def test_exception_on_one_rank_aborts_the_job_quickly() -> None:
    proc, elapsed = ddlrun(3, "worker_abort.py", timeout=60)
    assert proc.returncode != 0
    assert "boom from rank 1" in proc.stderr
    assert "UNREACHABLE" not in proc.stdout
    assert elapsed < 10, f"took {elapsed:.1f} s to abort"


def test_topology_spec_that_does_not_fit_fails_at_once() -> None:
    proc, elapsed = ddlrun(4, "worker_topology.py", "--topology", "3x2", timeout=30)
    assert proc.returncode != 0
    assert "3x2" in proc.stderr and "6" in proc.stderr and "4" in proc.stderr
    assert elapsed < 10


def test_bad_topology_from_environment_raises_at_init() -> None:
    proc, _ = ddlrun(2, "worker_topology.py", env={"DDL_TOPOLOGY": "3"}, timeout=60)
    assert proc.returncode != 0
    assert "TopologyError" in proc.stderr and "world size is 2" in proc.stderr


def test_hosts_are_discovered_from_host_names() -> None:
    # Two fake hosts of two ranks each, in round-robin placement: ranks 0,2 on a, 1,3 on b.
    mpiexec = Path(sys.executable).parent / "mpiexec"
    if not mpiexec.exists():
        pytest.skip("needs the pip MPICH's mpiexec for per-rank environments")
    cmd = [str(mpiexec)]
    for r in range(4):
        if r:
            cmd.append(":")
        cmd += ["-n", "1", "-env", "DDL_HOSTNAME", "ab"[r % 2], "-env", "MPIR_CVAR_ENABLE_HEAVY_YIELD", "1",
                sys.executable, str(WORKERS / "worker_topology.py")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = sorted(line for line in proc.stdout.splitlines() if line.startswith("RANK"))
    assert len(lines) == 4
    for line in lines:
        assert "dims=2x2" in line and "/2" in line.split("local=")[1]
    assert "RANK 2 dims=2x2 local=1/2 cross=0/2 coords=(1, 0)" in lines[2], lines
    assert "RANK 1 dims=2x2 local=0/2 cross=1/2 coords=(0, 1)" in lines[1], lines
