"""``ddl checkpoint``: look inside a ddl checkpoint, or write it as one plain file.

``ddl checkpoint inspect PATH [--verify] [--tensors] [--json FILE]`` lists the files
(rank, size, digest: checked with ``--verify``), the model's and the optimizer's tensors,
the optimizer's class and hyperparameters and ``extra``, with no framework installed.
``ddl checkpoint consolidate PATH -o OUT [--optimizer OUT2]`` writes a one-process file
whose kind the name says: ``.npz`` (numpy, here), ``.pt`` (``ddl.torch``) or
``.weights.h5`` (``ddl.tensorflow.keras``), the last two through the ``ddl.checkpoint.writers``
entry points the adapters register.

Example:
    ddl checkpoint inspect ckpt --verify
    ddl checkpoint consolidate ckpt -o model.pt --optimizer optimizer.pt
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ddl.checkpoint import Checkpoint, CheckpointError
from ddl.checkpoint.manifest import decode_value
from ddl.tools.cli import DISTRIBUTION, missing_extra
from ddl.tools.helptext import plain

#: Entry-point group of the adapters' consolidated-file writers, named by the file suffix.
WRITERS = "ddl.checkpoint.writers"


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.4g} {unit}"
        n /= 1024
    return f"{n:.4g} TiB"


def describe(ckpt: Checkpoint, *, verify: bool, tensors: bool) -> tuple[list[str], dict[str, Any]]:
    """The printed lines and the JSON record of ``inspect``.

    Raises:
        CheckpointError: with ``verify``, a missing or corrupt file.
    """
    m = ckpt.manifest
    lines = [f"ddl checkpoint {ckpt.folder}: {m.framework}, saved by {m.world_size} rank(s), save {m.save_id}"]
    record: dict[str, Any] = {"path": str(ckpt.folder), "framework": m.framework, "world_size": m.world_size,
                              "save_id": m.save_id, "files": [], "sections": {}, "extra": m.extra}
    lines.append(f"files: {len(m.files)}, {human(sum(f.nbytes for f in m.files.values()))}")
    for f in sorted(m.files.values(), key=lambda f: (f.rank, f.name)):
        status = ""
        if verify:
            ckpt.reader.verify(f.name)
            status = "  verified"
        lines.append(f"  {f.name}  rank {f.rank}  {human(f.nbytes)}  sha256 {f.sha256[:16]}{status}")
        record["files"].append({"name": f.name, "rank": f.rank, "bytes": f.nbytes, "sha256": f.sha256,
                                "verified": verify})
    for section in sorted({k.split("/", 1)[0] for k in m.entries}):
        keys = m.keys(f"{section}/")
        stored = [m.entries[k] for k in keys if not m.entries[k].inline]
        nbytes = sum(e.nbytes for e in stored)
        lines.append(f"{section}: {len(stored)} tensors, {human(nbytes)}, {len(keys) - len(stored)} inline values")
        record["sections"][section] = {"tensors": len(stored), "bytes": nbytes, "values": len(keys) - len(stored)}
        if tensors:
            for k in keys:
                e = m.entries[k]
                lines.append(f"  {k}  {'= ' + repr(e.value) if e.inline else f'{e.dtype}{list(e.shape)}  {e.file}'}")
    info = m.meta.get("optimizer")
    if info:
        groups = [decode_value(g) for g in info.get("param_groups", [])]
        lines.append(f"optimizer: {info.get('class')}, {len(info.get('params', []))} parameters in {len(groups)} "
                     f"group(s), {'sharded' if info.get('sharded') else 'replicated'} when saved")
        for i, g in enumerate(groups):
            hyper = ", ".join(f"{k}={v}" for k, v in g.items() if k != "params")
            lines.append(f"  group {i}: {len(g.get('params', []))} parameters; {hyper}")
        record["optimizer"] = {"class": info.get("class"), "parameters": len(info.get("params", [])),
                               "groups": len(groups), "sharded": bool(info.get("sharded"))}
    per_rank: dict[int, int] = {}
    for f in m.files.values():
        per_rank[f.rank] = per_rank.get(f.rank, 0) + f.nbytes
    lines.append("bytes per rank: " + ", ".join(f"{r}: {human(n)}" for r, n in sorted(per_rank.items())))
    lines.append(f"extra: {json.dumps(m.extra)}")
    return lines, record


def write_npz(ckpt: Checkpoint, out: str, optimizer_out: str | None) -> list[str]:
    """The model's tensors (and the optimizer's, keyed ``state/<param>/<slot>``) as ``.npz`` files."""
    m = ckpt.manifest
    model = {k.removeprefix("model/"): ckpt.reader.array(k) for k in m.keys("model/") if not m.entries[k].inline}
    np.savez(out, **model)  # type: ignore[arg-type]
    lines = [f"{out}: {len(model)} model tensors"]
    if optimizer_out is not None:
        state = {k.removeprefix("optimizer/"): np.asarray(ckpt.reader.array(k) if not m.entries[k].inline
                                                          else m.entries[k].value)
                 for k in m.keys("optimizer/")}
        np.savez(optimizer_out, **state)  # type: ignore[arg-type]
        lines.append(f"{optimizer_out}: {len(state)} optimizer values")
    return lines


def find_writer(out: str) -> tuple[str, Callable[..., list[str]] | None, str]:
    """The suffix of ``out`` a writer is registered for, the writer, and what to install if it
    cannot load (None and an empty hint when nothing is registered for it)."""
    found: list[tuple[str, importlib.metadata.EntryPoint]] = [
        (ep.name, ep) for ep in importlib.metadata.entry_points(group=WRITERS) if out.endswith("." + ep.name)]
    if not found:
        return "", None, ""
    suffix, entry = max(found, key=lambda f: len(f[0]))
    try:
        return suffix, entry.load(), ""
    except ImportError as exc:
        return suffix, None, missing_extra(entry, exc, DISTRIBUTION)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ddl checkpoint", description=plain(__doc__),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    ins = sub.add_parser("inspect", help="list what a checkpoint holds")
    ins.add_argument("path")
    ins.add_argument("--verify", action="store_true", help="check every file's sha256")
    ins.add_argument("--tensors", action="store_true", help="list every tensor")
    ins.add_argument("--json", metavar="FILE", help="also write the listing as JSON")
    con = sub.add_parser("consolidate", help="write a plain one-process file (.pt, .weights.h5, .npz)")
    con.add_argument("path")
    con.add_argument("-o", "--output", required=True, help="model.pt, model.weights.h5 or model.npz")
    con.add_argument("--optimizer", metavar="FILE", help="also the optimizer's state, as a one-process state_dict")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "inspect":
            lines, record = describe(Checkpoint.open(args.path), verify=args.verify, tensors=args.tensors)
            print("\n".join(lines))
            if args.json:
                Path(args.json).write_text(json.dumps(record, indent=1))
            return 0
        out = str(args.output)
        if out.endswith(".npz"):
            lines = write_npz(Checkpoint.open(args.path), out, args.optimizer)
        else:
            suffix, writer, hint = find_writer(out)
            if writer is None:
                known = sorted({"npz", *(ep.name for ep in importlib.metadata.entry_points(group=WRITERS))})
                print(f"ddl checkpoint consolidate: {out}: " + (f".{suffix} {hint}" if suffix else
                      f"no writer for this kind of file; name it *.{', *.'.join(known)}"), file=sys.stderr)
                return 2
            lines = writer(args.path, out, args.optimizer)
        print("\n".join(lines))
        return 0
    except CheckpointError as exc:
        print(f"ddl checkpoint: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
