"""Tier 2: a world that did not form is refused before anything trains.

Each case starts two processes that cannot join (mpi4py pointed at a libmpi that does
not exist, or an MPICH process started by an Open MPI-shaped launcher) and checks that
the job exits non-zero within seconds, that no process reached training, and that the
message names MPI and the fix. A plain ``python`` without any launcher still runs alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.mpi
BIN = Path(sys.executable).parent
TRAIN = "import ddl; ddl.init(); print('TRAINED', ddl.rank(), ddl.size(), flush=True)"
NO_LIBMPI = {"MPI4PY_LIBMPI": "/nonexistent/libmpi.so.12"}  # mpi4py cannot load its MPI


def run(cmd: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env={**os.environ, **env})
    return proc, time.monotonic() - start


def mpiexec() -> str:
    found = shutil.which("mpiexec", path=str(BIN))
    if found is None:
        pytest.skip("no mpiexec beside this interpreter (the pip MPICH wheel provides one)")
    return found


def test_mpiexec_with_an_mpi_that_cannot_load_exits_nonzero_before_training() -> None:
    proc, took = run([mpiexec(), "-n", "2", sys.executable, "-c", TRAIN], NO_LIBMPI)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "TRAINED" not in out, out
    assert out.count("WorldMismatchError: the launcher started 2 processes (PMI_SIZE=2") == 2, out
    assert "cannot load MPI library" in out and "pip install mpich" in out, out
    assert took < 10, f"took {took:.1f} s"


def test_ddlrun_with_an_mpi_that_cannot_load_refuses_before_starting() -> None:
    proc, took = run([str(BIN / "ddlrun"), "-np", "2", sys.executable, "-c", TRAIN], NO_LIBMPI)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 127, out
    assert "TRAINED" not in out and "mpi4py cannot load an MPI library" in out and "pip install mpich" in out, out
    assert took < 10, f"took {took:.1f} s"


def test_processes_of_another_mpis_launcher_are_refused() -> None:
    """Open MPI's mpirun starting mpi4py-on-MPICH processes (its variables, without its PMIx
    server: refused before MPI_Init, where MPICH would abort with its own words)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "OMPI_", "SLURM_"))}
    start = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-c", TRAIN], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env={**env, "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": str(r)})
             for r in range(2)]
    outs = [p.communicate(timeout=60)[0] for p in procs]
    took = time.monotonic() - start
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode != 0 and "TRAINED" not in out, out
        assert "WorldMismatchError: Open MPI's launcher started this process (OMPI_COMM_WORLD_SIZE=2)" in out, out
        assert "but mpi4py uses MPICH" in out and "cannot join an Open MPI world" in out and "ddlrun" in out, out
    assert took < 10, f"took {took:.1f} s"


def test_plain_python_without_mpi_still_runs_alone() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "OMPI_", "SLURM_"))}
    proc = subprocess.run([sys.executable, "-c", TRAIN], capture_output=True, text=True, timeout=60,
                          env={**env, **NO_LIBMPI})
    assert proc.returncode == 0 and "TRAINED 0 1" in proc.stdout, proc.stdout + proc.stderr
    assert "MPI unavailable" in proc.stderr and "running as a single process" in proc.stderr, proc.stderr


def test_allow_singletons_runs_independent_worlds_on_purpose() -> None:
    proc, _ = run([mpiexec(), "-n", "2", sys.executable, "-c", TRAIN], {**NO_LIBMPI, "DDL_ALLOW_SINGLETONS": "1"})
    assert proc.returncode == 0 and proc.stdout.count("TRAINED 0 1") == 2, proc.stdout + proc.stderr
