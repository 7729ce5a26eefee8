"""A fresh virtualenv with `pip install ddl[extra]` can import everything each example imports.

Opt-in (a real install of torch takes a minute or more): ``bash scripts/test-cluster.sh`` or
``pytest -m install``. The pip cache keeps repeated runs from downloading again.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.install


def _load(name: str, path: Path):  # the tier-1 table and import scanner, shared without a conftest
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EXTRAS = _load("examples_extras", ROOT / "tests" / "tier1" / "test_examples_extras.py")


@pytest.mark.parametrize("extra", sorted({e for e in EXTRAS.EXAMPLE_EXTRAS.values() if e}))
def test_fresh_venv_with_the_extra_imports_every_example(extra: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if "install" not in (request.config.option.markexpr or ""):
        pytest.skip("opt-in (installs torch into a fresh venv): bash scripts/test-cluster.sh or pytest -m install")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = str(venv / "bin" / "python")
    done = subprocess.run([py, "-m", "pip", "install", "--disable-pip-version-check", f"{ROOT}[{extra}]",
                           "-c", str(ROOT / "scripts" / "constraints.txt")],
                          capture_output=True, text=True, timeout=1200, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    check = subprocess.run([py, "-m", "pip", "check"], capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout
    for name, wanted in EXTRAS.EXAMPLE_EXTRAS.items():
        if wanted not in (None, extra):
            continue
        modules = sorted(EXTRAS.example_imports(next((ROOT / "examples").rglob(name))) | {"ddl"})
        imported = subprocess.run([py, "-c", f"import {', '.join(modules)}"], capture_output=True, text=True,
                                  timeout=300, cwd=tmp_path)
        assert imported.returncode == 0, f"{name} in a fresh ddl[{extra}]: {imported.stderr[-2000:]}"
