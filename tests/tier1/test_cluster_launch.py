"""Cluster launches, pure parts: Slurm variables, placement, finding MPI's own mpiexec, singleton refusal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddl.base.config import Config, JobEnv, job_from_env
from ddl.launcher import cli
from ddl.launcher import mpi as mpi_module
from ddl.launcher.command import LaunchError, placement
from ddl.launcher.hosts import HostSlots
from ddl.launcher.mpi import (
    MpiNotFoundError,
    find_mpiexec,
    launcher_flavour,
    mpiexec_candidates,
)
from ddl.launcher.slurm import SlurmError, allocation_hosts, expand_hostlist, expand_tasks_per_node
from ddl.runtime.world_check import SingletonWorldError, WorldMismatchError, check_world
from ddl.wire.mpi_library import loaded_library_path

# ---------------------------------------------------------------- Slurm variables


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("h1", ["h1"]),
        ("h[1-2]", ["h1", "h2"]),
        ("node[01-03,07],gpu5", ["node01", "node02", "node03", "node07", "gpu5"]),
        ("n[8-11]", ["n8", "n9", "n10", "n11"]),
        ("r[1-2]-c[1-2]", ["r1-c1", "r1-c2", "r2-c1", "r2-c2"]),
        ("a,b[009-010]", ["a", "b009", "b010"]),
    ],
)
def test_expand_hostlist(text: str, hosts: list[str]) -> None:
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["h[1-2", "h]1[", "h[a-b]", "h[3-1]", "", "h[1-]"])
def test_bad_hostlist_is_a_clear_error(text: str) -> None:
    with pytest.raises(SlurmError, match="Slurm host list"):
        expand_hostlist(text)


@pytest.mark.parametrize(("text", "counts"), [("2(x2)", [2, 2]), ("4", [4]), ("2(x3),1", [2, 2, 2, 1]), ("1,3", [1, 3])])
def test_expand_tasks_per_node(text: str, counts: list[int]) -> None:
    assert expand_tasks_per_node(text) == counts


@pytest.mark.parametrize("text", ["2x2", "2(2)", "", "a"])
def test_bad_tasks_per_node(text: str) -> None:
    with pytest.raises(SlurmError, match="SLURM_TASKS_PER_NODE"):
        expand_tasks_per_node(text)


SALLOC = {"SLURM_JOB_ID": "12", "SLURM_JOB_NODELIST": "h[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)",
          "SLURM_NTASKS": "4", "SLURM_JOB_NUM_NODES": "2"}


def test_job_from_env_reads_slurm_and_pmi_variables() -> None:
    job = job_from_env(SALLOC)
    assert job == JobEnv(slurm_job_id="12", slurm_nodelist="h[1-2]", slurm_tasks_per_node="2(x2)", slurm_ntasks=4)
    assert job.in_slurm and not job.mpi_launched
    task = job_from_env({**SALLOC, "SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "0", "PMI_RANK": "0"})
    assert task.slurm_step_tasks == 4 and task.slurm_procid == 0 and task.mpi_launched
    assert not job_from_env({}).in_slurm
    assert job_from_env({"SLURM_JOB_ID": "3", "SLURM_NTASKS": "many"}).slurm_ntasks is None


def test_allocation_hosts_from_slurm() -> None:
    assert allocation_hosts(job_from_env(SALLOC)) == (HostSlots("h1", 2), HostSlots("h2", 2))
    uneven = job_from_env({**SALLOC, "SLURM_JOB_NODELIST": "a,b[1-2]", "SLURM_TASKS_PER_NODE": "3,1(x2)"})
    assert allocation_hosts(uneven) == (HostSlots("a", 3), HostSlots("b1", 1), HostSlots("b2", 1))
    assert allocation_hosts(job_from_env({})) == ()


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"SLURM_JOB_NODELIST": "h[1-3]"}, ["names 3 host(s)", "gives 2 count(s)"]),
        ({"SLURM_TASKS_PER_NODE": ""}, ["no SLURM_TASKS_PER_NODE", "--ntasks-per-node"]),
        ({"SLURM_JOB_NODELIST": ""}, ["no SLURM_JOB_NODELIST"]),
    ],
)
def test_allocation_that_cannot_be_read_says_why(env: dict[str, str], words: list[str]) -> None:
    with pytest.raises(SlurmError) as info:
        allocation_hosts(job_from_env({**SALLOC, **env}))
    for word in words:
        assert word in str(info.value)


# ---------------------------------------------------------------- placement


def test_placement_takes_np_and_hosts_from_the_allocation() -> None:
    np_, hosts, notes = placement(None, (), job_from_env(SALLOC))
    assert (np_, hosts) == (4, (HostSlots("h1", 2), HostSlots("h2", 2)))
    assert "from Slurm job 12" in notes[0] and "SLURM_TASKS_PER_NODE=2(x2)" in notes[0]
    assert placement(2, (), job_from_env(SALLOC))[:2] == (2, hosts)


def test_explicit_hosts_win_over_the_allocation() -> None:
    mine = (HostSlots("x", 3),)
    assert placement(None, mine, job_from_env(SALLOC)) == (3, mine, ["-np 3: every slot of x:3"])


def test_placement_outside_slurm_needs_np() -> None:
    assert placement(2, (), JobEnv()) == (2, (), [])
    with pytest.raises(LaunchError, match="no -np given"):
        placement(None, (), JobEnv())


def test_ddlrun_in_an_allocation_needs_no_np_or_hosts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ddl.launcher.command import MpiInfo

    launched: list[list[str]] = []
    for name, value in SALLOC.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(cli, "detect_mpi", lambda **_: MpiInfo(flavour="mpich", mpiexec="/v/bin/mpiexec"))
    monkeypatch.setattr(cli, "run_launch", lambda launch, *a, **k: launched.append(launch.argv) or 0)
    monkeypatch.setattr(cli, "check_command", lambda *a, **k: None)  # train.py is on the cluster, not here
    monkeypatch.setattr(cli, "merge_same_machines", lambda hosts: (hosts, []))  # h1, h2 do not resolve here
    assert cli.main(["--verbose", "python", "train.py"]) == 0
    (argv,) = launched
    monitor = argv[argv.index("DDL_MONITOR") + 1]
    assert argv == ["/v/bin/mpiexec", "-n", "4", "-hosts", "h1:2,h2:2", "-genv",
                    "DDL_MONITOR", monitor, "-genv", "DDL_VERBOSE", "1", sys.executable, "-m",
                    "ddl.launcher.watch.keeper", "--", sys.executable, "train.py"]
    assert "ddlrun: hosts h1:2,h2:2 from Slurm job 12" in capsys.readouterr().err
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "2(x3)")
    assert cli.main(["python", "train.py"]) == 2
    assert "names 2 host(s)" in capsys.readouterr().err


# ---------------------------------------------------------------- MPI's own mpiexec


def fake_launcher(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\necho '{text}'\n")
    path.chmod(0o755)
    return path


def test_loaded_library_path_from_proc_maps() -> None:
    maps = ("7f0-7f1 r--p 0 08:01 1 /usr/lib/libc.so.6\n"
            "7f2-7f3 r-xp 0 08:01 2 /v/lib/libmpi_abi.so.1\n"
            "7f4-7f5 r-xp 0 08:01 3 /opt/ompi/lib/libmpi.so.40.30.4\n")
    assert loaded_library_path(maps) == "/opt/ompi/lib/libmpi.so.40.30.4"
    assert loaded_library_path("7f0-7f1 r--p 0 08:01 1 /usr/lib/libmpi_cxx.so.40\n") is None


def test_candidates_start_at_the_library_then_python_then_path() -> None:
    found = mpiexec_candidates(flavour="openmpi", library_path="/usr/lib/x86_64-linux-gnu/libmpi.so.40",
                               python_executable="/v/bin/python", path_dirs=["/opt/bin", ""])
    folders = list(dict.fromkeys(str(p.parent) for p in found))
    assert folders[:4] == ["/usr/lib/x86_64-linux-gnu/bin", "/usr/lib/bin", "/usr/bin", "/bin"]
    assert folders[-2:] == ["/v/bin", "/opt/bin"]
    assert [p.name for p in found[:4]] == ["mpiexec", "mpirun", "mpirun.openmpi", "mpiexec.openmpi"]


@pytest.mark.parametrize(
    ("text", "flavour"),
    [("mpiexec (OpenRTE) 4.1.4", "openmpi"), ("mpirun (Open MPI) 5.0.3", "openmpi"),
     ("HYDRA build details:\n Version: 4.2.0", "mpich"), ("Intel(R) MPI Library for Linux* OS", "mpich"),
     ("srun 22.05", None)],
)
def test_launcher_flavour(text: str, flavour: str | None) -> None:
    assert launcher_flavour(text) == flavour


def test_find_mpiexec_skips_another_mpis_launcher(tmp_path: Path) -> None:
    # Debian with both MPIs: /usr/bin/mpiexec is MPICH's (alternatives), Open MPI's is mpirun.openmpi.
    usr = tmp_path / "usr"
    fake_launcher(usr / "bin", "mpiexec", "HYDRA build details:")
    ompi = fake_launcher(usr / "bin", "mpirun.openmpi", "mpirun (Open MPI) 4.1.4")
    library = str(usr / "lib" / "x86_64-linux-gnu" / "libmpi.so.40")
    path, text = find_mpiexec(flavour="openmpi", library_path=library,
                              python_executable=str(tmp_path / "v" / "python"), path_dirs=[])
    assert (path, text.strip()) == (ompi, "mpirun (Open MPI) 4.1.4")
    with pytest.raises(MpiNotFoundError, match=r"belong to another MPI: .*mpiexec \(mpich\)"):
        find_mpiexec(flavour="openmpi", library_path=None, python_executable=str(usr / "bin" / "python"),
                     path_dirs=[str(tmp_path / "nothing")], probe=lambda p: "HYDRA")


def test_find_mpiexec_prefers_the_venvs_own(tmp_path: Path) -> None:
    venv = fake_launcher(tmp_path / "v" / "bin", "mpiexec", "HYDRA build details:")
    fake_launcher(tmp_path / "usr" / "bin", "mpiexec", "HYDRA build details:")
    path, _ = find_mpiexec(flavour="mpich", library_path=str(tmp_path / "v" / "lib" / "libmpi.so.12"),
                           python_executable="/elsewhere/python", path_dirs=[str(tmp_path / "usr" / "bin")])
    assert path == venv


def in_subprocess(code: str, env: dict[str, str] | None = None) -> str:
    # mpi4py.MPI imported without MPI_Init (as ddlrun and doctor do) would leave this pytest
    # process unable to ddl.init() in later tests: probe the real MPI in a child.
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if not k.startswith("SLURM_")} | (env or {}))
    assert done.returncode in (0, 1), done.stderr
    return done.stdout


def test_this_environment_uses_its_own_mpiexec() -> None:
    out = in_subprocess(
        "import sys\nfrom pathlib import Path\nfrom ddl.base.config import search_path\nfrom ddl.launcher import mpi\n"
        "info = mpi.detect_mpi(python_executable=sys.executable, path=search_path())\n"
        "lib = mpi.load_library()\n"
        "print(info.flavour == lib.flavour, info.library == lib.first_line, Path(lib.path or '/nonexistent').exists(),"
        " mpi.launcher_flavour(mpi.probe_launcher(Path(info.mpiexec))) == info.flavour)")
    assert out.split() == ["True"] * 4, out


# ---------------------------------------------------------------- singleton worlds under srun


def srun_task(**extra: str) -> JobEnv:
    return job_from_env({**SALLOC, "SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "1", **extra})


def test_srun_tasks_left_as_singletons_are_refused() -> None:
    with pytest.raises(SingletonWorldError) as info:
        check_world(1, Config(), srun_task())
    message = str(info.value)
    assert "srun started 4 processes" in message and "--mpi=pmi2" in message and "DDL_ALLOW_SINGLETONS" in message
    assert "MPI connected 1" in message and "Nothing was trained" in message


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"PMI_SIZE": "2", "PMI_RANK": "1"}, ["the launcher started 2 processes", "PMI_SIZE=2", "hydra"]),
        ({"OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_RANK": "2"},
         ["the launcher started 3 processes", "OMPI_COMM_WORLD_SIZE=3", "Open MPI"]),
        ({"PMIX_RANK": "1"}, ["started this process as rank 1", "PMIX_RANK=1"]),
        ({**SALLOC, "SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "0", "PMIX_RANK": "0"},
         ["srun started 2 processes", "SLURM_STEP_NUM_TASKS=2"]),
    ],
)
def test_a_world_of_one_under_a_launcher_of_several_is_refused(env: dict[str, str], words: list[str]) -> None:
    """mpi4py loaded another MPI than the launcher's: each process came up alone."""
    with pytest.raises(WorldMismatchError) as info:
        check_world(1, Config(), job_from_env(env), library="MPICH Version: 5.0.2 (/v/lib/libmpi.so.12)")
    message = str(info.value)
    assert all(w in message for w in words), message
    assert "MPICH Version: 5.0.2" in message and "not the MPI of the launcher" in message, message


