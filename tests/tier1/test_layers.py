"""The core's layer folders import only downward, and the core never imports a framework."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "core"
#: Lowest first: a module may import from its own layer and the ones before it.
LAYERS = ("base", "wire", "reduction", "engine", "runtime", "launcher", "onnx", "tools", "testing")
FRAMEWORKS = {"torch", "tensorflow", "keras", "jax"}


def _layer_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "ddl":
        return None
    if len(parts) == 1:
        return "ddl"  # the package facade (public names, resolved lazily)
    return parts[1] if parts[1] in LAYERS else parts[1]


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every module ``path`` imports, at any depth (functions included), as absolute names."""
    # The package a relative import starts from (a module's or an __init__'s folder).
    package = "ddl." + ".".join(path.relative_to(CORE).with_suffix("").parts)
    package = package.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            if module == "ddl" and [a.name for a in node.names] == ["__version__"]:
                continue  # the package's own constant, not a public name resolved upward
            out.append((node.lineno, module))
            if module == "ddl":  # ``from ddl import x``: x may be a layer package
                out += [(node.lineno, f"ddl.{a.name}") for a in node.names if a.name in LAYERS]
    return out


def _core_modules() -> list[Path]:
    return sorted(CORE.rglob("*.py"))


def test_the_core_is_a_handful_of_layer_folders() -> None:
    top = sorted(p.name for p in CORE.iterdir() if p.suffix == ".py")
    assert top == ["__init__.py"], f"modules outside the layer folders: {top}"
    folders = sorted(p.name for p in CORE.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert folders == sorted(LAYERS)


@pytest.mark.parametrize("path", _core_modules(), ids=lambda p: str(p.relative_to(CORE)))
def test_no_module_imports_upward_or_a_framework(path: Path) -> None:
    here = path.relative_to(CORE).parts
    if len(here) == 1:  # ddl/__init__.py: the facade may name any layer
        return
    mine = LAYERS.index(here[0])
    for line, module in _imports(path):
        assert module.split(".")[0] not in FRAMEWORKS, f"{path.name}:{line} imports {module}: core/ is framework-free"
        layer = _layer_of(module)
        if layer is None:
            continue
        assert layer != "ddl" or module == "ddl" and here[0] in ("tools", "testing"), \
            f"{'/'.join(here)}:{line} imports the ddl facade; import the module that defines the name"
        if layer in LAYERS:
            assert LAYERS.index(layer) <= mine, (f"{'/'.join(here)}:{line} imports {module}: layer "
                                                  f"{here[0]!r} may only import {LAYERS[: mine + 1]}")


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    """The test above can fail: a wire module importing the engine is caught."""
    bad = CORE / "wire" / "comm.py"
    found = [m for _, m in _imports(bad)]
    assert "ddl.base.ops" in found
    fake = tmp_path / "x.py"
    fake.write_text("def f():\n    from ddl.engine import fusion\n")
    tree = [n for n in ast.walk(ast.parse(fake.read_text())) if isinstance(n, ast.ImportFrom)]
    assert tree and _layer_of(tree[0].module or "") == "engine" and LAYERS.index("engine") > LAYERS.index("wire")


def test_the_architecture_page_names_every_module_and_folder() -> None:
    """docs/design/architecture.md's tables cover the core as it is (a new module must be named there)."""
    text = (ROOT / "docs" / "design" / "architecture.md").read_text()
    for layer in LAYERS:
        assert f"`{layer}/`" in text, layer
    missing = []
    for path in _core_modules():
        rel = path.relative_to(CORE)
        if rel.name == "__init__.py" or len(rel.parts) == 1:
            continue
        folder = "/".join(rel.parts[:-1]) + "/"
        if f"`{rel.as_posix()}`" not in text and f"`{folder}`" not in text:
            missing.append(rel.as_posix())
    assert not missing, f"modules docs/design/architecture.md does not name: {missing}"
