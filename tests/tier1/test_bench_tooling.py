"""The framework benchmarks are tooling (tools/bench, the ddl-bench package), not part of the ddl wheel,
and ``ddl bench torch|tensorflow`` still reach them, or say how to get them."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib

from ddl.tools import cli

ROOT = Path(__file__).resolve().parents[2]


def test_no_benchmark_module_is_in_the_packages_the_wheel_ships() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    folders = project["tool"]["setuptools"]["package-dir"]
    assert not any("bench" in name for name in project["tool"]["setuptools"]["packages"] if name != "ddl.tools.bench")
    found = []
    for package, folder in folders.items():
        if package.startswith("ddl.tools"):
            continue  # the core's own tooling layer (ddl plan, ddl bench allreduce: DESIGN.md section 2)
        for path in (ROOT / folder).glob("*.py"):
            text = path.read_text()
            if path.stem.startswith("bench") or path.stem in ("resnet", "peers") or "DistributedDataParallel(" in text \
                    or "MultiWorkerMirroredStrategy(" in text:
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
        assert target.endswith(f"[{cli.TOOLING[tuple(words.split())]}]")
    assert "torch-gloo" in tooling["project"]["entry-points"]["ddl.peers"]


@pytest.mark.parametrize("words", sorted(cli.TOOLING))
def test_a_benchmark_that_is_not_installed_says_which_package_and_extra_bring_it(
        words: tuple[str, ...], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli, "registered", dict)
    assert cli.main([*words, "--ranks", "1"]) == 2
    err = capsys.readouterr().err
    assert f"ddl {' '.join(words)} is a benchmark of the ddl-bench tooling package" in err
    assert f"pip install './tools/bench[{cli.TOOLING[words]}]'" in err


def test_from_this_checkout_ddl_bench_torch_reaches_the_tooling_package(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    assert ("bench", "torch") in cli.registered(), "scripts/setup-env.sh installs tools/bench"
    with pytest.raises(SystemExit) as done:
        cli.main(["bench", "torch", "--help"])
    assert done.value.code == 0
    assert "usage: ddl bench torch" in capsys.readouterr().out