def test_an_mpi_that_cannot_load_is_named_with_its_fix() -> None:
    with pytest.raises(WorldMismatchError) as info:
        check_world(1, Config(), job_from_env({"PMI_SIZE": "2", "PMI_RANK": "0"}),
                    load_error="RuntimeError: cannot load MPI library /x/libmpi.so.12")
    message = str(info.value)
    assert "cannot load MPI library /x/libmpi.so.12" in message and "pip install mpich" in message, message


def test_a_world_of_another_size_is_refused() -> None:
    with pytest.raises(WorldMismatchError, match="started 4 processes .* MPI connected 2"):
        check_world(2, Config(), job_from_env({"OMPI_COMM_WORLD_SIZE": "4"}), library="Open MPI v4.1.4")


def test_the_innermost_launcher_is_the_one_compared() -> None:
    # mpiexec -n 4 inside a one-task srun step: hydra's PMI_SIZE, not the step's task count.
    job = job_from_env({**SALLOC, "SLURM_STEP_NUM_TASKS": "1", "SLURM_PROCID": "0", "PMI_SIZE": "4"})
    assert job.announced is not None and job.announced.size == 4 and "PMI_SIZE" in job.announced.source
    check_world(4, Config(), job)
    with pytest.raises(WorldMismatchError):
        check_world(1, Config(), job)


