"""ddlrun on Kubernetes without pods: what an MPIJob launcher and a TrainJob node read, the wait for
workers, Open MPI 5's settings and the world check's one-host trap, all as pure functions."""

from __future__ import annotations

import io
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ddl.base.config import JobEnv, job_from_env
from ddl.launcher import cli, platforms
from ddl.launcher.command import Launch, LaunchError, MpiInfo
from ddl.launcher.hosts import HostSlots
from ddl.launcher.kubernetes import (
    DEFAULT_WAIT_S,
    DISCOVER_HOSTS,
    MpiJobHostfile,
    check_node_options,
    discovery_script,
    mpijob_hostfile,
    mpijob_hosts,
    node_place,
    visible_gpus,
    wait_timeout,
)
from ddl.launcher.openmpi import with_open_mpi_settings
from ddl.launcher.readiness import (
    Action,
    Probe,
    Reach,
    WorkersNotReady,
    classify_ssh,
    decide,
    is_local,
    should_report,
    ssh_command,
    wait_for_hosts,
)
from ddl.runtime.world_check import one_host_refusal

OPERATOR_OPENMPI = "train-worker-0.train.default.svc slots=2\ntrain-worker-1.train.default.svc slots=2\n"
OPERATOR_MPICH = "train-worker-0.train.default.svc:2\ntrain-worker-1.train.default.svc:2\n"
PET = (("PET_NNODES", "2"), ("PET_NPROC_PER_NODE", "1"), ("PET_NODE_RANK", "1"),
       ("PET_MASTER_ADDR", "tj-node-0-0.tj"), ("PET_MASTER_PORT", "29500"))


# -- what the environment says ---------------------------------------------------------------

def test_job_env_reads_the_operators_and_trainers_variables() -> None:
    job = job_from_env({"K_MPI_JOB_ROLE": "launcher", "OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
                        "PET_NNODES": "2", "PET_NODE_RANK": "1", "HOME": "/root"})
    assert job.mpijob_role == "launcher"
    assert job.hostfiles == (("OMPI_MCA_orte_default_hostfile", "/etc/mpi/hostfile"),)
    assert job.pet == (("PET_NNODES", "2"), ("PET_NODE_RANK", "1"))
    assert job_from_env({}) == JobEnv()


# -- MPIJob ------------------------------------------------------------------------------------

@pytest.mark.parametrize("variable", ["HYDRA_HOST_FILE", "OMPI_MCA_orte_default_hostfile", "I_MPI_HYDRA_HOST_FILE"])
def test_the_launcher_pods_hostfile_variable_names_the_file(variable: str) -> None:
    job = job_from_env({"K_MPI_JOB_ROLE": "launcher", variable: "/etc/mpi/hostfile"})
    found = mpijob_hostfile(job, exists=lambda p: False)
    assert found is not None and found.path == "/etc/mpi/hostfile"
    assert f"{variable}=/etc/mpi/hostfile, set by the MPI Operator" in found.source


def test_the_configmap_is_found_by_the_role_alone_and_nothing_outside_a_launcher() -> None:
    launcher = job_from_env({"K_MPI_JOB_ROLE": "launcher"})
    assert mpijob_hostfile(launcher, exists=lambda p: p == "/etc/mpi/hostfile").path == "/etc/mpi/hostfile"  # type: ignore[union-attr]
    assert mpijob_hostfile(launcher, exists=lambda p: False) is None
    assert mpijob_hostfile(job_from_env({"K_MPI_JOB_ROLE": "worker"}), exists=lambda p: True) is None
    assert mpijob_hostfile(job_from_env({}), exists=lambda p: True) is None


@pytest.mark.parametrize("text", [OPERATOR_OPENMPI, OPERATOR_MPICH,
                                  OPERATOR_MPICH.replace(".svc:", ".svc.cluster.local:")])
def test_both_operator_hostfile_formats_give_the_same_hosts(text: str) -> None:
    hosts, notes = mpijob_hosts(MpiJobHostfile(path="/etc/mpi/hostfile", source="HYDRA_HOST_FILE=..."), text)
    assert [h.slots for h in hosts] == [2, 2]
    assert [h.name.split(".")[0] for h in hosts] == ["train-worker-0", "train-worker-1"]
    assert notes[0].startswith("hosts train-worker-0.train.default.svc") and "from /etc/mpi/hostfile" in notes[0]


