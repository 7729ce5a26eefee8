"""The core's layer folders import only downward, and the core never imports a framework."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "core"
#: Lowest first: a module may import from its own layer and the ones before it.
LAYERS = ("base", "wire", "reduction", "engine", "runtime", "checkpoint", "launcher", "onnx", "tools", "testing")
FRAMEWORKS = {"torch", "tensorflow", "keras", "jax"}


def _layer_of(module: str) -> str | None:
    """The layer folder of a ``ddl`` module, "ddl" for the facade, the adapter's name
    ("torch", "tensorflow", "caffe") for anything else under ``ddl``; None outside ddl."""
    parts = module.split(".")
    if parts[0] != "ddl":
        return None
    if len(parts) == 1:
        return "ddl"  # the package facade (public names, resolved lazily)
    return parts[1]


def _imports(path: Path, core: Path = CORE) -> list[tuple[int, str]]:
    """Every module ``path`` imports, at any depth (functions included), as absolute names."""
    # The package a relative import starts from (a module's or an __init__'s folder).
    package = "ddl." + ".".join(path.relative_to(core).with_suffix("").parts)
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


def _violations(path: Path, core: Path = CORE) -> list[str]:
    """What ``path`` (a module under ``core``) imports that its layer may not."""
    here = path.relative_to(core).parts
    if len(here) == 1:  # ddl/__init__.py: the facade may name any layer
        return []
    mine = LAYERS.index(here[0])
    where = "/".join(here)
    found = []
    for line, module in _imports(path, core):
        layer = _layer_of(module)
        if module.split(".")[0] in FRAMEWORKS:
            found.append(f"{where}:{line} imports {module}: core/ is framework-free")
        elif layer is None:
            continue
        elif layer == "ddl":
            if not (module == "ddl" and here[0] in ("tools", "testing")):
                found.append(f"{where}:{line} imports the ddl facade; import the module that defines the name")
        elif layer not in LAYERS:
            found.append(f"{where}:{line} imports {module}: an adapter (ddl.{layer}); the core never imports one")
        elif LAYERS.index(layer) > mine:
            found.append(f"{where}:{line} imports {module}: layer {here[0]!r} may only import {LAYERS[: mine + 1]}")
    return found


@pytest.mark.parametrize("path", _core_modules(), ids=lambda p: str(p.relative_to(CORE)))
def test_no_module_imports_upward_or_a_framework(path: Path) -> None:
    assert not _violations(path)


@pytest.mark.parametrize(
    ("layer", "source", "words"),
    [
        ("wire", "def f():\n    from ddl.engine import fusion\n", "layer 'wire' may only import"),
        ("base", "from ..runtime import api\n", "imports ddl.runtime"),
        ("engine", "import ddl.torch\n", "an adapter (ddl.torch)"),
        ("reduction", "from ddl.caffe.net import Net\n", "an adapter (ddl.caffe)"),
        ("runtime", "import torch\n", "framework-free"),
        ("engine", "from ddl import allreduce\n", "the ddl facade"),
    ],
)
def test_the_checker_sees_each_kind_of_bad_import(tmp_path: Path, layer: str, source: str, words: str) -> None:
    """The checker above can fail: each kind of bad import, in a module of a scratch core tree."""
    module = tmp_path / layer / "bad.py"
    module.parent.mkdir()
    module.write_text(source)
    found = _violations(module, core=tmp_path)
    assert len(found) == 1 and words in found[0], found


def test_the_checker_passes_a_downward_import(tmp_path: Path) -> None:
    module = tmp_path / "engine" / "good.py"
    module.parent.mkdir()
    module.write_text("from ddl.wire.comm import Comm\nfrom . import fusion\nimport numpy\n")
    assert _violations(module, core=tmp_path) == []


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
