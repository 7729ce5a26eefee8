"""Tier 2: the benchmark commands run end to end on 2 ranks and check their own results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.mpi


def ddl(*args: str, timeout: float = 240, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ddl.tools.cli", *args], capture_output=True, text=True, timeout=timeout,
                          env=None if env is None else {**os.environ, **env})


def test_bench_allreduce_checks_every_contender_and_reports_fusion(tmp_path: Path) -> None:
    proc = ddl("bench", "allreduce", "-np", "2", "--sizes", "8,4096,65536", "--budget", "0.02", "--rounds", "1",
               "--fused", "8", "--fused-bytes", "4096", "--no-gloo", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "auto / MPI_Allreduce time: 8B" in proc.stdout and "grouped_allreduce_async" in proc.stdout
    data = json.loads((tmp_path / "allreduce-np2.json").read_text())
    assert {r["bytes"] for r in data["rows"]} == {8, 4096, 65536}
    assert all(r["correct"] for r in data["rows"])  # a wrong sum is marked, and fails the command
    assert data["fused"][0]["grouped_ratio"] > 0


@pytest.mark.parametrize("ranks", [[], ["-np", "2"]])
def test_bench_allreduce_refuses_sizes_that_are_not_float32_multiples(tmp_path: Path, ranks: list[str]) -> None:
    # Refused before any rank starts or a peer's framework loads (importing torch took 2.5-9 s of it
    # before): Python's import log (on stderr) names neither the launcher nor torch.
    proc = ddl("bench", "allreduce", *ranks, "--sizes", "6", "--out", str(tmp_path), timeout=60,
               env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert proc.returncode == 2 and "multiples of 4" in proc.stderr
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "numpy" in imported and not imported & {"torch", "ddl.launcher.cli", "mpi4py.MPI"}, sorted(imported)


def test_bench_startup_compares_a_ddl_job_with_a_bare_one(tmp_path: Path) -> None:
    proc = ddl("bench", "startup", "-np", "2", "--rounds", "1", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((tmp_path / "startup-np2.json").read_text())
    assert data["ratio"] > 0 and len(data["runs"]["ddl"]) == 1
    assert "ddl job / bare job" in proc.stdout


def test_bench_rehearsal_replays_a_step_and_prices_it(tmp_path: Path) -> None:
    proc = ddl("bench", "rehearsal", "-np", "2", "--model", "1000,2048x100,64,30000", "--compute-ms", "150",
               "--first-bucket-mb", "0.01", "--bucket-mb", "0.5", "--rounds", "1",
               "--contenders", "auto,ring,MPI_Allreduce", "--out", str(tmp_path), "--tag", "smoke")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((tmp_path / "smoke.json").read_text())
    assert data["correct"] and set(data["contenders"]) == {"auto", "ring", "MPI_Allreduce"}
    assert data["buckets"] == [120000, 256, 819200, 4000] and sum(data["buckets"]) == data["bytes"] == 4 * (1000 + 204800 + 64 + 30000)
    for name, c in data["contenders"].items():
        (step,) = c["steps"]
        assert 0.15 <= step["compute"] <= step["step"], (name, step)  # the replay waited out its compute
        for ready, start, end in zip(step["ready"], step["start"], step["end"], strict=True):
            assert ready <= start <= end <= step["step"], (name, step)  # no bucket ran before its gradients landed
        assert c["predicted"]["step_s"] >= 0.15 and 0 < c["predicted_burst"]["step_s"] < 10
    assert "efficiency" in proc.stdout or "eff %" in proc.stdout
