"""Names that say one thing: no class name is defined twice in the launcher and the runtime.

Two classes of one name (the world machine's ``RankStarted`` beside the protocol's, three
``Tick`` events) made readers alias whole modules to tell them apart; a new one fails here.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TREES = ("core/launcher", "core/runtime")


def class_definitions(trees: tuple[str, ...]) -> dict[str, list[str]]:
    """Every class name defined under ``trees`` (nested ones too) -> where, as ``path:line``."""
    found: dict[str, list[str]] = defaultdict(list)
    for tree in trees:
        for path in sorted((ROOT / tree).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ClassDef):
                    found[node.name].append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_no_class_name_is_defined_twice_in_the_launcher_and_the_runtime() -> None:
    twice = {name: places for name, places in class_definitions(TREES).items() if len(places) > 1}
    assert twice == {}, "rename one of each so the name says which thing it is: " + "; ".join(
        f"{name} at {', '.join(places)}" for name, places in sorted(twice.items()))


def test_the_scan_sees_the_machines_events() -> None:
    found = class_definitions(TREES)
    for name in ("WorldRankStarted", "RankStarted", "WorldTick", "HostTick", "AgentTick", "LaunchRank", "Launch"):
        assert len(found[name]) == 1, name
