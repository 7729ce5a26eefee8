"""ddlrun: the pure command builder, host lists, the CLI's checks, and one real launch."""

from __future__ import annotations

import io
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from ddl.launcher import cli
from ddl.launcher import mpi as mpi_module
from ddl.launcher.command import (
    FLAGGED,
    YIELD_VARIABLES,
    Launch,
    LaunchError,
    LaunchOptions,
    MpiInfo,
    build_launch,
    ddl_environment,
    flavour_from_version,
    validate_options,
)
from ddl.launcher.hosts import (
    HostListError,
    HostSlots,
    format_host_list,
    parse_host_list,
    parse_hostfile,
    ranks_per_host,
    read_hostfile,
)
from ddl.launcher.watch.server import WatchServer

MPICH = MpiInfo(flavour="mpich", mpiexec="/venv/bin/mpiexec", library="MPICH Version: 4.2.0")
OPENMPI = MpiInfo(flavour="openmpi", mpiexec="/opt/ompi/bin/mpiexec", library="Open MPI v5.0.3")
PYTHON = "/venv/bin/python3.11"
MPICH_YIELD = "MPIR_CVAR_ENABLE_HEAVY_YIELD"
OMPI_YIELD = "OMPI_MCA_mpi_yield_when_idle"


def launch(
    mpi: MpiInfo = MPICH,
    *,
    cpu_count: int = 8,
    base_env: dict[str, str] | None = None,
    is_root: bool = False,
    **options: Any,
) -> Launch:
    options.setdefault("np", 2)
    options.setdefault("command", ("./train", "--epochs", "1"))
    return build_launch(
        LaunchOptions(**options),
        mpi=mpi,
        cpu_count=cpu_count,
        base_env={} if base_env is None else base_env,
        python_executable=PYTHON,
        is_root=is_root,
    )


# -- command lines -------------------------------------------------------------------


def test_mpich_local_command_line_and_full_environment() -> None:
    result = launch(np=4, base_env={"PATH": "/bin", "HOME": "/h"})
    assert result.argv == ["/venv/bin/mpiexec", "-n", "4", "./train", "--epochs", "1"]
    assert result.env == {"PATH": "/bin", "HOME": "/h"}
    assert any("mpich" in note and "/venv/bin/mpiexec" in note for note in result.notes)


def test_openmpi_local_command_line() -> None:
    assert launch(OPENMPI, np=3).argv == ["/opt/ompi/bin/mpiexec", "-n", "3", "./train", "--epochs", "1"]


def test_openmpi_as_root_allows_it() -> None:
    result = launch(OPENMPI, is_root=True)
    assert result.argv[:4] == ["/opt/ompi/bin/mpiexec", "-n", "2", "--allow-run-as-root"]
    assert any("root" in note for note in result.notes)
    assert "--allow-run-as-root" not in launch(MPICH, is_root=True).argv


def test_mpich_hosts_pass_ddl_variables_with_genv() -> None:
    hosts = parse_host_list("h1:2,h2:2")
    result = launch(np=4, hosts=hosts, topology="2x2", base_env={"DDL_HOSTNAME": "x", "PATH": "/bin"})
    assert result.argv == [
        "/venv/bin/mpiexec", "-n", "4", "-hosts", "h1:2,h2:2",
        "-genv", "DDL_HOSTNAME", "x", "-genv", "DDL_TOPOLOGY", "2x2",
        "./train", "--epochs", "1",
    ]


def test_a_supervised_world_is_left_to_its_supervisor_wherever_the_other_flags_go() -> None:
    """``-disable-auto-cleanup`` is build_launch's to place (ddlrun --elastic's worlds), among the
    MPI flags, whatever else the launch adds (oversubscription, hosts)."""
    hosts = parse_host_list("h1:4,h2:4")
    for extra in ({}, {"hosts": hosts}, {"hosts": hosts, "np": 8}):
        argv = launch(cpu_count=2, supervised=True, **extra).argv  # type: ignore[arg-type]
        assert argv.count("-disable-auto-cleanup") == 1 and argv.index("-disable-auto-cleanup") < argv.index("./train")
        assert "-disable-auto-cleanup" not in launch(cpu_count=2, **extra).argv  # type: ignore[arg-type]
    with pytest.raises(LaunchError, match="needs MPICH's hydra"):
        launch(OPENMPI, supervised=True)