def test_elastic_takes_the_operators_discovery_script_unless_one_is_given() -> None:
    assert discovery_script(given=None, in_mpijob=True, exists=lambda p: True) == DISCOVER_HOSTS
    assert discovery_script(given="/mine.sh", in_mpijob=True, exists=lambda p: True) == "/mine.sh"
    assert discovery_script(given=None, in_mpijob=True, exists=lambda p: False) is None
    assert discovery_script(given=None, in_mpijob=False, exists=lambda p: True) is None


def test_waiting_is_the_default_on_kubernetes_only() -> None:
    assert wait_timeout(None, on_platform=True) == DEFAULT_WAIT_S
    assert wait_timeout(None, on_platform=False) == 0
    assert wait_timeout(30, on_platform=False) == 30
    with pytest.raises(LaunchError, match="--wait-for-workers -1: give seconds >= 0"):
        wait_timeout(-1, on_platform=True)


# -- TrainJob nodes -----------------------------------------------------------------------------

def test_trainers_variables_place_the_node() -> None:
    place = node_place({}, JobEnv(pet=PET), gpus=0, cpus=8)
    assert place is not None
    assert (place.nnodes, place.node_rank, place.nproc_per_node, place.np) == (2, 1, 1, 2)
    assert (place.master_addr, place.master_port, place.is_master) == ("tj-node-0-0.tj", 29500, False)
    assert "PET_NNODES=2" in place.source and "PET_MASTER_ADDR=tj-node-0-0.tj" in place.source


def test_torchrun_flags_win_over_the_variables() -> None:
    place = node_place({"node_rank": "0", "master_port": "4000"}, JobEnv(pet=PET), gpus=0, cpus=8)
    assert place is not None and (place.node_rank, place.master_port) == (0, 4000)
    assert "--node-rank 0" in place.source and "PET_NODE_RANK" not in place.source


def test_no_node_count_is_no_node_mode() -> None:
    assert node_place({}, JobEnv(), gpus=0, cpus=2) is None
    assert node_place({}, JobEnv(pet=(("PET_MASTER_PORT", "29500"),)), gpus=0, cpus=2) is None
    with pytest.raises(LaunchError, match="--node-rank 1 given without --nnodes"):
        node_place({"node_rank": "1"}, JobEnv(), gpus=0, cpus=2)


@pytest.mark.parametrize(("nproc", "gpus", "cpus", "want"), [
    ("3", 0, 8, 3), ("cpu", 2, 8, 8), ("gpu", 2, 8, 2), ("auto", 4, 8, 4), ("auto", 0, 8, 8),
])
def test_ranks_per_node_take_torchruns_words(nproc: str, gpus: int, cpus: int, want: int) -> None:
    place = node_place({"nnodes": "1", "nproc_per_node": nproc}, JobEnv(), gpus=gpus, cpus=cpus)
    assert place is not None and place.nproc_per_node == want


@pytest.mark.parametrize(("flags", "words"), [
    ({"nnodes": "1:4"}, ["--nnodes 1:4", "'1:4' is not the number of nodes", "ddlrun --elastic"]),
    ({"nnodes": "0"}, ["give a whole number >= 1"]),
    ({"nnodes": "2", "node_rank": "2", "master_addr": "m"}, ["node rank 2 is not below the node count 2"]),
    ({"nnodes": "2"}, ["no master address", "--master-addr"]),
    ({"nnodes": "2", "master_addr": "m", "master_port": "70000"}, ["70000 is not a TCP port"]),
    ({"nnodes": "1", "nproc_per_node": "gpu"}, ["no GPU is visible"]),
    ({"nnodes": "1", "nproc_per_node": "two"}, ["'two' is not a rank count per node", "'auto'"]),
])
def test_bad_node_values_are_named_with_their_source(flags: dict[str, str], words: list[str]) -> None:
    with pytest.raises(LaunchError) as caught:
        node_place(flags, JobEnv(), gpus=0, cpus=2)
    assert all(w in str(caught.value) for w in words), str(caught.value)


