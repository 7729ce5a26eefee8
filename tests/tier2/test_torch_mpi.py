"""Tier 2: ddl.torch training equivalence and collectives under a real mpiexec."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
WORKER = Path(__file__).parent / "workers" / "worker_torch.py"
pytestmark = pytest.mark.mpi

CASES = ["sgd-momentum-wd", "adam", "sgd-backward_passes_per_step=2", "adam-fp16-compression",
         "sgd-broadcast-from-different-inits", "sgd-gradscaler-clip", "sgd-sparse_as_dense",
         "sgd-sparse-allgathered", "sgd-small-buckets",
         "sgd-predivide", "sgd-param-appended-after-construction", "adam-inner-add_param_group",
         "sgd-no_sync-1-to-3-passes", "sgd-rebucketed-order", "sgd-staged-copies-landing-late"]


@pytest.mark.parametrize("np_", [2, 4])
def test_torch_ranks_train_like_one_process(np_: int) -> None:
    cmd = [sys.executable, "-m", "ddl.launcher.cli", "-np", str(np_), sys.executable, str(WORKER)]
    # Ranks train a local reference between collectives; on a crowded host one rank can
    # lag the other by a minute there, which the default stall timeout would call a hang.
    env = {**os.environ, "DDL_STALL_TIMEOUT": "300"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=420, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert len(re.findall(r"PASS torch rank \d+/\d+", proc.stdout)) == np_, proc.stdout
    seen = re.findall(rf"EQUIV (\S+) ranks={np_} max_abs_diff=\S+ .*? identical=yes", proc.stdout)
    assert seen == CASES, proc.stdout
