"""Tier 2: the README's main job trains to its promised accuracy."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sklearn")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
pytestmark = pytest.mark.mpi


def test_torch_digits_reaches_95_percent_on_two_ranks() -> None:
    pytest.importorskip("torch")
    cmd = [sys.executable, "-m", "ddl.launcher.cli", "-np", "2", sys.executable, str(EXAMPLES / "torch_digits.py")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    found = re.search(r"final test accuracy (\d\.\d+) .* after (\S+) s on 2 rank", proc.stdout)
    assert found, proc.stdout
    assert float(found.group(1)) >= 0.95, proc.stdout
    assert proc.stdout.count("epoch ") == 12  # rank 0 logs, the other rank stays quiet


def test_keras_digits_reaches_95_percent_on_two_ranks() -> None:
    pytest.importorskip("tensorflow")
    cmd = [sys.executable, "-m", "ddl.launcher.cli", "-np", "2", sys.executable, str(EXAMPLES / "keras_digits.py")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    found = re.search(r"final test accuracy (\d\.\d+) .* after (\S+) s on 2 rank", proc.stdout)
    assert found, proc.stdout
    assert float(found.group(1)) >= 0.95, proc.stdout
    assert proc.stdout.count("Epoch ") == 12  # rank 0 logs, the other rank stays quiet
    assert "ddl: rank" not in proc.stderr, proc.stderr[-2000:]  # no stall reports or errors from ddl