@pytest.mark.parametrize(
    ("size", "config", "job"),
    [
        (4, Config(), srun_task()),                           # MPI connected them
        (1, Config(allow_singletons=True), srun_task()),      # independent on purpose
        (1, Config(allow_singletons=True), job_from_env({"PMI_SIZE": "2"})),  # likewise under mpiexec
        (1, Config(), srun_task(SLURM_STEP_NUM_TASKS="1")),   # srun -n 1
        (1, Config(), srun_task(PMI_SIZE="1")),               # mpiexec -n 1 in a step
        (1, Config(), job_from_env(SALLOC)),                  # python in the salloc shell
        (1, Config(), job_from_env({**SALLOC, "SLURM_PROCID": "0"})),  # python in an sbatch script
        (1, Config(), JobEnv()),                              # no Slurm
        (1, Config(), job_from_env({})),                      # plain python train.py
        (1, Config(), job_from_env({"PMIX_RANK": "0"})),      # a PMIx rank 0 alone: consistent
        (2, Config(), job_from_env({"PMIX_RANK": "1"})),      # PMIx without a size: MPI's world
        (2, Config(), job_from_env({"PMI_SIZE": "2", "PMI_RANK": "1"})),
    ],
)
def test_worlds_that_are_fine(size: int, config: Config, job: JobEnv) -> None:
    check_world(size, config, job)


