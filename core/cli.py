"""The ``ddl`` command: ``ddl bench allreduce [-np N] [options]``, ``ddl bench torch``, ``ddl doctor``.

A bench started outside MPI re-launches itself under ``ddlrun -np N``; ``ddl bench
torch`` launches one job per world size in its ``--ranks``.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["doctor"]:
        from ddl.doctor import main as doctor

        return doctor(args[1:])
    if len(args) < 2 or args[0] != "bench" or args[1] not in ("allreduce", "torch"):
        print("usage: ddl bench allreduce [-np N] [--max-bytes B] [--fused N] [--out DIR] ...\n"
              "       ddl bench torch [--ranks 1,2] [--models mlp,cnn] [--out DIR] ...\n"
              "       ddl doctor [-np N] [-H HOST:SLOTS,... | --hostfile F]", file=sys.stderr)
        return 2
    rest = args[2:]
    if args[1] == "torch":
        try:
            from ddl.torch.bench import main as torch_bench
        except ImportError as exc:
            print(f"ddl bench torch needs PyTorch ({exc}); pip install 'ddl[torch]'", file=sys.stderr)
            return 2
        return torch_bench(rest)
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