def test_openmpi_hosts_pass_variables_with_x() -> None:
    hosts = parse_host_list("h1:2,h2:2")
    result = launch(OPENMPI, np=4, cpu_count=1, hosts=hosts, algorithm="ring", verbose=True)
    assert result.argv == [
        "/opt/ompi/bin/mpiexec", "-n", "4", "--oversubscribe", "-H", "h1:2,h2:2",
        "-x", "DDL_ALGORITHM", "-x", "DDL_VERBOSE", "-x", OMPI_YIELD,
        "./train", "--epochs", "1",
    ]
    assert result.env[OMPI_YIELD] == "1"


def test_mpich_hosts_forward_the_yield_variable() -> None:
    result = launch(np=4, cpu_count=2, hosts=parse_host_list("a:3,b:1"))
    argv = result.argv
    i = argv.index(MPICH_YIELD)
    assert argv[i - 1 : i + 2] == ["-genv", MPICH_YIELD, "1"]


def test_no_host_flags_without_hosts() -> None:
    argv = launch(OPENMPI, topology="2", verbose=True).argv
    assert "-x" not in argv and "-H" not in argv
    argv = launch(MPICH, topology="2", verbose=True).argv
    assert "-genv" not in argv and "-hosts" not in argv


# -- python -> ddlrun's interpreter ---------------------------------------------------


@pytest.mark.parametrize("word", ["python", "python3"])
def test_python_becomes_ddlruns_interpreter(word: str) -> None:
    result = launch(command=(word, "train.py", "python"))
    assert result.argv[-3:] == [PYTHON, "train.py", "python"]
    assert any(PYTHON in note and repr(word) in note for note in result.notes)


@pytest.mark.parametrize("word", ["python3.11", "/usr/bin/python", "ipython", "./python"])
def test_other_commands_are_kept_as_written(word: str) -> None:
    result = launch(command=(word, "train.py"))
    assert result.argv[-2:] == [word, "train.py"]
    assert not any("interpreter" in note for note in result.notes)


# -- flags -> DDL_* through the one table --------------------------------------------


VALUES: dict[str, Any] = {
    "topology": "2", "algorithm": "ring", "segment_bytes": 4096, "verbose": True,
    "timeline": "trace.json", "fusion_threshold": 0, "stall_timeout": 2.5,
    "calibration": "calib.json", "shm_bytes": 1 << 16, "cycle_time": 5, "join_average": "contributors",
    "init_timeout": 30, "auto_trials": "off", "shared_negotiation": "off",
}
# ddlrun flag (its field) -> the variable it sets, from the settings table.
LAUNCHER_FLAGS = {field: row.env for field, row in FLAGGED.items()}


def test_every_launcher_flag_is_an_option_and_a_parser_dest() -> None:
    for field in LAUNCHER_FLAGS:
        assert LaunchOptions(np=1, command=("x",), **{field: VALUES[field]}).settings == {field: VALUES[field]}
    dests = set(vars(cli.build_parser().parse_args(["-np", "1", "x"])))
    assert set(LAUNCHER_FLAGS) <= dests
    assert set(VALUES) == set(LAUNCHER_FLAGS)


def test_every_setting_that_ranks_agree_on_has_a_flag_and_help_lists_every_algorithm() -> None:
    from ddl.base.config import SETTINGS
    from ddl.reduction.algorithms import NAMES

    assert {s.field for s in SETTINGS if s.agreed} <= set(FLAGGED)
    action = next(a for a in cli.build_parser()._actions if a.dest == "algorithm")
    assert all(name in str(action.help) for name in NAMES), action.help
    with pytest.raises(TypeError, match="unknown settings"):
        LaunchOptions(np=1, command=("x",), hostname="h")


