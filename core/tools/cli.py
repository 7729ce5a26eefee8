"""The ``ddl`` command: one table of the core's subcommands, plus those other packages register.

Each subcommand is a module with ``main(argv) -> int``, imported only when used. The
core's own are in :data:`COMMANDS`; another package adds its own as an entry point in
the ``ddl.commands`` group, named by its words (``"bench torch"``), with the extra it
needs (``ddl_bench.torch_training:main [torch]``). Every benchmark is tooling, outside the
ddl-runtime wheel (the ddl-bench package in the repository's tools/bench: ``ddl bench
allreduce|startup|rehearsal|torch|tensorflow``): :data:`TOOLING` names them, so that asking
for one that is not installed says how to get it.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import sys
from collections.abc import Callable

#: The distribution, for install hints.
DISTRIBUTION = "ddl-runtime"
#: What each command does, in one line (``ddl --help``).
SUMMARIES: dict[tuple[str, ...], str] = {
    ("bench", "allreduce"): "allreduce bandwidth of every algorithm against MPI's own, as a table and JSON",
    ("bench", "rehearsal"): "a training step's gradient stream on N ranks over emulated links, against ddl plan",
    ("bench", "startup"): "how long ddlrun takes to start N ranks and ddl.init to return",
    ("bench", "torch"): "training steps of ddl.torch against DDP with gloo, and efficiency against one process",
    ("bench", "tensorflow"): "training steps of ddl.tensorflow against MultiWorkerMirroredStrategy",
    ("plan",): "predicted allreduce, bucket schedule, step time, scaling and memory for any cluster",
    ("checkpoint",): "look inside a ddl checkpoint, or write it as one plain file",
    ("conformance",): "train the reference ONNX models in every installed framework and compare them",
    ("doctor",): "which MPI, launcher, placement and transports a launch would get, and what is wrong",
}
#: words -> (module with a ``main(argv) -> int``, usage line).
COMMANDS: dict[tuple[str, ...], tuple[str, str]] = {
    ("plan",): ("ddl.tools.plan",
                "ddl plan --topology 4x64 --link 20GB/s:5us --link 100gbit:3us --model resnet50 --step-ms 200"),
    ("checkpoint",): ("ddl.tools.checkpoint",
                      "ddl checkpoint inspect PATH [--verify] | ddl checkpoint consolidate PATH -o model.pt"),
    ("conformance",): ("ddl.tools.conformance.suite", "ddl conformance [-np 1,2,4] [--frameworks torch,tensorflow,caffe] ..."),
    ("doctor",): ("ddl.tools.doctor", "ddl doctor [-np N] [-H HOST:SLOTS,... | --hostfile F]"),
}
GROUP = "ddl.commands"
#: Subcommands of the ddl-bench tooling package (tools/bench), by words -> the extra they need ("": none).
TOOLING: dict[tuple[str, ...], str] = {("bench", "allreduce"): "", ("bench", "rehearsal"): "", ("bench", "startup"): "",
                                       ("bench", "torch"): "torch", ("bench", "tensorflow"): "tensorflow"}
TOOLING_PACKAGE = "ddl-bench"


def registered() -> dict[tuple[str, ...], importlib.metadata.EntryPoint]:
    """The subcommands installed adapters register (``ddl.commands`` entry points), by words."""
    return {tuple(ep.name.split()): ep for ep in importlib.metadata.entry_points(group=GROUP)}


def main(argv: list[str] | None = None) -> int:
    """Run ``ddl COMMAND ...``; ``ddl --help`` lists the commands, ``ddl --version`` says the version."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["--version"], ["-V"]):
        from ddl import __version__

        print(f"ddl (ddl-runtime) {__version__}")
        return 0
    plugins = registered()
    if args[:1] in (["--help"], ["-h"], ["help"]):
        print(overview(plugins))
        return 0
    for words in sorted([*COMMANDS, *plugins], key=len, reverse=True):
        if tuple(args[: len(words)]) != words:
            continue
        rest = args[len(words):]
        if words in COMMANDS:
            found: Callable[[list[str]], int] = importlib.import_module(COMMANDS[words][0]).main
            return found(rest)
        return _plugin(plugins[words], " ".join(words))(rest)
    for words in TOOLING:
        if tuple(args[: len(words)]) == words:
            print(f"ddl {' '.join(words)} is a benchmark of the {TOOLING_PACKAGE} tooling package, which is not "
                  f"installed here (it is not part of {DISTRIBUTION}). From a ddl checkout: {install_hint(words)} "
                  "(scripts/setup-env.sh installs it), then run it again", file=sys.stderr)
            return 2
    if not args:
        print(overview(plugins), file=sys.stderr)
        return 2
    known = [" ".join(w) for w in [*COMMANDS, *plugins]]
    given = " ".join(a for a in args[:2] if not a.startswith("-"))
    near = difflib.get_close_matches(given, known, n=1, cutoff=0.6) or \
        difflib.get_close_matches(args[0], sorted({w.split()[0] for w in known}), n=1, cutoff=0.6)
    hint = f"; did you mean 'ddl {near[0]}'?" if near else ""
    print(f"ddl: unknown command {given or args[0]!r}{hint} (ddl --help lists the commands)", file=sys.stderr)
    return 2