def test_node_mode_and_np_or_hosts_must_agree() -> None:
    place = node_place({}, JobEnv(pet=PET), gpus=0, cpus=2)
    assert place is not None
    check_node_options(place, np=2, hosts_given=False)
    with pytest.raises(LaunchError, match="-np 4 but 2 node"):
        check_node_options(place, np=4, hosts_given=False)
    with pytest.raises(LaunchError, match="-H/--hostfile with nodes"):
        check_node_options(place, np=None, hosts_given=True)


def test_visible_gpus_counts_device_files_only() -> None:
    assert visible_gpus(["nvidia0", "nvidia7", "nvidiactl", "nvidia-uvm", "nvidia-modeset", "tty0"]) == 2


# -- waiting for workers --------------------------------------------------------------------------

@pytest.mark.parametrize(("code", "stderr", "reach"), [
    (0, "", Reach.READY),
    (255, "ssh: Could not resolve hostname w-1.j.ns.svc: Name or service not known", Reach.UNRESOLVED),
    (255, "ssh: connect to host w-1 port 22: Connection refused", Reach.NO_SSH),
    (255, "ssh: connect to host w-1 port 22: Connection timed out", Reach.NO_SSH),
    (255, "kex_exchange_identification: read: Connection reset by peer", Reach.NO_SSH),
    (255, "root@w-1: Permission denied (publickey).", Reach.LOGIN_REFUSED),
    (255, "Host key verification failed.", Reach.LOGIN_REFUSED),
])
def test_ssh_probes_are_classified(code: int, stderr: str, reach: Reach) -> None:
    probe = classify_ssh(code, stderr)
    assert probe.reach is reach
    assert probe.detail == (stderr if stderr else "")


def test_decide_launches_waits_and_gives_up() -> None:
    ready, late = Probe(Reach.READY), Probe(Reach.NO_SSH, "ssh: connect to host b port 22: Connection refused")
    assert decide({"a": ready, "b": ready}, elapsed=2, timeout=10).action is Action.LAUNCH
    wait = decide({"a": ready, "b": late, "c": None}, elapsed=2, timeout=10)
    assert wait.action is Action.WAIT
    assert wait.message == ("waiting for 2 of 3 hosts (2 s of 10 s): b does not accept ssh (ssh: connect to host b "
                            "port 22: Connection refused); c not probed yet")
    give_up = decide({"a": ready, "b": late}, elapsed=10, timeout=10)
    assert give_up.action is Action.GIVE_UP and "--wait-for-workers 10" in give_up.message and "b does not" in give_up.message
    broken = decide({"a": Probe(Reach.BROKEN, "ssh is not installed")}, elapsed=0, timeout=10)
    assert broken.action is Action.GIVE_UP and "ssh is not installed" in broken.message


def test_waiting_lines_repeat_only_on_change_or_after_a_while() -> None:
    line = "waiting for 1 of 2 hosts (3 s of 300 s): b does not resolve"
    assert should_report(line, last_line=None, since_last=0)
    assert not should_report(line.replace("3 s", "4 s"), last_line=line, since_last=1)
    assert should_report(line.replace("does not resolve", "does not accept ssh"), last_line=line, since_last=1)
    assert should_report(line, last_line=line, since_last=10)


def test_the_probe_uses_the_mpis_own_ssh_and_arguments() -> None:
    mpich = ssh_command("mpich", {"HYDRA_LAUNCH_EXTRA_ARGS": "-o ConnectionAttempts=10 -p 2222"})
    assert mpich is not None and mpich[0] == "ssh" and mpich[-2:] == ["-p", "2222"]
    assert mpich.index("ConnectionAttempts=1") < mpich.index("ConnectionAttempts=10")  # ssh keeps the first
    assert ssh_command("mpich", {"HYDRA_LAUNCHER": "fork"}) is None
    assert ssh_command("mpich", {"HYDRA_LAUNCHER_EXEC": "/opt/fake-ssh.sh"}) is None
    ompi = ssh_command("openmpi", {"OMPI_MCA_plm_rsh_agent": "/usr/bin/ssh : rsh", "PRTE_MCA_plm_ssh_args": "-p 2222"})
    assert ompi is not None and ompi[0] == "/usr/bin/ssh" and ompi[-2:] == ["-p", "2222"]


