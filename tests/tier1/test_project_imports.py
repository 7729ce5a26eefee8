"""The whole project's import graph: no two modules import each other, and architecture.md lists every module.

Every ``.py`` file of the repository is a module: the package's by ``pyproject.toml``'s
``package-dir`` (``core/runtime/api.py`` is ``ddl.runtime.api``), the rest by their path
(``emulation/cluster.py`` is ``emulation.cluster``, ``tests/tier1/test_plan.py`` is
``tests.tier1.test_plan``). Imports are read at any depth, functions included, as in
test_layers.py: an import inside a function still makes two modules depend on each other.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SKIPPED = {".venv", "build", "site", ".git", "__pycache__", "node_modules"}
#: Pairs that another issue removes; each names it. The lead drops a line when it lands.
KNOWN_PAIRS: set[frozenset[str]] = set()


def _package_dirs() -> dict[Path, str]:
    """Folder -> package name, from pyproject.toml's package-dir (deepest folders first)."""
    text = (ROOT / "pyproject.toml").read_text()
    section = text[text.index("[tool.setuptools.package-dir]"):].split("\n[", 1)[0]  # tomllib needs 3.11
    table = re.findall(r'^"([\w.]+)" = "([\w/]+)"$', section, re.M)
    assert table, "pyproject.toml's [tool.setuptools.package-dir] was not read"
    return dict(sorted(((ROOT / folder, name) for name, folder in table), key=lambda kv: -len(kv[0].parts)))


def module_name(path: Path, packages: dict[Path, str]) -> str:
    """The import name of the file at ``path``."""
    for folder, package in packages.items():
        if path.is_relative_to(folder):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            break
    else:
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    packages = _package_dirs()
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT).parts
        if SKIPPED & set(parts) or any(part.startswith(".venv") for part in parts):  # .venv-openmpi5 too
            continue
        found[module_name(path, packages)] = path
    return found


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``name`` (at ``path``) imports: ``from pkg import sub`` counts ``pkg.sub`` (not ``pkg``)."""
    is_package = path.name == "__init__.py"
    here = name.split(".") if is_package else name.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            # ``from pkg import sub`` depends on the submodule; ``from mod import name`` on the module.
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module for a in node.names]
        for target in targets:
            # The deepest project module the name lies in (``ddl.torch.elastic.run`` -> ``ddl.torch.elastic``).
            parts = target.split(".")
            while parts and ".".join(parts) not in modules:
                parts.pop()
            if parts and ".".join(parts) != name:
                out.add(".".join(parts))
    return out


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def mutual_pairs(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    return {frozenset({a, b}) for a, targets in graph.items() for b in targets if a in graph.get(b, set())}


def test_the_graph_sees_relative_lazy_and_package_imports() -> None:
    """What the test below relies on: the graph finds the imports that make pairs."""
    graph = import_graph()
    assert "ddl.runtime.lifecycle" in graph and "emulation.cluster" in graph and "tests.tier1.test_plan" in graph
    assert "ddl.runtime.process_sets" in graph["ddl.runtime.lifecycle"]   # from ddl.runtime.process_sets import ...
    assert "ddl.torch.buckets" in graph["ddl.torch.reducer"]               # from .buckets import ...
    assert "ddl.torch.adasum_optimizer" in graph["ddl.torch.optimizer"]    # imported inside a method
    assert "ddl.runtime.running" in graph["ddl.runtime.process_sets"]      # from ddl.runtime import running


def test_no_two_modules_import_each_other() -> None:
    pairs = mutual_pairs(import_graph()) - KNOWN_PAIRS
    assert not pairs, "modules that import each other (move what both need into a third): " + "; ".join(
        " <-> ".join(sorted(pair)) for pair in sorted(pairs, key=sorted))


def test_a_pair_is_found() -> None:
    assert mutual_pairs({"a": {"b"}, "b": {"a", "c"}, "c": set()}) == {frozenset({"a", "b"})}


# -- architecture.md lists every module of the package -----------------------------------------

ARCHITECTURE = ROOT / "docs" / "design" / "architecture.md"
_CELL = re.compile(r"`([\w/]+\.py)`")


def listed_modules() -> set[str]:
    """The paths the module table of architecture.md names, ``core/``-relative: ``engine/fusion.py``.

    Each module has a row (or shares one with its siblings); a folder is no entry, or a
    module added to it later would count as listed."""
    text = ARCHITECTURE.read_text()
    table = text[text.index("## Modules"):]
    table = table[: table.index("\n## ", 1)]
    return {m for line in table.splitlines() if line.startswith("| `") for m in _CELL.findall(line.split(" | ")[0])}


def package_files() -> set[str]:
    """The core's modules as the table names them (``__init__.py`` files are the packages' and not listed)."""
    core = ROOT / "core"
    return {p.relative_to(core).as_posix() for p in core.rglob("*.py")
            if p.name != "__init__.py" and "__pycache__" not in p.parts}


def test_architecture_lists_every_core_module_and_no_missing_one() -> None:
    listed, present = listed_modules(), package_files()
    unlisted, missing = sorted(present - listed), sorted(listed - present)
    assert not unlisted, f"modules not in docs/design/architecture.md's table: {unlisted}"
    assert not missing, f"docs/design/architecture.md lists modules that do not exist: {missing}"
