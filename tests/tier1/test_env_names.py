"""Every ``DDL_*`` variable the tests, examples, README and docs name is one that ddl reads."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path

from ddl.base.config import SETTINGS, Config

ROOT = Path(__file__).resolve().parents[2]
# Read by scripts/setup-env.sh, not by ddl.
SCRIPT_ONLY = {"DDL_EXTRAS", "DDL_MPI"}  # read by scripts/setup-env.sh and setup.py (build time)


class _Recorder(Mapping[str, str]):
    """An empty environment that remembers which names were looked up."""

    def __init__(self) -> None:
        self.asked: set[str] = set()

    def __getitem__(self, key: str) -> str:
        self.asked.add(key)
        raise KeyError(key)

    def get(self, key: str, default: object = None) -> object:  # type: ignore[override]
        self.asked.add(key)
        return default

    def __contains__(self, key: object) -> bool:
        self.asked.add(str(key))
        return False

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def test_only_variables_that_ddl_reads_are_set() -> None:
    env = _Recorder()
    Config.from_env(env)
    known = env.asked | {s.env for s in SETTINGS} | SCRIPT_ONLY
    assert "DDL_CALIBRATION" in known and "DDL_TOPOLOGY" in known
    files = [*ROOT.glob("tests/**/*.py"), *ROOT.glob("examples/**/*.py"), ROOT / "README.md", *ROOT.glob("docs/**/*.md")]
    used = {(m, f.relative_to(ROOT).as_posix()) for f in files for m in re.findall(r"\bDDL_[A-Z0-9_]+", f.read_text())}
    unknown = sorted(u for u in used if u[0] not in known)
    assert not unknown, f"variables ddl never reads (misspelt?): {unknown}"


def _reads_and_names(path: Path) -> list[str]:
    """Where ``path`` reads ``os.environ``/``os.getenv`` or spells a ``DDL_*`` variable in code
    (docstrings aside)."""
    import ast

    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os" \
                and node.attr in ("environ", "getenv", "environb"):
            found.append(f"line {node.lineno}: os.{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings \
                and re.fullmatch(r"DDL_[A-Z0-9_]+", node.value):
            found.append(f"line {node.lineno}: {node.value!r}")
    return found


#: Modules allowed to touch os.environ other than the settings' reader, and why.
ENVIRON_WRITERS = {
    "core/launcher/elastic/agent.py": "a forked rank's environment is replaced by its stub's (written, not read)",
}


def test_only_the_config_module_reads_the_environment_or_names_a_variable() -> None:
    """``ddl.base.config`` is the one reader of ``os.environ``, and the settings table the one
    place a ``DDL_*`` name is written; the launcher and the elastic processes go through them."""
    offenders = {}
    for path in sorted([*(ROOT / "core").rglob("*.py"), *(ROOT / "adapters").rglob("*.py")]):
        where = path.relative_to(ROOT).as_posix()
        if where in ("core/base/config.py", "core/base/settings.py"):
            continue
        found = _reads_and_names(path)
        if where in ENVIRON_WRITERS:
            found = [f for f in found if "os.environ" not in f]
        if found:
            offenders[where] = found
    assert not offenders, f"read os.environ or name DDL_* variables outside ddl.base.config: {offenders}"