@pytest.mark.parametrize("flag", sorted(LAUNCHER_FLAGS))
def test_each_flag_sets_its_variable(flag: str) -> None:
    result = launch(**{flag: VALUES[flag]})
    expected = "1" if VALUES[flag] is True else str(VALUES[flag])
    assert result.env == {LAUNCHER_FLAGS[flag]: expected}
    assert any(str(FLAGGED[flag].flag) in note for note in result.notes)


def test_unset_flags_set_nothing_and_keep_the_users_variables() -> None:
    options = LaunchOptions(np=2, command=("x",))
    assert ddl_environment(options) == {}
    env = launch(base_env={"DDL_TOPOLOGY": "2", "DDL_VERBOSE": "0"}).env
    assert env == {"DDL_TOPOLOGY": "2", "DDL_VERBOSE": "0"}


def test_flags_win_over_the_users_variables() -> None:
    env = launch(topology="2x1", verbose=True, base_env={"DDL_TOPOLOGY": "1x2", "DDL_VERBOSE": "0"}).env
    assert env == {"DDL_TOPOLOGY": "2x1", "DDL_VERBOSE": "1"}


def test_base_env_is_not_modified() -> None:
    base = {"A": "1"}
    launch(np=8, cpu_count=1, topology="8", base_env=base)
    assert base == {"A": "1"}


# -- oversubscription ----------------------------------------------------------------


@pytest.mark.parametrize("mpi", [MPICH, OPENMPI], ids=["mpich", "openmpi"])
@pytest.mark.parametrize("np", [1, 2])
def test_not_oversubscribed_up_to_the_core_count(mpi: MpiInfo, np: int) -> None:
    result = launch(mpi, np=np, cpu_count=2)
    assert YIELD_VARIABLES[mpi.flavour] not in result.env
    assert "--oversubscribe" not in result.argv
    assert not any("oversubscribed" in note for note in result.notes)


def test_mpich_oversubscribed_sets_heavy_yield() -> None:
    result = launch(np=4, cpu_count=2)
    assert result.env == {MPICH_YIELD: "1"}
    assert result.argv == ["/venv/bin/mpiexec", "-n", "4", "./train", "--epochs", "1"]
    note = next(n for n in result.notes if "oversubscribed" in n)
    assert "4 ranks" in note and "2 cores" in note and f"{MPICH_YIELD}=1" in note


def test_openmpi_oversubscribed_adds_flag_and_yield() -> None:
    result = launch(OPENMPI, np=4, cpu_count=2)
    assert result.env == {OMPI_YIELD: "1"}
    assert result.argv[:4] == ["/opt/ompi/bin/mpiexec", "-n", "4", "--oversubscribe"]
    assert any("--oversubscribe" in note for note in result.notes)


@pytest.mark.parametrize("mpi", [MPICH, OPENMPI], ids=["mpich", "openmpi"])
def test_users_yield_setting_is_respected(mpi: MpiInfo) -> None:
    variable = YIELD_VARIABLES[mpi.flavour]
    result = launch(mpi, np=4, cpu_count=2, base_env={variable: "0"})
    assert result.env[variable] == "0"
    assert any(f"keeping your {variable}=0" in note for note in result.notes)


@pytest.mark.parametrize(
    ("hosts", "np", "oversubscribed"),
    [("a:2,b:2", 4, False), ("a:3,b:1", 4, True), ("a:4,b:4", 2, False), ("a:1,b:8", 3, False)],
)
def test_multi_host_uses_the_busiest_host(hosts: str, np: int, oversubscribed: bool) -> None:
    result = launch(np=np, cpu_count=2, hosts=parse_host_list(hosts))
    assert (MPICH_YIELD in result.env) is oversubscribed