def test_a_host_that_is_this_machine_needs_no_ssh() -> None:
    assert is_local("train-launcher.train.default.svc", "train-launcher")
    assert is_local("localhost", "x")
    assert not is_local("train-worker-0.train.default.svc", "train-launcher")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_wait_for_hosts_reports_what_it_waits_for_until_all_are_ready() -> None:
    clock = Clock()
    # b resolves at 3 s and accepts ssh at 5 s; a is there from the start.
    def probe(host: str) -> Probe:
        if host == "a" or clock.now >= 5:
            return Probe(Reach.READY)
        return Probe(Reach.UNRESOLVED, "Name or service not known") if clock.now < 3 else Probe(Reach.NO_SSH, "refused")

    lines: list[str] = []
    waited = wait_for_hosts(["a", "b"], timeout=60, probe=probe, report=lines.append, clock=clock, sleep=clock.sleep)
    assert waited == 5
    assert lines == ["waiting for 1 of 2 hosts (0 s of 60 s): b does not resolve (Name or service not known)",
                     "waiting for 1 of 2 hosts (3 s of 60 s): b does not accept ssh (refused)",
                     "all 2 hosts resolve and accept ssh (5 s)"]


def test_wait_for_hosts_gives_up_at_the_timeout_naming_each_host() -> None:
    clock = Clock()
    with pytest.raises(WorkersNotReady) as caught:
        wait_for_hosts(["a", "b"], timeout=4, probe=lambda h: Probe(Reach.UNRESOLVED, "nope"), report=lambda s: None,
                       clock=clock, sleep=clock.sleep)
    assert str(caught.value) == "gave up after 4 s (--wait-for-workers 4): 2 of 2 hosts not ready: a, b does not resolve (nope)"


def test_ready_hosts_are_launched_at_once_without_a_line() -> None:
    lines: list[str] = []
    assert wait_for_hosts(["a"], timeout=5, probe=lambda h: Probe(Reach.READY), report=lines.append) < 5
    assert lines == []


# -- ddlrun in a launcher pod (nothing started) -------------------------------------------------

MPICH = MpiInfo(flavour="mpich", mpiexec="/venv/bin/mpiexec", library="MPICH Version: 5.0.2")


class Recorder:
    """Stands in for mpiexec's Popen (ddlrun's watched run): records the argv, ends at once with 0."""

    launched: list[list[str]] = []

    def __init__(self, argv: list[str], *, env: dict[str, str], **kwargs: object) -> None:
        self.pid = 1 << 22  # no such process
        self.stdout, self.stderr = io.BytesIO(), io.BytesIO()
        Recorder.launched.append(argv)

    def poll(self) -> int:
        return 0

    def wait(self, timeout: float | None = None) -> int:
        return 0


