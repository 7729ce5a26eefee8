"""LMDB of Datum records: opening, reading (sharded per rank, wrapping like Caffe) and writing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ddl.caffe.formats import schema
from ddl.caffe.formats.errors import CaffeFormatError

_OPEN: dict[str, Any] = {}   # py-lmdb allows one environment per path and process: readers share it


def open_lmdb(path: str | Path, *, write: bool = False, map_size: int = 1 << 36) -> Any:
    """Open an LMDB directory (read-only, shared per path, unless ``write``)."""
    import lmdb
    p = Path(path)
    if not write and not (p / "data.mdb").exists():
        # Caffe's default backend is LevelDB: V1-era files (CIFAR-10's, the siamese example's) leave it unset.
        if (p / "CURRENT").is_file() and any(p.glob("*.ldb")) or any(p.glob("*.sst")):
            raise CaffeFormatError(f"{p}: this is a LevelDB (Caffe's default when data_param.backend is unset); ddl-caffe "
                                   "reads LMDB only: write the records to an LMDB with 'ddl-caffe convert', or re-run "
                                   "Caffe's convert tool with -backend lmdb, and point source at it")
        raise CaffeFormatError(f"{p}: no LMDB here (expected {p / 'data.mdb'}); make one with 'ddl-caffe convert'")
    if write:
        p.mkdir(parents=True, exist_ok=True)
        return lmdb.open(str(p), map_size=map_size, subdir=True, meminit=False)
    key = str(p.resolve())
    if key not in _OPEN:
        _OPEN[key] = lmdb.open(key, readonly=True, lock=False, readahead=False, subdir=True)
    return _OPEN[key]


class LmdbReader:
    """Endless records of one LMDB in key order; rank r of n keeps records whose running offset % n == r."""

    def __init__(self, path: str | Path, *, rank: int = 0, size: int = 1) -> None:
        self.path, self.rank, self.size = str(path), rank, size
        self.env = open_lmdb(path)
        self.count = int(self.env.stat()["entries"])
        if self.count == 0:
            raise CaffeFormatError(f"{path}: the LMDB is empty")
        self.txn = self.env.begin(buffers=False)
        self.cursor = self.txn.cursor()
        self.cursor.first()
        self.offset = 0
        self.restarts = 0

    def _advance(self) -> None:
        if not self.cursor.next():
            self.cursor.first()
            self.restarts += 1
        self.offset += 1

    def next_raw(self) -> tuple[bytes, bytes]:
        """(key, serialized Datum) of the next record that belongs to this rank."""
        while self.offset % self.size != self.rank:
            self._advance()
        kv = (self.cursor.key(), self.cursor.value())
        self._advance()
        return kv

    def next(self) -> Any:
        """The next Datum that belongs to this rank."""
        return schema.Datum.FromString(self.next_raw()[1])

    def peek(self) -> Any:
        d = schema.Datum()
        d.ParseFromString(self.cursor.value())
        return d


def write_lmdb(path: str | Path, records: Iterator[tuple[str, Any]]) -> int:
    """Write (key, Datum) records into a new LMDB; returns how many."""
    old = _OPEN.pop(str(Path(path).resolve()), None)
    if old is not None:
        old.close()
    env = open_lmdb(path, write=True)
    n = 0
    txn = env.begin(write=True)
    for key, d in records:
        txn.put(key.encode(), d.SerializeToString())
        n += 1
        if n % 1000 == 0:
            txn.commit()
            txn = env.begin(write=True)
    txn.commit()
    env.close()
    return n