def test_allow_singletons_is_read_from_the_environment() -> None:
    assert Config.from_env({"DDL_ALLOW_SINGLETONS": "1"}).allow_singletons
    assert not Config.from_env({}).allow_singletons


# ---------------------------------------------------------------- ddl doctor


def test_launcher_version_lines() -> None:
    from ddl.launcher.mpi import launcher_version

    assert launcher_version("HYDRA build details:\n    Version:        5.0.2\n") == "HYDRA 5.0.2"
    assert launcher_version("mpirun (Open MPI) 4.1.4\n\nReport bugs to") == "mpirun (Open MPI) 4.1.4"


def test_transport_warnings() -> None:
    from ddl.tools.doctor import transport_warnings

    ucx = {"flavour": "mpich", "library_version": "MPICH Device: ch4:ucx ofi"}
    assert "UCX_TLS=tcp" in transport_warnings(**ucx, host_count=2, variables={}, shared_kernel=True)[0]
    assert "UCX_TLS is unset" in transport_warnings(**ucx, host_count=2, variables={}, shared_kernel=False)[0]
    assert transport_warnings(**ucx, host_count=2, variables={"UCX_TLS": "tcp"}, shared_kernel=True) == []
    assert transport_warnings(**ucx, host_count=1, variables={}, shared_kernel=True) == []
    assert transport_warnings(flavour="openmpi", library_version="Open MPI v4.1.4", host_count=2,
                              variables={}, shared_kernel=True) == []


