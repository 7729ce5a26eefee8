"""Every example's imports come with ddl's base requirements plus the extra the install page names for it."""

from __future__ import annotations

import ast
import importlib.metadata
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
INSTALL_PAGE = ROOT / "docs" / "install.md"
#: Example (its path under examples/) -> the extra docs/install.md tells people to install for it
#: (None: the core alone).
EXAMPLE_EXTRAS: dict[str, str | None] = {
    "allreduce.py": None,
    "torch_digits.py": "torch",
    "keras_digits.py": "tensorflow",
    "caffe/make_digits.py": "caffe",
    "elastic/torch_digits.py": "torch",
    "elastic/keras_digits.py": "tensorflow",
}


def example_imports(path: Path) -> set[str]:
    """Top-level modules an example imports, stdlib and ddl left out."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return {name for name in names if name not in sys.stdlib_module_names and name != "ddl"}


def provided(extra: str | None) -> set[str]:
    """Distribution names that `pip install ddl[extra]` brings directly."""
    names = set()
    for text in importlib.metadata.requires("ddl-runtime") or []:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate({"extra": extra or ""}):
            names.add(canonicalize_name(req.name))
    return names


def test_every_example_has_a_named_extra() -> None:
    examples = sorted(p.relative_to(ROOT / "examples").as_posix() for p in (ROOT / "examples").rglob("*.py"))
    assert examples == sorted(EXAMPLE_EXTRAS), "add the new example to EXAMPLE_EXTRAS and docs/install.md"


@pytest.mark.parametrize(("name", "extra"), sorted(EXAMPLE_EXTRAS.items()))
def test_example_imports_come_with_its_extra(name: str, extra: str | None) -> None:
    modules = example_imports(ROOT / "examples" / name)
    owners = importlib.metadata.packages_distributions()
    have = provided(extra)
    for module in sorted(modules):
        dists = {canonicalize_name(d) for d in owners.get(module, [])}
        assert dists, f"{name} imports {module}, which is not installed here at all"
        assert dists & have, f"{name} imports {module} ({', '.join(sorted(dists))}) but ddl[{extra}] does not bring it"
    if extra:
        assert f'pip install "./ddl[{extra}]"' in INSTALL_PAGE.read_text(), f"docs/install.md names no extra for {name}"


def test_the_check_catches_a_missing_module() -> None:
    # The defect it guards against: torch_digits imports sklearn, once missing from ddl[torch].
    assert "sklearn" in example_imports(ROOT / "examples" / "torch_digits.py")
    assert "scikit-learn" not in provided(None)
