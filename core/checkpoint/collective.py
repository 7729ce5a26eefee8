"""Saving and opening a checkpoint from every rank at once: one commit, errors shared by all.

``save`` is a collective call: each rank writes its own files (its shard of the
optimizer state and its part of the model), the ranks gather the files' records, and
rank 0 commits the manifest; every rank returns after the commit, or raises the same
error. Loading is local reading, but its errors are agreed on with :func:`together`, so a
corrupt file that one rank reads fails every rank, not a collective later.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from ddl.checkpoint.files import (
    Reader,
    Tensor,
    commit_manifest,
    data_file_name,
    remove_stale,
    write_data_file,
)
from ddl.checkpoint.manifest import (
    CheckpointError,
    Entry,
    FileRecord,
    Manifest,
    encode_value,
    read_manifest,
)
from ddl.runtime import api, process

T = TypeVar("T")


def _world() -> tuple[int, int]:
    if not process.is_initialized():
        return 0, 1
    return process.rank(), process.size()


def new_save_id() -> str:
    """A name for one save's files, unique and ordered by time.

    Example:
        >>> len(new_save_id()) > 10
        True
    """
    return f"{time.time_ns():x}-{secrets.token_hex(3)}"


def save(folder: str | Path, tensors: Mapping[str, Tensor], values: Mapping[str, Any], *, framework: str,
         meta: dict[str, Any], extra: Mapping[str, Any] | None = None) -> Manifest:
    """Write this rank's ``tensors`` and ``values`` and commit the checkpoint (a collective).

    Keys name their section by their first part (``model/...``, ``optimizer/...``); each
    rank writes one file per section it has tensors in. ``meta`` and ``extra`` are taken
    from rank 0. The previous checkpoint in ``folder`` stays loadable until the commit, and
    its files are removed after it.

    Args:
        folder: the checkpoint's folder (on a filesystem every rank sees); made if missing.
        tensors: this rank's part of the tensors, by key.
        values: this rank's inline values (numbers, None, ...), by key.
        framework: who wrote it (``torch``, ``keras``), checked at load.
        meta: the adapter's description of the model and optimizer (JSON-able).
        extra: the user's own JSON-able values.

    Returns:
        The committed manifest.

    Raises:
        CheckpointError: on every rank, when any rank could not write (naming it and the
            file), or two ranks wrote one key.
        TypeError: ``extra`` or a value is not JSON-able (before anything is written).

    Example:
        >>> save("ckpt", {"model/w": Tensor.of(w)}, {}, framework="numpy", meta={})  # doctest: +SKIP
    """
    rank, size = _world()
    path = Path(folder)
    for key, value in values.items():
        encode_value(value, key)  # refuse what JSON cannot hold before anything is written
    user = dict(extra or {})
    encode_value(user, "extra")
    save_id = api.broadcast_object(new_save_id() if rank == 0 else None, 0,
                                   name="ddl.checkpoint.save.id") if size > 1 else new_save_id()
    sections: dict[str, dict[str, Tensor]] = {}
    for key, t in tensors.items():
        sections.setdefault(key.split("/", 1)[0], {})[key] = t
    records: list[FileRecord] = []
    entries: dict[str, Entry] = {k: Entry(value=v) for k, v in values.items()}
    error = None
    try:
        path.mkdir(parents=True, exist_ok=True)
        for section, part in sections.items():
            record, written = write_data_file(path, data_file_name(section, rank, save_id), rank, part)
            records.append(record)
            entries.update(written)
    except OSError as exc:
        error = f"rank {rank} could not write its checkpoint files in {path}: {exc}"
    gathered = api.allgather_object((records, entries, error), name="ddl.checkpoint.save.files") \
        if size > 1 else [(records, entries, error)]
    failed = next((e for _, _, e in gathered if e), None)
    if failed:
        raise CheckpointError(failed + "; the previous checkpoint there is unchanged")
    outcome: str | Manifest = _commit(path, gathered, save_id, size, framework, meta, user) if rank == 0 else ""
    if size > 1:
        outcome = api.broadcast_object(outcome, 0, name="ddl.checkpoint.save.commit")
    if isinstance(outcome, str):
        raise CheckpointError(outcome)
    return outcome


def _commit(path: Path, gathered: list[tuple[list[FileRecord], dict[str, Entry], str | None]], save_id: str,
            size: int, framework: str, meta: dict[str, Any], extra: dict[str, Any]) -> Manifest | str:
    """Rank 0's part: check the keys, write the manifest, remove the old files. A string is an error."""
    files: dict[str, FileRecord] = {}
    entries: dict[str, Entry] = {}
    for r, (records, part, _) in enumerate(gathered):
        files.update({f.name: f for f in records})
        for key, entry in part.items():
            if key in entries:
                return f"checkpoint key {key!r} was written by two ranks (rank {r} and another): an adapter bug"
            entries[key] = entry
    manifest = Manifest(framework, size, save_id, files, entries, meta, extra)
    try:
        commit_manifest(path, manifest)
    except (OSError, ValueError) as exc:
        return f"could not commit the checkpoint's manifest in {path}: {exc}; the previous checkpoint is unchanged"
    with contextlib.suppress(OSError):  # what is left, the next save removes
        remove_stale(path, files)
    return manifest


class Checkpoint:
    """An opened checkpoint: its manifest and a verifying :class:`~ddl.checkpoint.files.Reader`.

    Example:
        >>> ckpt = Checkpoint.open("ckpt")              # doctest: +SKIP
        >>> ckpt.manifest.world_size, ckpt.reader.array("model/w").shape  # doctest: +SKIP
    """

    def __init__(self, folder: str | Path, manifest: Manifest) -> None:
        self.folder = Path(folder)
        self.manifest = manifest
        self.reader = Reader(folder, manifest)

    @classmethod
    def open(cls, folder: str | Path, *, framework: str | None = None) -> Checkpoint:
        """Read ``folder``'s manifest (and check it was written by ``framework``'s adapter).

        Raises:
            CheckpointError: no checkpoint, a damaged manifest, or another framework's.
        """
        manifest = read_manifest(folder)
        if framework is not None and manifest.framework != framework:
            raise CheckpointError(f"{Path(folder) / 'manifest.json'}: field 'framework' is "
                                  f"{manifest.framework!r}; ddl.{framework}'s checkpoint.load reads only "
                                  f"{framework!r} checkpoints")
        return cls(folder, manifest)


def together(fn: Callable[[], T]) -> T:
    """Run ``fn`` on every rank; if it raises :class:`CheckpointError` on any, raise it on all.

    Raises:
        CheckpointError: the first rank's error (with its rank when it is another's).
    """
    rank, size = _world()
    try:
        result, error = fn(), None
    except CheckpointError as exc:
        result, error = None, str(exc)
    if size > 1:
        errors = api.allgather_object(error, name="ddl.checkpoint.load.agree")
        failed = next(((r, e) for r, e in enumerate(errors) if e), None)
        if failed is not None:
            r, message = failed
            raise CheckpointError(message if r == rank else f"rank {r}: {message}")
    elif error is not None:
        raise CheckpointError(error)
    return result  # type: ignore[return-value]
