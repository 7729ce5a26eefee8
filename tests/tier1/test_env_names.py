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
