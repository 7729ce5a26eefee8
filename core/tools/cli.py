"""The ``ddl`` command: one table of the core's subcommands, plus those other packages register.

Each subcommand is a module with ``main(argv) -> int``, imported only when used. The
core's own are in :data:`COMMANDS`; another package adds its own as an entry point in
the ``ddl.commands`` group, named by its words (``"bench torch"``), with the extra it
needs (``ddl_bench.torch_training:main [torch]``). The framework benchmarks are tooling,
outside the ddl-runtime wheel (the ddl-bench package in the repository's tools/bench):
:data:`TOOLING` names them, so that asking for one that is not installed says how to get it.
``ddl bench allreduce -np N`` re-launches itself under ``ddlrun -np N``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
from collections.abc import Callable

#: The distribution, for install hints.
DISTRIBUTION = "ddl-runtime"
#: words -> (module with a ``main(argv) -> int``, usage line).
COMMANDS: dict[tuple[str, ...], tuple[str, str]] = {
    ("bench", "allreduce"): ("ddl.tools.bench.allreduce",
                             "ddl bench allreduce [-np N] [--max-bytes B] [--fused N] [--out DIR] ..."),
    ("bench", "rehearsal"): ("ddl.tools.bench.rehearsal",
                             "ddl bench rehearsal [-np N] --model resnet50 "
                             "--link 1gbit ..."),
    ("bench", "startup"): ("ddl.tools.bench.startup", "ddl bench startup [-np N] [--rounds R] [--out DIR]"),
    ("plan",): ("ddl.tools.plan",
                "ddl plan --topology 4x64 --link 20GB/s:5us --link 100gbit:3us --model resnet50 --step-ms 200"),
    ("checkpoint",): ("ddl.tools.checkpoint",
                      "ddl checkpoint inspect PATH [--verify] | ddl checkpoint consolidate PATH -o model.pt"),
    ("conformance",): ("ddl.tools.conformance.suite", "ddl conformance [-np 1,2,4] [--frameworks torch,tensorflow,caffe] ..."),
    ("doctor",): ("ddl.tools.doctor", "ddl doctor [-np N] [-H HOST:SLOTS,... | --hostfile F]"),
}
GROUP = "ddl.commands"
#: Subcommands of the ddl-bench tooling package (tools/bench), by words -> the extra they need.
TOOLING: dict[tuple[str, ...], str] = {("bench", "torch"): "torch", ("bench", "tensorflow"): "tensorflow"}
TOOLING_PACKAGE = "ddl-bench"


def registered() -> dict[tuple[str, ...], importlib.metadata.EntryPoint]:
    """The subcommands installed adapters register (``ddl.commands`` entry points), by words."""
    return {tuple(ep.name.split()): ep for ep in importlib.metadata.entry_points(group=GROUP)}


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    plugins = registered()
    for words in sorted([*COMMANDS, *plugins], key=len, reverse=True):
        if tuple(args[: len(words)]) != words:
            continue
        rest = args[len(words):]
        if words == ("bench", "allreduce"):
            return _bench_allreduce(rest)
        if words in COMMANDS:
            found: Callable[[list[str]], int] = importlib.import_module(COMMANDS[words][0]).main
            return found(rest)
        return _plugin(plugins[words], " ".join(words))(rest)
    for words, extra in TOOLING.items():
        if tuple(args[: len(words)]) == words:
            print(f"ddl {' '.join(words)} is a benchmark of the {TOOLING_PACKAGE} tooling package, which is not "
                  f"installed here (it is not part of {DISTRIBUTION}). From a ddl checkout: pip install "
                  f"'./tools/bench[{extra}]' (scripts/setup-env.sh installs it), then run it again", file=sys.stderr)
            return 2
    usages = [usage for _, usage in COMMANDS.values()] + [f"ddl {ep.name} ...  ({ep.value})" for ep in plugins.values()]
    print("usage: " + "\n       ".join(usages), file=sys.stderr)
    return 2


def _plugin(entry: importlib.metadata.EntryPoint, what: str) -> Callable[[list[str]], int]:
    try:
        found: Callable[[list[str]], int] = entry.load()
    except ImportError as exc:
        extra = ",".join(entry.extras) or "the adapter's"
        owner = entry.dist.name if entry.dist is not None else DISTRIBUTION
        print(f"ddl {what} needs the {extra} extra ({exc}); pip install '{owner}[{extra}]'", file=sys.stderr)
        return lambda _argv: 2
    return found


def _bench_allreduce(rest: list[str]) -> int:
    np_ = None
    if "-np" in rest:
        i = rest.index("-np")
        try:
            np_ = int(rest[i + 1])
        except (IndexError, ValueError):
            print("ddl bench: -np needs a whole number of ranks, e.g. -np 2", file=sys.stderr)
            return 2
        del rest[i : i + 2]
    if np_ is not None:
        from ddl.launcher.cli import main as ddlrun
        from ddl.launcher.relaunch import relaunch_argv

        return ddlrun(relaunch_argv(np_, ["-m", "ddl.tools.bench.allreduce", *rest])[3:])
    from ddl.tools.bench.allreduce import main as bench

    return bench(rest)


if __name__ == "__main__":
    raise SystemExit(main())
