"""The checkpoint manifest: what a checkpoint holds, where each tensor lies, and each file's digest.

One JSON file, ``manifest.json``, written last (its atomic replacement commits a save).
Framework-neutral: tensors are named (``model/<name>``, ``optimizer/state/<param>/<slot>``)
and described by dtype name, shape, file and byte offset; values that are not tensors
(an SGD momentum buffer that is None, a Python step count) are stored inline. The
optimizer's description (class, parameter names in group order, hyperparameters) and
the user's ``extra`` are JSON too, so ``ddl checkpoint inspect`` reads a checkpoint
without any framework installed.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

FORMAT = "ddl-checkpoint"
VERSION = 1
MANIFEST = "manifest.json"


class CheckpointError(ValueError):
    """A checkpoint that cannot be used as asked: the message names the file and the field."""


@dataclasses.dataclass(frozen=True)
class FileRecord:
    """One data file of a save: the rank that wrote it, its size and sha256."""

    name: str
    rank: int
    nbytes: int
    sha256: str


@dataclasses.dataclass(frozen=True)
class Entry:
    """One stored tensor (``file`` set) or inline value (``value``)."""

    dtype: str = ""
    shape: tuple[int, ...] = ()
    file: str = ""
    offset: int = 0
    nbytes: int = 0
    value: Any = None

    @property
    def inline(self) -> bool:
        return not self.file

    def to_json(self) -> dict[str, Any]:
        if self.inline:
            return {"value": encode_value(self.value)}
        return {"dtype": self.dtype, "shape": list(self.shape), "file": self.file, "offset": self.offset,
                "nbytes": self.nbytes}


@dataclasses.dataclass(frozen=True)
class Manifest:
    """A whole checkpoint's description (see the module docstring).

    Attributes:
        framework: ``torch`` or ``keras``: whose adapter wrote it.
        world_size: ranks that saved it.
        save_id: names this save's files (a new save writes beside the old one).
        files: the data files, by name.
        entries: every tensor and inline value, by key.
        meta: the adapter's description (model names, optimizer class and groups).
        extra: the user's ``extra=``.
    """

    framework: str
    world_size: int
    save_id: str
    files: dict[str, FileRecord]
    entries: dict[str, Entry]
    meta: dict[str, Any]
    extra: dict[str, Any]

    def keys(self, prefix: str) -> list[str]:
        """The entry keys under ``prefix`` (``"model/"``), in saved order."""
        return [k for k in self.entries if k.startswith(prefix)]

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "framework": self.framework, "world_size": self.world_size,
                "save_id": self.save_id,
                "files": [dataclasses.asdict(f) for f in self.files.values()],
                "entries": {k: e.to_json() for k, e in self.entries.items()},
                "meta": self.meta, "extra": encode_value(self.extra, "extra")}

    def write_text(self) -> str:
        return json.dumps(self.to_json(), indent=1, allow_nan=False)


def read_manifest(folder: str | Path) -> Manifest:
    """The manifest of the checkpoint in ``folder``.

    Raises:
        CheckpointError: no checkpoint there, or its manifest is damaged or of another
            format or version (the message names the file and the field).

    Example:
        >>> read_manifest("/nonexistent")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ddl.checkpoint.manifest.CheckpointError: no ddl checkpoint at /nonexistent: .../manifest.json does not exist...
    """
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise CheckpointError(f"no ddl checkpoint at {folder}: {path} does not exist (a save that never "
                              "completed leaves none; pass the folder given to save())")
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: not a readable manifest ({exc})") from None
    return parse_manifest(raw, path)


def parse_manifest(raw: Any, path: Path | str = MANIFEST) -> Manifest:
    """A :class:`Manifest` from its JSON form, every field checked.

    Raises:
        CheckpointError: naming ``path`` and the first field that is missing or malformed.
    """
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise CheckpointError(f"{path}: field 'format' is {raw.get('format') if isinstance(raw, dict) else raw!r}, "
                              f"not {FORMAT!r}: not a ddl checkpoint manifest")
    if raw.get("version") != VERSION:
        raise CheckpointError(f"{path}: field 'version' is {raw.get('version')!r}; this ddl reads version {VERSION}")
    try:
        files = {}
        for i, f in enumerate(raw["files"]):
            field = f"files[{i}]"
            files[str(f["name"])] = FileRecord(str(f["name"]), int(f["rank"]), int(f["nbytes"]), str(f["sha256"]))
        entries = {}
        for key, e in raw["entries"].items():
            field = f"entries[{key!r}]"
            if "value" in e:
                entries[key] = Entry(value=decode_value(e["value"]))
                continue
            entry = Entry(dtype=str(e["dtype"]), shape=tuple(int(n) for n in e["shape"]), file=str(e["file"]),
                          offset=int(e["offset"]), nbytes=int(e["nbytes"]))
            if entry.file not in files:
                raise CheckpointError(f"{path}: field {field}.file names {entry.file!r}, which is not among the "
                                      "checkpoint's files")
            entries[key] = entry
        field = "framework"
        framework, world = str(raw["framework"]), int(raw["world_size"])
        field = "meta"
        meta, extra = dict(raw["meta"]), dict(decode_value(raw.get("extra") or {}))
        return Manifest(framework, world, str(raw["save_id"]), files, entries, meta, extra)
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: field {locals().get('field', '?')} is missing or malformed ({exc!r})") from None


# -- values that are not tensors (hyperparameters, inline state, extra) ------------------------
def encode_value(value: Any, where: str = "value") -> Any:
    """``value`` as JSON: tuples tagged so they come back as tuples, non-finite floats as
    strings; dict keys must be strings.

    Raises:
        TypeError: a value JSON cannot hold, naming where it was.

    Example:
        >>> encode_value({"betas": (0.9, 0.999), "lr": 0.1, "foreach": None})
        {'betas': {'tuple': [0.9, 0.999]}, 'lr': 0.1, 'foreach': None}
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, tuple):
        return {"tuple": [encode_value(v, f"{where}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [encode_value(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"{where}: checkpoint values need string keys, got {k!r}")
            out[k] = encode_value(v, f"{where}[{k!r}]")
        return {"dict": out} if set(out) & {"tuple", "float", "dict"} and len(out) == 1 else out
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):  # a numpy or framework scalar
        return encode_value(value.item(), where)
    raise TypeError(f"{where}: a checkpoint stores numbers, strings, None, lists, tuples and dicts of them; "
                    f"got {type(value).__name__}")


def decode_value(raw: Any) -> Any:
    """The inverse of :func:`encode_value`.

    Example:
        >>> decode_value({"betas": {"tuple": [0.9, 0.999]}, "eps": {"float": "inf"}})
        {'betas': (0.9, 0.999), 'eps': inf}
    """
    if isinstance(raw, list):
        return [decode_value(v) for v in raw]
    if isinstance(raw, dict):
        if len(raw) == 1 and "tuple" in raw:
            return tuple(decode_value(v) for v in raw["tuple"])
        if len(raw) == 1 and "float" in raw:
            return float(raw["float"])
        if len(raw) == 1 and "dict" in raw:
            return {k: decode_value(v) for k, v in raw["dict"].items()}
        return {k: decode_value(v) for k, v in raw.items()}
    return raw
