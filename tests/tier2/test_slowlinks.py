"""Tier 2: ddl.torch's PowerSGD, LocalSGD and DiLoCo under a real mpiexec (exactness, identical replicas)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
WORKER = Path(__file__).parent / "workers" / "worker_slowlinks.py"
pytestmark = pytest.mark.mpi

CASES = ["powersgd-full-rank-no-error-feedback", "localsgd-period-1", "diloco-period-1-outer-sgd-lr-1",
         "powersgd-rank-1", "localsgd-period-4-fp16", "diloco-period-3-overlap-2-powersgd"]


@pytest.mark.parametrize("np_", [2, 3])
def test_slow_link_training_under_mpi(np_: int) -> None:
    cmd = [sys.executable, "-m", "ddl.launcher.cli", "-np", str(np_), sys.executable, str(WORKER)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "DDL_STALL_TIMEOUT": "120"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert len(re.findall(rf"PASS slowlinks rank \d+/{np_}", proc.stdout)) == np_, proc.stdout
    assert re.findall(rf"SLOWLINKS (\S+) ranks={np_} max_abs_diff=\S+ identical=yes", proc.stdout) == CASES, proc.stdout
