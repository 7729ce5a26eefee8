"""What users type first, answered as they expect: help, versions, misspellings, one machine named twice.

Each test here pins one item of issue 38's "launcher conventions" and fails on the code
before it (``ddl --help`` exited 2 without descriptions, ``ddl plann`` named nothing,
neither command had ``--version``, ``ddlrun -np 2 pyhton x.py`` ended in hydra's
``execvp error``, ``ddl checkpoint --help`` showed reST backticks, ``ddl doctor -np 0``
planned 2 ranks, two entries for one machine failed in ``init``, and ``ddl plan`` printed
two different unsharded steps).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from ddl import __version__
from ddl.base.topology import build_topology, host_keys
from ddl.launcher import cli
from ddl.launcher.command import MpiInfo
from ddl.launcher.hosts import HostSlots, parse_host_list
from ddl.launcher.machines import THIS_MACHINE, is_local_address, machine_of, merge_same_machines
from ddl.launcher.preflight import ProgramNotFound, check_command
from ddl.tools import cli as ddl_cli
from ddl.tools import doctor, plan


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, timeout=120)


def test_ddl_help_lists_every_command_with_what_it_does_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert ddl_cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for words in ddl_cli.COMMANDS:
        line = next((x for x in out.splitlines() if re.match(rf"  {' '.join(words)}  +\S", x)), "")
        assert line and len(line.split()) > len(words) + 3, (words, out)  # a description beside it
    assert "--version" in out


def test_both_commands_say_their_version() -> None:
    assert run("ddl.tools.cli", "--version").stdout.strip() == f"ddl (ddl-runtime) {__version__}"
    done = run("ddl.launcher.cli", "--version")
    assert done.returncode == 0 and done.stdout.strip() == f"ddlrun (ddl-runtime) {__version__}"


@pytest.mark.parametrize(("argv", "meant"), [(["plann"], "ddl plan"), (["bench", "alreduce"], "ddl bench allreduce"),
                                             (["docter", "-np", "2"], "ddl doctor")])
def test_an_unknown_command_is_named_with_the_closest_one(capsys: pytest.CaptureFixture[str], argv: list[str],
                                                          meant: str) -> None:
    assert ddl_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"unknown command {' '.join(a for a in argv[:2] if not a.startswith('-'))!r}" in err
    assert f"did you mean '{meant}'?" in err


def test_help_text_has_no_markup() -> None:
    for module in ("checkpoint", "plan", "doctor", "bench allreduce"):
        done = run("ddl.tools.cli", *module.split(), "--help")
        assert done.returncode == 0, done.stderr
        assert "``" not in done.stdout and ":func:" not in done.stdout and ":mod:" not in done.stdout, done.stdout


def test_doctor_refuses_np_0_as_ddlrun_does(capsys: pytest.CaptureFixture[str]) -> None:
    assert doctor.main(["-np", "0"]) == 1
    out = capsys.readouterr().out
    assert "problem:       -np 0 is not a rank count; give at least 1" in out
    assert "rank(s) on" not in out


def test_plan_prints_one_unsharded_step() -> None:
    argv = ["--topology", "4", "--link", "10GB/s:2us", "--model", "resnet50", "--step-ms", "200", "--update-ms",
            "20", "--optimizer", "adam"]
    lines, record = plan.make_plan(plan.parser().parse_args(argv))
    text = "\n".join(lines)
    step = float(re.search(r"-> step ([\d.]+) ms\n", text).group(1))  # type: ignore[union-attr]
    unsharded = float(re.search(r"vs ([\d.]+) ms unsharded", text).group(1))  # type: ignore[union-attr]
    assert step == unsharded, text
    assert record["step"]["step_s"] == record["sharded_step"]["unsharded_step_s"]


# -- COMMAND checked before anything starts ------------------------------------------------------


def test_a_misspelt_program_or_script_is_refused_with_the_closest_match(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    with pytest.raises(ProgramNotFound, match=r"program 'pyhton' not found on PATH; did you mean 'python'\?"):
        check_command(("pyhton", "train.py"), path_dirs=[], cwd=tmp_path)
    with pytest.raises(ProgramNotFound, match=r"script 'trian.py' not found .*did you mean 'train.py'\?"):
        check_command(("python", "trian.py"), path_dirs=[], cwd=tmp_path)
    check_command(("python", "train.py"), path_dirs=[], cwd=tmp_path)
    check_command(("python", "-c", "pass"), path_dirs=[], cwd=tmp_path)
    check_command(("sh", "-c", "true"), path_dirs=["/bin", "/usr/bin"], cwd=tmp_path)


def test_ddlrun_refuses_a_misspelt_program_before_finding_mpi(monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli, "detect_mpi", lambda **_: pytest.fail("nothing may be started"))
    assert cli.main(["-np", "2", "pyhton", "x.py"]) == 127
    assert "did you mean 'python'?" in capsys.readouterr().err


# -- two entries, one machine ---------------------------------------------------------------------


def test_entries_naming_this_machine_are_one_host() -> None:
    assert is_local_address("127.0.0.1") and is_local_address("::1") and not is_local_address("192.0.2.1")
    assert machine_of("localhost") == THIS_MACHINE and machine_of("127.0.0.1") == THIS_MACHINE
    merged, said = merge_same_machines(parse_host_list("localhost:1,127.0.0.1:1"))
    assert merged == (HostSlots("localhost", 2),)
    assert "hosts localhost, 127.0.0.1 are this machine" in said[0]
    far = {"a": frozenset({"10.0.0.1"}), "a-alias": frozenset({"10.0.0.1"}), "b": frozenset({"10.0.0.2"})}
    merged, _ = merge_same_machines(parse_host_list("a:2,b:2,a-alias:1"),
                                    machine=lambda n: machine_of(n, lookup=far.__getitem__, local=lambda a: False))
    assert merged == (HostSlots("a", 3), HostSlots("b", 2))
    untouched = parse_host_list("a:2,b:2")
    assert merge_same_machines(untouched, machine=lambda n: n) == (untouched, [])


def test_ddlrun_runs_two_entries_for_this_machine_as_one_host(monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    launched: list[list[str]] = []
    monkeypatch.setattr(cli, "detect_mpi", lambda **_: MpiInfo(flavour="mpich", mpiexec="/v/bin/mpiexec"))
    monkeypatch.setattr(cli, "run_launch", lambda launch, *a, **k: launched.append(launch.argv) or 0)
    assert cli.main(["-np", "2", "-H", "localhost:1,127.0.0.1:1", "python", "-c", "pass"]) == 0
    (argv,) = launched
    assert argv[argv.index("-hosts") + 1] == "localhost:2", argv
    assert "ddlrun: note: hosts localhost, 127.0.0.1 are this machine" in capsys.readouterr().err


def test_ranks_on_one_host_name_but_two_mpi_nodes_are_two_hosts() -> None:
    keys = host_keys([("vm", 0), ("vm", 1)])
    assert keys == ["vm#0", "vm#1"]
    topo = build_topology(0, keys)
    assert topo.local_size == 1 and topo.cross_size == 2  # no shared memory assumed between them
    assert host_keys([("a", 0), ("a", 0), ("b", 2)]) == ["a", "a", "b"]
