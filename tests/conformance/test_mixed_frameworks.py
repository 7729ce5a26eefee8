"""Tier 2: one process holds torch and TensorFlow; a torch and a Keras model train side by side under ddlrun."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("tensorflow")
pytest.importorskip("sklearn")
WORKER = Path(__file__).parent / "workers" / "worker_mixed.py"
pytestmark = pytest.mark.mpi


def test_torch_and_keras_share_one_runtime_at_two_ranks() -> None:
    cmd = [sys.executable, "-m", "ddl.launcher.cli", "-np", "2", "--stall-timeout", "300", sys.executable, str(WORKER)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    print("\n".join(line for line in proc.stdout.splitlines() if line.startswith(("MIXED", "PASS"))))
    assert len(re.findall(r"PASS mixed rank \d/2", proc.stdout)) == 2, proc.stdout
    lines = re.findall(r"MIXED (\S+) rank 0/2 max_rel_diff=\S+ identical=yes", proc.stdout)
    assert lines == ["alternating-keras", "alternating-torch", "thread-keras", "thread-torch"], proc.stdout
