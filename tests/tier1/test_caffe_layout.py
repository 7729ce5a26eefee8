"""ddl.caffe is folders by job that import one way: formats -> data -> layers -> net -> solver -> export -> command,
no module imports one that imports it back, no product module imports the repository's tools, and the schema is a
.proto data file (no Python file holds it)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CAFFE = ROOT / "adapters" / "caffe_compat"
#: Lowest first: a module may import from its own folder and the ones before it; the package's own top-level
#: modules (``__init__``, ``conformance``) may import any folder.
FOLDERS = ("formats", "data", "layers", "net", "solver", "export", "command")


def _module(path: Path) -> str:
    parts = path.relative_to(CAFFE).with_suffix("").parts
    return ".".join(("ddl", "caffe", *(parts[:-1] if parts[-1] == "__init__" else parts)))


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every module ``path`` imports, at any depth (functions included), as absolute names."""
    package = _module(path) if path.name == "__init__.py" else _module(path).rsplit(".", 1)[0]
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
            out.append((node.lineno, module))
            out += [(node.lineno, f"{module}.{a.name}") for a in node.names]   # ``from pkg import module``
    return out


def _modules() -> dict[str, Path]:
    return {_module(p): p for p in sorted(CAFFE.rglob("*.py"))}


def _folder(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[:2] == ["ddl", "caffe"] and parts[2] in FOLDERS else None


def test_the_package_is_folders_by_job() -> None:
    top = sorted(p.name for p in CAFFE.iterdir() if p.suffix == ".py")
    assert top == ["__init__.py", "conformance.py"], f"modules outside the folders: {top}"
    folders = sorted(p.name for p in CAFFE.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert folders == sorted(FOLDERS)


def test_folders_import_only_downward_and_never_the_tools() -> None:
    bad = []
    for name, path in _modules().items():
        mine = _folder(name)
        for line, target in _imports(path):
            where = f"{path.relative_to(ROOT)}:{line}"
            if target.split(".")[0] == "tools":
                bad.append(f"{where} imports {target}: the product never imports the repository's tools")
            theirs = _folder(target)
            if mine is not None and theirs is not None and FOLDERS.index(theirs) > FOLDERS.index(mine):
                bad.append(f"{where} ({mine}) imports {target} ({theirs}), a folder above it")
    assert not bad, "\n".join(bad)


def test_no_two_modules_import_each_other() -> None:
    mods = _modules()
    graph = {name: {t for _, t in _imports(path) if t in mods and t != name} for name, path in mods.items()}
    pairs = sorted({tuple(sorted((a, b))) for a, targets in graph.items() for b in targets if a in graph.get(b, set())})
    assert not pairs, f"modules that import each other: {pairs}"


def test_the_schema_is_a_proto_file_and_no_python_file_holds_it() -> None:
    proto = CAFFE / "formats" / "caffe.proto"
    assert proto.is_file() and 'syntax = "proto2";' in proto.read_text()
    holders = [str(p.relative_to(ROOT)) for p in CAFFE.rglob("*.py") if "message LayerParameter" in p.read_text()]
    assert not holders, f"schema text in Python files: {holders}"
    from ddl.caffe.formats import schema
    assert schema.build_file(proto.read_text()) == schema.build_file()          # what the package reads is this file
    assert "caffe.proto" in (ROOT / "pyproject.toml").read_text()              # shipped as package data
