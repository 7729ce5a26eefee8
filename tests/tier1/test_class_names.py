"""Names that say one thing: no class name is defined twice in the launcher and the runtime, and no
module file name stands in two folders of the package for two different things.

Two classes of one name (the world machine's ``RankStarted`` beside the protocol's, three
``Tick`` events) made readers alias whole modules to tell them apart; two modules of one file
name (ddl.caffe's Data layer and its record databases, both ``database.py``) did the same for
files. A new one fails here; a file name that means one thing in each folder is listed below
with why.
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


#: File names that stand in more than one folder of core/ and adapters/ and mean the same thing in
#: each: name -> why. Anything else that repeats is a name to change.
SAME_CONCEPT = {
    "__init__.py": "a package's own module",
    "base.py": "the base class of its folder's classes (allreduce algorithms; Caffe layers)",
    "buckets.py": "gradient buckets: which tensors share one (core), the flat buffer each fills (torch)",
    "checkpoint.py": "ddl's checkpoint format: per framework (torch, Keras) and the `ddl checkpoint` command",
    "cli.py": "a command's entry point (ddlrun, ddl, ddl-caffe)",
    "collectives.py": "the collectives: on numpy arrays bound to an engine (core), on torch tensors (torch)",
    "compression.py": "gradient compression: the core's hooks, Horovod's compressors per framework",
    "conformance.py": "an adapter's conformance hooks, one per adapter",
    "elastic.py": "elastic training with Horovod's names, per framework (and ddl-caffe's train --elastic)",
    "errors.py": "the error classes of its package (ddl, ddl.tensorflow, ddl.caffe's file readers)",
    "kernels.py": "the half-type kernels: the core's, and torch's installed as them",
    "local_sgd.py": "Local SGD and DiLoCo, per framework",
    "optimizer.py": "DistributedOptimizer, per framework",
    "protocol.py": "the typed, versioned messages of its folder's channel (keepers to ddlrun; elastic)",
    "server.py": "ddlrun's end of its folder's connections (keepers; elastic agents), on one TcpListener",
    "sync_batch_norm.py": "synchronized batch normalization, per framework",
    "wrapping.py": "what an optimizer wrapper passes through, per framework",
}


def module_folders(trees: tuple[str, ...], root: Path = ROOT) -> dict[str, list[str]]:
    """Every module file name under ``trees`` -> the folders that hold one."""
    found: dict[str, list[str]] = defaultdict(list)
    for tree in trees:
        for path in sorted((root / tree).rglob("*.py")):
            found[path.name].append(path.parent.relative_to(root).as_posix())
    return found


def test_no_file_name_means_two_things_in_the_package() -> None:
    repeated = {name: folders for name, folders in module_folders(("core", "adapters")).items() if len(folders) > 1}
    unexplained = {name: folders for name, folders in repeated.items() if name not in SAME_CONCEPT}
    assert unexplained == {}, "rename one so the file name says what it holds, or list it in SAME_CONCEPT with why: " \
        + "; ".join(f"{name} in {', '.join(folders)}" for name, folders in sorted(unexplained.items()))
    stale = sorted(set(SAME_CONCEPT) - set(repeated))
    assert stale == [], f"SAME_CONCEPT lists names that no longer repeat: {stale}"


def test_the_file_scan_sees_a_repeated_name(tmp_path: Path) -> None:
    for folder in ("a/data", "a/layers"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "database.py").write_text("")
    assert module_folders(("a",), root=tmp_path) == {"database.py": ["a/data", "a/layers"]}
