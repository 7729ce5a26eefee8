"""Tier 2: Horovod's API under a real mpiexec — SyncBatchNorm and join equal one process,
process sets, Adasum, torch.compile, Keras callbacks on a model built at its first batch,
Horovod 0.28.1's TF graph-mode error classes, gradient conventions, local gradient sources and
the Keras optimizer's compute_gradients."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

WORKERS = Path(__file__).parent / "workers"
pytestmark = pytest.mark.mpi


def _run(np_: int, worker: str, *flags: str) -> str:
    cmd = [sys.executable, "-m", "ddl.launcher.cli", "-np", str(np_), *flags, sys.executable, str(WORKERS / worker)]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "DDL_STALL_TIMEOUT": "120"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_horovod_torch_api_at_3_ranks() -> None:
    pytest.importorskip("torch")
    # join's equivalence to one process over the same batches needs Average over the ranks that
    # contributed (Horovod's own rule divides by all: the tier-1 tests cover both).
    out = _run(3, "worker_horovod_torch.py", "--join-average", "contributors")
    assert len(re.findall(r"PASS horovod torch rank \d/3", out)) == 3, out
    for what in ("syncbatchnorm", "join", "sparse-gradients", "torch.compile"):
        assert len(re.findall(rf"EQUIV {re.escape(what)} ", out)) == 3, out
    assert len(re.findall(r"PASS (process_sets|gradient_conventions|optimizer_outside_process_set|adasum) rank",
                          out)) == 12, out


def test_horovod_tensorflow_keras_api_at_2_ranks() -> None:
    pytest.importorskip("tensorflow")
    out = _run(2, "worker_horovod_tf.py")
    assert len(re.findall(r"PASS horovod tensorflow rank \d/2", out)) == 2, out
    assert len(re.findall(r"EQUIV syncbatchnormalization ranks=2", out)) == 2, out
    assert len(re.findall(r"PASS keras unbuilt model with callbacks", out)) == 2, out
    assert len(re.findall(r"PASS horovod gradient conventions rank \d", out)) == 2, out
    # Where a C++ compiler is present the status op must be built (the compilers that
    # ddl.tensorflow.status_op looks for; not imported here: it would import TensorFlow).
    status = str(any(shutil.which(c) for c in ("c++", "g++", "clang++")))
    assert len(re.findall(rf"PASS session graph errors and broadcast_ rank \d status_op={status}", out)) == 2, out
    for what in ("local gradient sources", "keras compute_gradients"):
        assert len(re.findall(rf"PASS {what} rank \d", out)) == 2, out