def overview(plugins: dict[tuple[str, ...], importlib.metadata.EntryPoint]) -> str:
    """``ddl --help``: a line per command, with what it does."""
    rows = [(" ".join(words), SUMMARIES.get(words, "")) for words in COMMANDS]
    for words, ep in sorted(plugins.items()):
        owner = ep.dist.name if ep.dist is not None else ep.value.split(":")[0]
        needs = f"; needs its extra: {', '.join(ep.extras)}" if ep.extras else ""
        rows.append((" ".join(words), f"{SUMMARIES.get(words, 'a command')} ({owner}{needs})"))
    for words in sorted(set(TOOLING) - set(plugins)):
        rows.append((" ".join(words), f"{SUMMARIES[words]} (not installed: {install_hint(words)})"))
    width = max(len(name) for name, _ in rows)
    lines = ["usage: ddl COMMAND [ARGS ...]   (ddl COMMAND --help: its options)", "", "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, text in rows]
    lines += ["", "options:", f"  {'-h, --help':<{width}}  this list", f"  {'--version':<{width}}  the version",
              "", "To run a program on N ranks: ddlrun -np N python train.py (ddlrun --help)."]
    return "\n".join(lines)


def install_hint(words: tuple[str, ...]) -> str:
    """The pip command that brings the tooling subcommand ``words``, with the extra it needs."""
    extra = TOOLING[words]
    return f"pip install './tools/bench[{extra}]'" if extra else "pip install ./tools/bench"


def missing_extra(entry: importlib.metadata.EntryPoint, exc: ImportError, owner: str, how: str | None = None) -> str:
    """What a plugin that failed to import needs, and the pip command that brings it
    (``how`` instead, where the owner installs some other way)."""
    extra = ",".join(entry.extras)
    if how is None:
        how = f"pip install '{owner}[{extra}]'" if extra else f"pip install --force-reinstall '{owner}'"
    needed = f"the {extra} extra" if extra else "a module its package did not install"
    return f"needs {needed} ({exc}); {how}"


def _plugin(entry: importlib.metadata.EntryPoint, what: str) -> Callable[[list[str]], int]:
    try:
        found: Callable[[list[str]], int] = entry.load()
    except ImportError as exc:
        owner = entry.dist.name if entry.dist is not None else DISTRIBUTION
        words = tuple(what.split())
        # The tooling package is installed from a checkout's folder, not by its name.
        how = install_hint(words) if owner == TOOLING_PACKAGE and words in TOOLING else None
        print(f"ddl {what} {missing_extra(entry, exc, owner, how)}", file=sys.stderr)
        return lambda _argv: 2
    return found


if __name__ == "__main__":
    raise SystemExit(main())