# -- validation ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"np": 0}, ["-np 0", "at least 1"]),
        ({"command": ()}, ["no COMMAND"]),
        ({"np": 5, "hosts": (HostSlots("a", 2), HostSlots("b", 2))}, ["-np 5", "give 4", "a:2,b:2"]),
        ({"np": 4, "topology": "3x2"}, ["'3x2'", "6", "-np is 4"]),
        ({"np": 4, "topology": "2y2"}, ["--topology", "malformed"]),
        ({"algorithm": "tree"}, ["--algorithm", "'tree'", "multiring"]),
        ({"segment_bytes": 0}, ["--segment-bytes 0", "DDL_SEGMENT_BYTES", "at least 1"]),
        ({"fusion_threshold": -1}, ["--fusion-threshold -1", "at least 0"]),
        ({"stall_timeout": 0.0}, ["--stall-timeout 0.0", "positive"]),
    ],
)
def test_inconsistent_options_are_refused(options: dict[str, Any], words: list[str]) -> None:
    fields: dict[str, Any] = {"np": 2, "command": ("x",), **options}
    with pytest.raises(LaunchError) as info:
        validate_options(LaunchOptions(**fields))
    for word in words:
        assert word in str(info.value)
    with pytest.raises(LaunchError):
        launch(**options)


def test_matching_topology_and_known_algorithm_pass() -> None:
    validate_options(LaunchOptions(np=6, command=("x",), topology="r:3x2", algorithm="multiring"))


@pytest.mark.parametrize(
    ("text", "flavour"),
    [
        ("MPICH Version:      4.2.0\nMPICH Release date: ...", "mpich"),
        ("Open MPI v5.0.3, package: Open MPI", "openmpi"),
        ("MVAPICH Version: 3.0", "mpich"),
        ("Intel(R) MPI Library 2021.10 for Linux", "mpich"),
    ],
)
def test_flavour_from_version(text: str, flavour: str) -> None:
    assert flavour_from_version(text) == flavour


def test_unknown_mpi_library_is_refused() -> None:
    with pytest.raises(LaunchError, match="Microsoft MPI"):
        flavour_from_version("Microsoft MPI 10.1")


# -- hosts and hostfiles -------------------------------------------------------------


def test_parse_host_list() -> None:
    assert parse_host_list("h1:2,h2:2") == (HostSlots("h1", 2), HostSlots("h2", 2))
    assert parse_host_list(" h1 , h2:3 ") == (HostSlots("h1", 1), HostSlots("h2", 3))
    assert parse_host_list("a:1,b:2,a:2") == (HostSlots("a", 3), HostSlots("b", 2))
    assert format_host_list(parse_host_list("h1:2,h2")) == "h1:2,h2:1"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", ["names no host"]),
        ("h1:2,,h2", ["empty entry"]),
        ("h1:two", ["'two'", "whole number"]),
        ("h1:0", ["slot count 0"]),
        (":2", ["no valid host name"]),
    ],
)
def test_bad_host_lists(text: str, words: list[str]) -> None:
    with pytest.raises(HostListError) as info:
        parse_host_list(text)
    for word in words:
        assert word in str(info.value)


def test_parse_hostfile_formats_comments_and_blanks() -> None:
    text = "# cluster\n\nnode1:2\nnode2 slots=4   # big one\n  node3  \nnode1\n"
    assert parse_hostfile(text, source="hosts") == (
        HostSlots("node1", 3), HostSlots("node2", 4), HostSlots("node3", 1)
    )


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("a:2\nb slots=x\n", 2, ["'x'"]),
        ("a\n\n# c\nb c d\n", 4, ["'b c d'", "host slots=SLOTS"]),
        ("a max_slots=2\n", 1, ["'a max_slots=2'"]),
        ("a:-1\n", 1, ["slot count -1"]),
    ],
)
def test_bad_hostfile_lines_name_file_and_line(text: str, line: int, words: list[str]) -> None:
    with pytest.raises(HostListError) as info:
        parse_hostfile(text, source="my.hosts")
    message = str(info.value)
    assert f"hostfile my.hosts line {line}:" in message
    for word in words:
        assert word in message


def test_empty_hostfile_is_refused() -> None:
    with pytest.raises(HostListError, match="my.hosts lists no host"):
        parse_hostfile("# nothing\n\n", source="my.hosts")


