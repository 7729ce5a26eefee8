"""GPU tests: ddl.torch on CUDA under a real mpiexec (skipped without a CUDA device).

``scripts/gpu-check.sh`` runs these on a GPU machine with a JSON report; without CUDA
they skip with the reason, so the default suite passes on CPU-only machines.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.mpi]
if not torch.cuda.is_available():
    pytestmark.append(pytest.mark.skip(reason="no CUDA device (scripts/gpu-check.sh runs these on a GPU machine)"))

WORKER = Path(__file__).parent / "worker_cuda.py"


def test_cuda_collectives_optimizer_amp_and_staging_on_two_ranks(tmp_path: Path) -> None:
    report = tmp_path / "cuda.json"
    cmd = [sys.executable, "-m", "ddl.launcher.cli", "-np", "2", sys.executable, str(WORKER), str(report)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    checks = json.loads(report.read_text())["checks"]
    assert {"collectives", "equivalence-sgd", "equivalence-amp-gradscaler", "equivalence-no_sync-3-passes",
            "sparse_as_dense", "staging", "equivalence-sharded-adam", "sharded-checkpoint"} <= set(checks)
    assert checks["equivalence-sgd"]["max_abs_diff"] <= 1e-5
