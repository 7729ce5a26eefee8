"""scripts/gpu-check.sh, the one-run GPU check: tried here, it must skip cleanly without CUDA."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-check.sh"


def test_without_cuda_it_reports_why_and_exits_0(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: the script would run the real check")
    proc = subprocess.run(["bash", str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable})
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "gpu-report.json").read_text())
    assert report["skipped"] is True and "no CUDA device" in report["reason"]


def test_bad_arguments_are_refused() -> None:
    proc = subprocess.run(["bash", str(SCRIPT), "--nonsense"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "unknown argument" in proc.stderr
