"""Tier 2: ddl.tensorflow training equivalence, callbacks and collectives under a real mpiexec."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")
WORKER = Path(__file__).parent / "workers" / "worker_tf.py"
pytestmark = pytest.mark.mpi

CASES = ["fit-sgd-momentum-broadcast-from-different-inits", "fit-adam-broadcast-from-different-inits",
         "fit-adam-lr-schedule-broadcast", "fit-sgd-backward_passes_per_step=2", "fit-adam-fp16-compression",
         "embedding-fit-sgd-indexedslices", "fit-adamw-resumed-on-root-only", "tape-sgd-momentum", "tape-embedding-adam-indexedslices",
         "tape-embedding-adam-sparse_as_dense"]
SHARDED = ["sharded-fit-sgd-momentum-wd", "sharded-fit-adam", "sharded-fit-adamw", "sharded-fit-adagrad",
           "sharded-tape-adam", "sharded-checkpoint-saved=4-resumed", "sharded-elastic-committed=4-synced"]

#: PowerSGD, LocalSGD and DiLoCo (worker_tf.py's last checks, with the others at 2 ranks).
SLOW_CASES = ["keras-localsgd-period-1", "keras-diloco-period-1-outer-sgd-lr-1",
              "keras-powersgd-full-rank-no-error-feedback", "keras-powersgd-rank-1",
              "keras-diloco-period-3-overlap-2-powersgd"]


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One-process reference weights, trained by the first run and reused by the next."""
    return tmp_path_factory.mktemp("tf-references")


@pytest.mark.parametrize("np_", [4, 2])  # 4 first: it saves the checkpoint the others load
def test_tf_ranks_train_like_one_process(np_: int, references: Path) -> None:
    # The other checks (callbacks, save/load, XLA error, collectives) run once, at 2 ranks.
    cmd = [sys.executable, "-m", "ddl.launcher.cli", "-np", str(np_), sys.executable, str(WORKER), str(references),
           *(["--all-checks"] if np_ == 2 else [])]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert len(re.findall(rf"PASS tensorflow rank \d+/{np_}", proc.stdout)) == np_, proc.stdout
    assert ("PASS tensorflow all checks" in proc.stdout) == (np_ == 2), proc.stdout
    seen = re.findall(rf"EQUIV (\S+) ranks={np_} max_abs_diff=\S+ .*? identical=yes", proc.stdout)
    assert seen == CASES + SHARDED, proc.stdout
    slow = re.findall(rf"SLOWLINKS (\S+) ranks={np_} max_abs_diff=\S+ identical=yes", proc.stdout)
    assert slow == (SLOW_CASES if np_ == 2 else []), proc.stdout


@pytest.mark.parametrize("np_", [3, 1])
def test_tf_sharded_at_3_ranks_and_checkpoints_loaded_at_3_and_1(np_: int, references: Path) -> None:
    """The sharded cases at a world size that divides nothing evenly, and the 4-rank
    checkpoint loaded at 3 ranks and in one process (after the 4- and 2-rank runs)."""
    if not (references / "keras-sharded-checkpoint" / "manifest.json").exists():
        pytest.skip("needs the checkpoint the 4-rank run of test_tf_ranks_train_like_one_process saves")
    worker = [sys.executable, str(WORKER), str(references), "--sharded-only"]
    cmd = [sys.executable, "-m", "ddl.launcher.cli", "-np", str(np_), *worker] if np_ > 1 else worker
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    seen = re.findall(rf"EQUIV (\S+) ranks={np_} max_abs_diff=\S+ .*? identical=yes", proc.stdout)
    assert seen == (SHARDED if np_ > 1 else SHARDED[-2:]), proc.stdout