def test_read_hostfile(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    path.write_text("a slots=2\nb:2\n")
    assert read_hostfile(path) == (HostSlots("a", 2), HostSlots("b", 2))
    with pytest.raises(HostListError, match="cannot read hostfile .*missing.*--hostfile"):
        read_hostfile(tmp_path / "missing")


def test_ranks_per_host_fills_slots_in_order() -> None:
    hosts = parse_host_list("a:2,b:3,c:1")
    assert ranks_per_host(hosts, 6) == (2, 3, 1)
    assert ranks_per_host(hosts, 4) == (2, 2, 0)
    assert ranks_per_host(hosts, 1) == (1, 0, 0)


# -- the CLI, without launching ------------------------------------------------------


class FakePopen:
    """Stands in for subprocess.Popen of mpiexec: records the launch, exits at once with ``returncode``."""

    launched: list[FakePopen] = []
    returncode = 0

    def __init__(self, argv: list[str], *, env: dict[str, str], **kwargs: object) -> None:
        self.argv, self.env = argv, env
        self.pid = 1 << 22  # no such process
        self.stdout, self.stderr = io.BytesIO(), io.BytesIO()
        FakePopen.launched.append(self)

    def poll(self) -> int:
        return FakePopen.returncode

    def wait(self, timeout: float | None = None) -> int:
        return FakePopen.returncode

    def send_signal(self, signum: int) -> None:
        raise AssertionError("no signal expected")


#: What ddlrun puts before every rank's command: its keeper (ddl.launcher.watch).
KEEPER = [sys.executable, "-m", "ddl.launcher.watch.keeper", "--"]


@pytest.fixture
def fake_mpi(monkeypatch: pytest.MonkeyPatch) -> type[FakePopen]:
    FakePopen.launched = []
    FakePopen.returncode = 0
    monkeypatch.setattr(cli, "detect_mpi", lambda **_: MPICH)
    monkeypatch.setattr(subprocess, "Popen", FakePopen)
    monkeypatch.setattr(cli.socket, "getaddrinfo", lambda *a, **k: [])  # made-up host names resolve
    return FakePopen


@pytest.fixture
def no_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("nothing may be started")

    monkeypatch.setattr(cli, "detect_mpi", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)


def test_topology_mismatch_fails_at_once(no_launch: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["-np", "4", "--topology", "3x2", "python", "train.py"]) == 2
    err = capsys.readouterr().err
    assert "ddlrun: error: --topology '3x2' multiplies to 6 but -np is 4" in err


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["-np", "2"], ["no COMMAND", "usage:"]),
        (["python", "train.py"], ["-np"]),
        (["-np", "0", "x"], ["-np 0"]),
        (["-np", "2", "--algorithm", "tree", "x"], ["'tree'"]),
        (["-np", "5", "-H", "a:2,b:2", "x"], ["give 4"]),
        (["-np", "2", "-H", "a:0", "x"], ["slot count 0"]),
        (["-np", "2", "-H", "a", "--hostfile", "f", "x"], ["not allowed with"]),
        (["-np", "2", "--hostfile", "/nonexistent/hosts", "x"], ["cannot read hostfile"]),
    ],
)
def test_usage_errors_exit_2_without_launching(
    no_launch: None, capsys: pytest.CaptureFixture[str], argv: list[str], words: list[str]
) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    for word in words:
        assert word in err


def test_host_that_does_not_resolve_fails_before_launching(
    no_launch: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert cli.main(["-np", "4", "-H", "localhost:2,nosuchhost.invalid:2", "python", "t.py"]) == 2
    assert "host 'nosuchhost.invalid' does not resolve" in capsys.readouterr().err
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\nno-such-host.invalid slots=2\n")
    assert cli.main(["-np", "4", "--hostfile", str(hostfile), "python", "t.py"]) == 2
    assert "'no-such-host.invalid' does not resolve" in capsys.readouterr().err
    cli.check_resolvable(parse_host_list("localhost:2"))  # a real name passes


def test_cli_runs_the_built_launch(fake_mpi: type[FakePopen], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["-np", "2", "--verbose", "--topology", "2", "python", "-c", "print(1)"]) == 0
    (child,) = fake_mpi.launched
    assert child.argv == ["/venv/bin/mpiexec", "-n", "2", *KEEPER, sys.executable, "-c", "print(1)"]
    assert child.env["DDL_TOPOLOGY"] == "2" and child.env["DDL_VERBOSE"] == "1"
    assert re.fullmatch(r"127\.0\.0\.1:\d+/[0-9a-f]{16}", child.env["DDL_MONITOR"])
    assert child.env.get("PATH") == os.environ.get("PATH")
    err = capsys.readouterr().err
    assert f"ddlrun: running {shlex.join(child.argv)}" in err
    assert "DDL_TOPOLOGY=2 (from --topology)" in err and sys.executable in err


def test_cli_is_quiet_without_verbose(fake_mpi: type[FakePopen], capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "train").write_text("#!/bin/sh\n")
    (tmp_path / "train").chmod(0o755)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["-np", "1", "--", "./train"]) == 0
    assert fake_mpi.launched[0].argv == ["/venv/bin/mpiexec", "-n", "1", *KEEPER, "./train"]
    assert capsys.readouterr().err == ""


