"""Every benchmark is tooling (tools/bench, the ddl-bench package), not part of the ddl wheel, and
``ddl bench allreduce|startup|rehearsal|torch|tensorflow`` still reach them, or say how to get them."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib

from ddl.tools import cli

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_holds_no_benchmark_module() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = project["tool"]["setuptools"]["packages"]
    folders = project["tool"]["setuptools"]["package-dir"]
    assert [name for name in packages if "bench" in name] == []
    found = []
    for package in packages:  # what the wheel ships: each listed package's own .py files
        for path in (ROOT / folders[package]).glob("*.py"):
            text = path.read_text()
            if path.stem.startswith("bench") or path.stem in ("resnet", "peers", "allreduce", "startup", "rehearsal") \
                    or "DistributedDataParallel(" in text or "MultiWorkerMirroredStrategy(" in text \
                    or 'prog="ddl bench' in text:
                found.append(str(path.relative_to(ROOT)))
    assert found == []
    entry_points = project["project"].get("entry-points", {})
    assert "ddl.commands" not in entry_points and "ddl.peers" not in entry_points


def test_the_tooling_package_registers_the_commands_and_the_peer() -> None:
    tooling = tomllib.loads((ROOT / "tools" / "bench" / "pyproject.toml").read_text())
    commands = tooling["project"]["entry-points"]["ddl.commands"]
    assert {tuple(words.split()) for words in commands} == set(cli.TOOLING)
    for words, target in commands.items():
        module = target.split(":")[0].replace(".", "/")
        assert (ROOT / "tools" / "bench" / f"{module}.py").is_file(), target
        extra = cli.TOOLING[tuple(words.split())]
        assert target.endswith(f"[{extra}]") if extra else "[" not in target, target  # core-only: no extra
    assert "torch-gloo" in tooling["project"]["entry-points"]["ddl.peers"]


@pytest.mark.parametrize("words", sorted(cli.TOOLING))
def test_a_benchmark_that_is_not_installed_says_which_package_and_extra_bring_it(
        words: tuple[str, ...], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli, "registered", dict)
    assert cli.main([*words, "--ranks", "1"]) == 2
    err = capsys.readouterr().err
    assert f"ddl {' '.join(words)} is a benchmark of the ddl-bench tooling package" in err
    extra = cli.TOOLING[words]
    assert (f"pip install './tools/bench[{extra}]'" if extra else "pip install ./tools/bench (") in err
    help_text = cli.overview({})
    assert f"  {' '.join(words)} " in help_text and "not installed: pip install" in help_text


def test_from_this_checkout_ddl_bench_torch_reaches_the_tooling_package(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    assert ("bench", "torch") in cli.registered(), "scripts/setup-env.sh installs tools/bench"
    with pytest.raises(SystemExit) as done:
        cli.main(["bench", "torch", "--help"])
    assert done.value.code == 0
    assert "usage: ddl bench torch" in capsys.readouterr().out


def test_from_this_checkout_ddl_bench_allreduce_reaches_the_tooling_package(capsys: pytest.CaptureFixture[str]) -> None:
    for words in (("bench", "allreduce"), ("bench", "startup"), ("bench", "rehearsal")):
        assert words in cli.registered(), "scripts/setup-env.sh installs tools/bench"
        with pytest.raises(SystemExit) as done:
            cli.main([*words, "--help"])
        assert done.value.code == 0
        assert f"usage: ddl {' '.join(words)}" in capsys.readouterr().out


def test_ddl_bench_allreduce_np_needs_a_whole_number(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "allreduce", "-np", "two"]) == 2
    assert "ddl bench allreduce: -np needs a whole number of ranks, e.g. -np 2" in capsys.readouterr().err


def test_a_tooling_benchmark_whose_framework_is_missing_says_to_install_the_folder_with_its_extra(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    entry = cli.registered()[("bench", "torch")]

    def missing(self: object) -> None:
        raise ImportError("No module named 'torch'")

    monkeypatch.setattr(type(entry), "load", missing)
    assert cli.main(["bench", "torch", "--ranks", "1"]) == 2
    err = capsys.readouterr().err
    assert "ddl bench torch needs the torch extra (No module named 'torch'); pip install './tools/bench[torch]'" in err


def test_a_plugin_with_no_extra_that_fails_to_import_says_what_without_an_empty_extra(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    entry = cli.registered()[("bench", "allreduce")]
    assert not entry.extras

    def missing(self: object) -> None:
        raise ImportError("No module named 'ddl_bench.args'")

    monkeypatch.setattr(type(entry), "load", missing)
    assert cli.main(["bench", "allreduce"]) == 2
    err = capsys.readouterr().err
    assert ("ddl bench allreduce needs a module its package did not install (No module named 'ddl_bench.args'); "
            "pip install ./tools/bench") in err, err


@pytest.mark.parametrize(("words", "args", "said"), [
    (["bench", "allreduce"], ["--rounds", "0"], "--rounds: takes a whole number of at least 1, got 0"),
    (["bench", "allreduce"], ["-np", "2", "--budget", "0"], "--budget: takes a number greater than 0, got 0"),
    (["bench", "allreduce"], ["--fused", "-1"], "--fused: takes a whole number of at least 0, got -1"),
    (["bench", "startup"], ["--rounds", "x"], "--rounds: takes a whole number, got 'x'"),
    (["bench", "rehearsal"], ["-np", "2", "--rounds", "0"], "--rounds: takes a whole number of at least 1"),
    (["bench", "torch"], ["--steps", "0"], "--steps: takes a whole number of at least 1, got 0"),
    (["bench", "torch"], ["--cnn-step-ms", "nan"], "--cnn-step-ms: takes a finite number, got nan"),
    (["bench", "tensorflow"], ["--batch", "0"], "--batch: takes a whole number of at least 1, got 0"),
])
def test_a_benchmark_refuses_a_count_out_of_range_before_anything_runs(
        words: list[str], args: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    # --rounds 0 ran every rank to a StatisticsError from inside the timing (6 s, exit 1).
    with pytest.raises(SystemExit) as stop:
        cli.main([*words, *args])
    assert stop.value.code == 2
    assert said in capsys.readouterr().err