def test_doctor_reports_this_environment() -> None:
    out = in_subprocess("from ddl.tools.cli import main; raise SystemExit(main(['doctor', '-H', 'a:2,b:2']))")
    library = in_subprocess("from ddl.launcher import mpi; print(mpi.load_library().first_line)").strip()
    assert f"MPI library    {library}" in out
    assert "launcher       " in out and "placement      4 rank(s) on a:2,b:2" in out
    assert "topology       2x2 " in out


def test_doctor_in_an_allocation_plans_its_hosts() -> None:
    env = {**SALLOC, "SLURM_JOB_NODELIST": "n[1-3]", "SLURM_TASKS_PER_NODE": "4(x3)"}
    out = in_subprocess("from ddl.tools.doctor import main; raise SystemExit(main([]))", env)
    assert "12 rank(s) on n1:4,n2:4,n3:4" in out and "topology       4x3 " in out
    out = in_subprocess("from ddl.tools.doctor import main; raise SystemExit(main(['-np', '13']))", env)
    assert "problem:       -np 13 needs 13 slots but the hosts give 12" in out  # ddlrun's own words


def test_doctor_warns_when_a_wheel_mpi_sits_beside_the_loaded_one(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.metadata

    from ddl.tools import doctor
    try:
        importlib.metadata.distribution("mpich")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("this environment has no mpich wheel")
    system = mpi_module.MpiLibrary(flavour="openmpi", version="Open MPI v4.1.4", path="/usr/lib/libmpi.so.40",
                                   standard="3.1", mpi4py_version="4.1.2", mpi4py_extension="MPI.cpython.so",
                                   mpi4py_build={"mpicc": "mpicc"})
    monkeypatch.setattr(doctor, "load_library", lambda: system)
    monkeypatch.setattr(doctor, "_launcher", lambda report, library: None)
    assert doctor.main(["-np", "2"]) == 0
    out = capsys.readouterr().out
    assert "built from source with mpicc" in out
    assert "warning:       the mpich wheel is installed but mpi4py loads /usr/lib/libmpi.so.40: two MPIs" in out
