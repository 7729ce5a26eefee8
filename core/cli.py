"""The ``ddl`` command: one table of subcommands, each a module imported only when used.

``ddl bench allreduce [-np N]`` re-launches itself under ``ddlrun -np N``; ``ddl bench
torch`` / ``tensorflow`` launch one job per world size in their ``--ranks``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable

# words -> (module with a ``main(argv) -> int``, the extra it needs or "", usage line)
COMMANDS: dict[tuple[str, ...], tuple[str, str, str]] = {
    ("bench", "allreduce"): ("ddl.bench.allreduce", "",
                             "ddl bench allreduce [-np N] [--max-bytes B] [--fused N] [--out DIR] ..."),
    ("bench", "startup"): ("ddl.bench.startup", "", "ddl bench startup [-np N] [--rounds R] [--out DIR]"),
    ("bench", "torch"): ("ddl.torch.bench", "torch", "ddl bench torch [--ranks 1,2] [--models mlp,cnn] [--out DIR] ..."),
    ("bench", "tensorflow"): ("ddl.tensorflow.bench", "tensorflow",
                              "ddl bench tensorflow [--ranks 1,2] [--batch 64] [--out DIR] ..."),
    ("bench", "hosts"): ("ddl.bench.hosts", "",
                         "ddl bench hosts [--hosts 2,3] [--rates 1gbit,none] [--out DIR]  (root: emulated hosts)"),
    ("plan",): ("ddl.plan", "",
                "ddl plan --topology 4x64 --link 20GB/s:5us --link 100gbit:3us --model resnet50 --step-ms 200"),
    ("conformance",): ("ddl.conformance.suite", "",
                       "ddl conformance [--ranks 1,2,4] [--frameworks torch,tensorflow,caffe] ..."),
    ("doctor",): ("ddl.doctor", "", "ddl doctor [-np N] [-H HOST:SLOTS,... | --hostfile F]"),
}


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    for words, (module, extra, _) in COMMANDS.items():
        if tuple(args[: len(words)]) == words:
            rest = args[len(words):]
            if words == ("bench", "allreduce"):
                return _bench_allreduce(rest)
            return _load(module, extra, " ".join(words))(rest)
    print("usage: " + "\n       ".join(usage for _, _, usage in COMMANDS.values()), file=sys.stderr)
    return 2


def _load(module: str, extra: str, what: str) -> Callable[[list[str]], int]:
    try:
        found: Callable[[list[str]], int] = importlib.import_module(module).main
    except ImportError as exc:
        if not extra:
            raise
        print(f"ddl {what} needs the {extra} extra ({exc}); pip install 'ddl[{extra}]'", file=sys.stderr)
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

        return ddlrun(["-np", str(np_), sys.executable, "-m", "ddl.bench.allreduce", *rest])
    from ddl.bench.allreduce import main as bench

    return bench(rest)


if __name__ == "__main__":
    raise SystemExit(main())