def test_cli_passes_a_hostfile_like_hosts(fake_mpi: type[FakePopen], tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("n1 slots=2\nn2:2\n")
    assert cli.main(["-np", "4", "--hostfile", str(hostfile), "true"]) == 0
    argv = fake_mpi.launched[0].argv
    assert argv[argv.index("-hosts") + 1] == "n1:2,n2:2"


@pytest.mark.parametrize(("code", "status"), [(0, 0), (3, 3), (-signal.SIGTERM, 128 + signal.SIGTERM)])
def test_cli_returns_the_job_status(fake_mpi: type[FakePopen], code: int, status: int) -> None:
    fake_mpi.returncode = code
    assert cli.main(["-np", "1", "true"]) == status


def test_missing_mpiexec_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli.sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    # A stand-in library: importing mpi4py.MPI here without MPI_Init would break later ddl.init() calls.
    library = mpi_module.MpiLibrary(flavour="mpich", version="MPICH Version: 4.2", path=str(tmp_path / "lib" / "libmpi.so.12"),
                                    standard="4.1", mpi4py_version="4.1", mpi4py_extension="", mpi4py_build={})
    monkeypatch.setattr(mpi_module, "load_library", lambda: library)
    assert cli.main(["-np", "1", "/bin/sh"]) == 127
    assert "pip install mpich" in capsys.readouterr().err


def test_run_forwards_sigterm_to_the_child_and_restores_the_handlers() -> None:
    child = Launch(argv=[sys.executable, "-c", "import time; time.sleep(20)"], env=dict(os.environ), notes=[])
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        assert cli.run_launch(child, WatchServer(), np=1, tagged=True, log_dir=None) == 128 + signal.SIGTERM
    finally:
        timer.cancel()
    after = {sig: signal.getsignal(sig) for sig in before}
    assert after == before, f"ddlrun left its forwarding handlers in place: {after} (were {before})"


# -- one real launch -----------------------------------------------------------------


def _ddlrun(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDL_")}
    return subprocess.run(
        [sys.executable, "-m", "ddl.launcher.cli", *args],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )


needs_mpi = pytest.mark.skipif(
    not (Path(sys.executable).parent / "mpiexec").exists() and shutil.which("mpiexec") is None,
    reason="no mpiexec: pip install mpich",
)


@pytest.mark.mpi
@needs_mpi
def test_real_launch_of_two_ranks() -> None:
    code = "import ddl; ddl.init(); print(f'rank {ddl.rank()} size {ddl.size()}', flush=True)"
    result = _ddlrun("-np", "2", sys.executable, "-c", code)
    assert result.returncode == 0, result.stderr
    # mpiexec forwards each rank's output in chunks, so lines of two ranks may run together
    reports = sorted(re.findall(r"rank (\d+) size (\d+)", result.stdout))
    assert reports == [("0", "2"), ("1", "2")], result.stdout


@pytest.mark.mpi
@needs_mpi
def test_real_launch_fails_when_one_rank_fails() -> None:
    code = "import sys, ddl; ddl.init(); sys.exit(3 if ddl.rank() == 1 else 0)"
    result = _ddlrun("-np", "2", "python", "-c", code)
    assert result.returncode != 0, result.stderr
