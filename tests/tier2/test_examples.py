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


def _elastic_example(*command: str) -> str:
    cmd = [sys.executable, "-m", "ddl.launcher.cli", "--elastic", "-np", "2", "--calibration", "off", *command]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    finals = re.findall(r"final rank (\d) of 2: step (\d+),.*?weights ([0-9a-f]{16})", proc.stdout)
    assert sorted(r for r, _, _ in finals) == ["0", "1"] and len({d for _, _, d in finals}) == 1, proc.stdout[-2000:]
    assert "world 1: every rank synced" in proc.stderr, proc.stderr[-2000:]
    return proc.stdout


def test_elastic_torch_digits_runs_under_ddlrun_elastic() -> None:
    """The elastic examples on one host (losing and adding hosts: tests/tier2/test_elastic_hosts.py
    and python -m emulation.elastic_run)."""
    pytest.importorskip("torch")
    out = _elastic_example(sys.executable, str(EXAMPLES / "elastic" / "torch_digits.py"), "--steps", "40")
    assert re.search(r"step\s+40 world 1 size 2", out), out[-2000:]


def test_elastic_caffe_solver_runs_under_ddlrun_elastic() -> None:
    pytest.importorskip("lmdb")
    caffe = str(Path(sys.executable).parent / "ddl-caffe")
    out = _elastic_example(caffe, "train", "--solver", str(EXAMPLES / "elastic" / "caffe" / "digits_solver.prototxt"),
                           "--elastic", "--iterations", "30", "--commit-every", "10")
    assert re.search(r"step\s+30 world 1 size 2", out), out[-2000:]
