"""A checkpoint's data files: written aligned, hashed and synced; read back only once verified.

Every save writes new files, named by its save id, beside the previous save's; the
manifest that names them replaces the old one atomically (``os.replace`` of a synced
temporary file) once every rank's files are on disk. A process killed at any moment
therefore leaves the previous manifest and every file it names intact. The files no
manifest names any more are removed after the commit.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

from ddl.base.atomic_write import write_atomically
from ddl.base.dtypes import bfloat16
from ddl.checkpoint.manifest import MANIFEST, CheckpointError, Entry, FileRecord, Manifest

#: Each tensor starts on this many bytes in its file (a memory map of it is aligned).
ALIGN = 64
_CHUNK = 8 << 20
_DATA_FILE = re.compile(r"^[a-z]+-r\d{5}\.[0-9a-z-]+\.bin$")
_TEMPORARY = re.compile(r"^\.manifest\.[0-9a-z-]+\.tmp$")


@dataclasses.dataclass(frozen=True)
class Tensor:
    """A tensor an adapter hands the core to store: its bytes, dtype name and shape.

    ``data`` is any contiguous array holding the tensor's bytes (its own dtype, or uint8
    for types numpy lacks); ``dtype`` is the neutral name (``float32``, ``bfloat16``...).
    """

    data: np.ndarray
    dtype: str
    shape: tuple[int, ...]

    @classmethod
    def of(cls, array: np.ndarray) -> Tensor:
        """A numpy array as a :class:`Tensor`.

        Example:
            >>> Tensor.of(np.zeros((2, 3), np.float32)).dtype
            'float32'
        """
        shape = tuple(int(n) for n in np.shape(array))  # before ascontiguousarray, which makes 0-d arrays 1-d
        array = np.ascontiguousarray(array)
        return cls(array, array.dtype.name, shape)


def data_file_name(section: str, rank: int, save_id: str) -> str:
    """The name of ``rank``'s file of ``section`` in save ``save_id``.

    Example:
        >>> data_file_name("optimizer", 3, "1a2b")
        'optimizer-r00003.1a2b.bin'
    """
    return f"{section}-r{rank:05d}.{save_id}.bin"


def write_data_file(folder: Path, name: str, rank: int,
                    tensors: Mapping[str, Tensor]) -> tuple[FileRecord, dict[str, Entry]]:
    """Write ``tensors`` into ``folder/name`` (aligned, hashed, synced to disk).

    Returns:
        The file's record and each tensor's entry.

    Raises:
        OSError: the file could not be written.
    """
    digest = hashlib.sha256()
    entries: dict[str, Entry] = {}
    offset = 0
    with open(folder / name, "wb") as f:
        for key, t in tensors.items():
            pad = -offset % ALIGN
            if pad:
                f.write(bytes(pad))
                digest.update(bytes(pad))
                offset += pad
            raw = np.ascontiguousarray(t.data).reshape(-1).view(np.uint8)
            f.write(raw.data)
            digest.update(raw.data)
            entries[key] = Entry(dtype=t.dtype, shape=tuple(int(n) for n in t.shape), file=name, offset=offset,
                                 nbytes=raw.nbytes)
            offset += raw.nbytes
        f.flush()
        os.fsync(f.fileno())
    return FileRecord(name, rank, offset, digest.hexdigest()), entries


def commit_manifest(folder: Path, manifest: Manifest) -> None:
    """Replace ``folder``'s manifest with ``manifest`` in one atomic step (the save's commit)."""
    # The temporary name is one remove_stale knows, for a save killed before its commit.
    write_atomically(folder / MANIFEST, manifest.write_text(), temporary=folder / f".manifest.{manifest.save_id}.tmp",
                     durable=True)


def remove_stale(folder: Path, keep: Iterable[str]) -> list[str]:
    """Remove the data files and temporary manifests of other saves (finished, abandoned or
    killed) that ``keep`` does not name; return their names."""
    kept = set(keep)
    gone = []
    for path in folder.iterdir():
        if path.name not in kept and (_DATA_FILE.match(path.name) or _TEMPORARY.match(path.name)):
            path.unlink(missing_ok=True)
            gone.append(path.name)
    return sorted(gone)


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype for a neutral dtype name (bfloat16 through ml_dtypes).

    Raises:
        CheckpointError: numpy has no such dtype here.
    """
    if name == "bfloat16":
        found = bfloat16()
        if found is None:
            raise CheckpointError("this checkpoint holds bfloat16 tensors; reading them as numpy arrays needs "
                                  "ml_dtypes (pip install ml_dtypes)")
        return found
    try:
        return np.dtype(name)
    except TypeError:
        raise CheckpointError(f"this checkpoint holds tensors of dtype {name!r}, which numpy does not know") from None


class Reader:
    """Reads a checkpoint's entries, each file checked against its sha256 before its first use.

    Example:
        >>> reader = Reader(folder, read_manifest(folder))  # doctest: +SKIP
        >>> reader.array("model/fc.weight").shape           # doctest: +SKIP
    """

    def __init__(self, folder: str | Path, manifest: Manifest) -> None:
        self.folder = Path(folder)
        self.manifest = manifest
        self._verified: set[str] = set()

    def verify(self, name: str) -> None:
        """Check file ``name``'s size and sha256 against the manifest (once).

        Raises:
            CheckpointError: the file is missing, of another size, or its digest differs.
        """
        if name in self._verified:
            return
        record = self.manifest.files[name]
        path = self.folder / name
        try:
            size = path.stat().st_size
            if size != record.nbytes:
                raise CheckpointError(f"{path}: {size} bytes, the manifest's field files[{name!r}].nbytes says "
                                      f"{record.nbytes}: the file is truncated or replaced")
            digest = hashlib.sha256()
            with open(path, "rb") as f:
                while chunk := f.read(_CHUNK):
                    digest.update(chunk)
        except FileNotFoundError:
            raise CheckpointError(f"{path}: missing; the manifest (field files[{name!r}], written by rank "
                                  f"{record.rank}) needs it") from None
        except OSError as exc:
            raise CheckpointError(f"{path}: cannot be read ({exc})") from None
        if digest.hexdigest() != record.sha256:
            raise CheckpointError(f"{path}: corrupt: its sha256 is {digest.hexdigest()}, the manifest's field "
                                  f"files[{name!r}].sha256 says {record.sha256}")
        self._verified.add(name)

    def entry(self, key: str) -> Entry:
        """The entry of ``key``.

        Raises:
            CheckpointError: the checkpoint has no such entry.
        """
        found = self.manifest.entries.get(key)
        if found is None:
            raise CheckpointError(f"{self.folder / MANIFEST}: no entry {key!r} in field entries")
        return found

    def raw(self, key: str) -> np.ndarray:
        """The bytes of tensor ``key`` (a fresh uint8 array), its file verified first."""
        e = self.entry(key)
        if e.inline:
            raise CheckpointError(f"{self.folder / MANIFEST}: entry {key!r} is a value, not a tensor")
        self.verify(e.file)
        return np.fromfile(self.folder / e.file, dtype=np.uint8, count=e.nbytes, offset=e.offset)

    def array(self, key: str) -> np.ndarray:
        """Tensor ``key`` as a numpy array of its dtype and shape."""
        e = self.entry(key)
        return self.raw(key).view(numpy_dtype(e.dtype)).reshape(e.shape)

    def value(self, key: str) -> object:
        """The inline value ``key`` (not a tensor)."""
        e = self.entry(key)
        if not e.inline:
            raise CheckpointError(f"{self.folder / MANIFEST}: entry {key!r} is a tensor, not a value")
        return e.value