@pytest.fixture
def launcher_pod(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(OPERATOR_MPICH.replace(":2", ":1"))
    monkeypatch.chdir(tmp_path)  # the scripts ddlrun checks before it starts anything
    for script in ("train.py", "t.py"):
        (tmp_path / script).write_text("")
    for name in ("OMPI_MCA_orte_default_hostfile", "I_MPI_HYDRA_HOST_FILE", "PRTE_MCA_prte_default_hostfile",
                 "SLURM_JOB_ID", "SLURM_JOBID", "PET_NNODES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("K_MPI_JOB_ROLE", "launcher")
    monkeypatch.setenv("HYDRA_HOST_FILE", str(hostfile))
    monkeypatch.setattr(cli, "detect_mpi", lambda **_: MPICH)
    Recorder.launched = []
    monkeypatch.setattr(subprocess, "Popen", Recorder)
    return hostfile


def test_ddlrun_in_a_launcher_pod_needs_no_flag_and_waits_for_its_workers(
        launcher_pod: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[str] = []

    def probe(host: str, *, ssh: Any, local: bool) -> Probe:
        seen.append(host)
        return Probe(Reach.READY) if len(seen) > 2 else Probe(Reach.UNRESOLVED, "not yet")

    monkeypatch.setattr(platforms, "probe_host", probe)
    monkeypatch.setattr("ddl.launcher.readiness.time.sleep", lambda s: None)
    assert cli.main(["python", "train.py"]) == 0
    argv = Recorder.launched[0]
    assert argv[:3] == ["/venv/bin/mpiexec", "-n", "2"]
    assert argv[argv.index("-hosts") + 1] == "train-worker-0.train.default.svc:1,train-worker-1.train.default.svc:1"
    err = capsys.readouterr().err
    assert "checking that 2 host(s) resolve and accept ssh" in err
    assert "waiting for 2 of 2 hosts" in err and "does not resolve (not yet)" in err
    assert "all 2 hosts resolve and accept ssh" in err


def test_workers_that_never_come_end_ddlrun_with_their_names(
        launcher_pod: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(platforms, "probe_host", lambda host, **_: Probe(Reach.NO_SSH, "Connection refused"))
    assert cli.main(["-np", "1", "--wait-for-workers", "0.2", "python", "train.py"]) == platforms.NOT_READY
    assert Recorder.launched == []
    err = capsys.readouterr().err
    # -np 1 needs the first worker only.
    assert "1 of 1 hosts not ready: train-worker-0.train.default.svc does not accept ssh (Connection refused)" in err


def test_hosts_given_on_the_command_line_win_over_the_pods(
        launcher_pod: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli.socket, "getaddrinfo", lambda *a, **k: [])
    monkeypatch.setattr(platforms, "probe_host", lambda *a, **k: pytest.fail("no wait for hosts the user typed"))
    assert cli.main(["-np", "2", "-H", "a:1,b:1", "python", "t.py"]) == 0
    argv = Recorder.launched[0]
    assert argv[argv.index("-hosts") + 1] == "a:1,b:1"


def test_a_hostfile_variable_outside_an_mpijob_is_read_but_not_waited_for(
        launcher_pod: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("K_MPI_JOB_ROLE")
    launcher_pod.write_text("nosuchhost.invalid:2\n")
    monkeypatch.setattr(platforms, "probe_host", lambda *a, **k: pytest.fail("no wait outside an MPIJob"))
    assert cli.main(["python", "t.py"]) == 2
    assert "host 'nosuchhost.invalid' does not resolve" in capsys.readouterr().err
    assert Recorder.launched == []


# -- Open MPI's settings ----------------------------------------------------------------------------

OMPI5 = MpiInfo(flavour="openmpi", mpiexec="/v/bin/mpirun", library="Open MPI v5.0.11, package: Open MPI")
OMPI4 = MpiInfo(flavour="openmpi", mpiexec="/usr/bin/mpirun", library="Open MPI v4.1.4, package: Debian")
BASE = Launch(argv=["/v/bin/mpirun", "-n", "2", "-H", "a:1,b:1", "-x", "DDL_VERBOSE", "python", "t.py"], env={},
              notes=[])


def test_open_mpi_without_rdma_leaves_ucx_one_sided_out_and_forwards_it() -> None:
    out = with_open_mpi_settings(BASE, mpi=OMPI5, base_env={}, rdma_devices=False, hosts_given=True)
    assert out.env["OMPI_MCA_osc"] == "^ucx"
    assert out.argv[:5] == ["/v/bin/mpirun", "-n", "2", "-x", "OMPI_MCA_osc"] and out.argv[-2:] == ["python", "t.py"]
    assert any("OSC UCX component priority" in note for note in out.notes)


@pytest.mark.parametrize("env", [{"OMPI_MCA_osc": "ucx"}, {"OMPI_MCA_pml": "ucx"}])
def test_the_users_ucx_choice_and_rdma_devices_keep_ucx(env: dict[str, str]) -> None:
    assert "OMPI_MCA_osc" not in with_open_mpi_settings(BASE, mpi=OMPI5, base_env=env, rdma_devices=False,
                                                        hosts_given=True).env
    assert "OMPI_MCA_osc" not in with_open_mpi_settings(BASE, mpi=OMPI5, base_env={}, rdma_devices=True,
                                                        hosts_given=True).env


def test_mpich_launches_are_unchanged() -> None:
    assert with_open_mpi_settings(BASE, mpi=MPICH, base_env={}, rdma_devices=False, hosts_given=True) == BASE


def test_the_ignored_orte_hostfile_is_noted_under_open_mpi_5_only() -> None:
    env = {"OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile"}
    five = with_open_mpi_settings(BASE, mpi=OMPI5, base_env=env, rdma_devices=False, hosts_given=True)
    four = with_open_mpi_settings(BASE, mpi=OMPI4, base_env=env, rdma_devices=False, hosts_given=True)
    assert any("Open MPI 5 ignores OMPI_MCA_orte_default_hostfile" in n for n in five.notes)
    assert not any("ignores" in n for n in four.notes)


# -- the world check's one-host trap ---------------------------------------------------------------

TRAP = JobEnv(hostfiles=(("OMPI_MCA_orte_default_hostfile", "/etc/mpi/hostfile"),))


def test_the_open_mpi_5_one_host_world_is_refused_naming_the_trap() -> None:
    message = one_host_refusal(["train-launcher"] * 3, TRAP, library="Open MPI v5.0.11, package: x",
                               read=lambda p: OPERATOR_OPENMPI.replace("slots=2", "slots=1") +
                               "train-worker-2.train.default.svc slots=1\n")
    assert message is not None
    for words in ("all 3 ranks on one host (train-launcher)", "spreads 3 ranks over 3 hosts",
                  "Open MPI v5.0.11 ignores the ORTE variables", "Nothing was trained", "`ddlrun`",
                  "mpirun --hostfile /etc/mpi/hostfile", "PRTE_MCA_prte_default_hostfile=/etc/mpi/hostfile",
                  "unset OMPI_MCA_orte_default_hostfile"):
        assert words in message, words


@pytest.mark.parametrize(("hostnames", "job", "library", "text"), [
    (["w0", "w1"], TRAP, "Open MPI v5.0.11", OPERATOR_OPENMPI),                       # spread: fine
    (["l", "l"], TRAP, "Open MPI v4.1.4", OPERATOR_OPENMPI),                          # ORTE honoured: intended
    (["l", "l"], TRAP, "MPICH Version: 5.0.2", OPERATOR_OPENMPI),                     # not Open MPI's variable
    (["l", "l"], TRAP, "Open MPI v5.0.11", OPERATOR_OPENMPI.replace("slots=2", "slots=4")),  # fits one worker
    (["l", "l"], TRAP, "Open MPI v5.0.11", "w0\nw1\n"),                               # counts unknown
    (["l", "l"], TRAP, "Open MPI v5.0.11", None),                                     # unreadable
    (["l"], TRAP, "Open MPI v5.0.11", OPERATOR_OPENMPI),                              # a world of one
    (["l", "l"], JobEnv(hostfiles=(*TRAP.hostfiles, ("PRTE_MCA_prte_default_hostfile", "/h"))),
     "Open MPI v5.0.11", OPERATOR_OPENMPI),                                           # PRRTE told
    (["l", "l"], JobEnv(), "Open MPI v5.0.11", OPERATOR_OPENMPI),                     # no hostfile variable
])
def test_one_host_worlds_that_are_meant_pass(hostnames: list[str], job: JobEnv, library: str,
                                              text: str | None) -> None:
    assert one_host_refusal(hostnames, job, library=library, read=lambda p: text) is None


def test_the_trap_ignores_comments_and_max_slots() -> None:
    text = "# workers\nw0 slots=1 max_slots=1\nw1:1\n"
    assert one_host_refusal(["l", "l"], TRAP, library="Open MPI v5.0.3", read=lambda p: text) is not None


def test_the_probe_runs_ssh_with_batch_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    from ddl.launcher import readiness

    calls: list[list[str]] = []

    def run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 255, "", "ssh: connect to host h port 22: Connection refused")

    monkeypatch.setattr(readiness.socket, "getaddrinfo", lambda *a, **k: [])
    monkeypatch.setattr(readiness.shutil, "which", lambda name: "/usr/bin/ssh")
    monkeypatch.setattr(readiness.subprocess, "run", run)
    probe = readiness.probe_host("h", ssh=["ssh", "-o", "BatchMode=yes"], local=False)
    assert probe.reach is Reach.NO_SSH and calls == [["ssh", "-o", "BatchMode=yes", "h", "true"]]
    assert readiness.probe_host("h", ssh=["ssh"], local=True).reach is Reach.READY and len(calls) == 1
    assert readiness.probe_host("h", ssh=None, local=False).reach is Reach.READY and len(calls) == 1


def test_platforms_reads_the_hostfile_hosts(tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(OPERATOR_OPENMPI)
    pod = platforms.mpijob_hosts(job_from_env({"K_MPI_JOB_ROLE": "launcher",
                                               "OMPI_MCA_orte_default_hostfile": str(hostfile)}))
    assert pod is not None and pod.hosts == (HostSlots("train-worker-0.train.default.svc", 2),
                                             HostSlots("train-worker-1.train.default.svc", 2))
