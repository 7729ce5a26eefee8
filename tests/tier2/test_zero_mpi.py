"""Tier 2: ddl.torch's sharded optimizer state (ZeRO-1) and checkpoints across world sizes, under mpiexec."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
WORKER = Path(__file__).parent / "workers" / "worker_zero.py"
pytestmark = pytest.mark.mpi

CASES = ["sgd-momentum-wd", "adam", "adamw", "adagrad", "ZeroRedundancyOptimizer-adam", "consolidate",
         "sgd-synchronize-clip", "adam-backward_passes_per_step=2", "adam-add_param_group",
         "adamw-recipe-resumed-root"]


def _run(np_: int, *args: str) -> str:
    worker = [sys.executable, str(WORKER), *args]
    cmd = [sys.executable, "-m", "ddl.launcher.cli", "-np", str(np_), *worker] if np_ > 1 else worker
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "DDL_STALL_TIMEOUT": "200"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert len(re.findall(rf"PASS zero rank \d+/{np_}", proc.stdout)) == np_, proc.stdout
    return proc.stdout


def _cases(out: str, np_: int) -> list[str]:
    seen = re.findall(rf"ZERO (\S+) ranks={np_} max_abs_diff=\S+ identical=yes", out)
    return list(dict.fromkeys(seen))  # each rank prints each case: keep the first, in order


def test_sharded_torch_trains_like_one_process_and_its_checkpoints_load_at_any_world_size(tmp_path: Path) -> None:
    """One process saves unsharded; 4 ranks save sharded and load both; 3 and 2 ranks and
    one process load both. 4 ranks also commit an elastic TorchState (one store, one writer),
    which every world size syncs from. Every continuation equals one uninterrupted process
    (<= 1e-6), and the equivalence cases pass at 4, 3 and 2 ranks, on every rank alike."""
    assert _cases(_run(1, "--checkpoint", str(tmp_path), "--save"), 1) == []
    for np_ in (4, 3, 2):
        loads = [f"checkpoint-saved={s}-loaded={np_}-sharded" for s in (4, 1)]
        synced = [f"elastic-committed=4-synced-at={np_}"]
        assert _cases(_run(np_, "--checkpoint", str(tmp_path)), np_) == loads + synced + CASES
    loads = [f"checkpoint-saved={s}-loaded=1-{m}" for s in (4, 1) for m in ("plain", "sharded")]
    assert _cases(_run(1, "--checkpoint", str(tmp_path)), 1) == [*loads, "elastic-committed=4-synced-at=1"]
