"""Caffe's record databases (``data_param.backend``: LEVELDB, the default, or LMDB): which one a folder holds, the
endless sharded reader the Data layer draws from, and writing one."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ddl.caffe.data.leveldb_store import LevelDbRecords, is_leveldb, write_leveldb
from ddl.caffe.data.lmdb_store import LmdbRecords, is_lmdb, write_lmdb
from ddl.caffe.formats import schema
from ddl.caffe.formats.errors import CaffeFormatError

log = logging.getLogger("ddl.caffe")

LEVELDB, LMDB = 0, 1                 # caffe.proto's DataParameter.DB
NAMES = {LEVELDB: "LEVELDB", LMDB: "LMDB"}


def backend_of(path: str | Path) -> int | None:
    """LEVELDB or LMDB by the files of the folder ``path``; None when it holds neither."""
    if is_lmdb(path):
        return LMDB
    if is_leveldb(path):
        return LEVELDB
    return None


def choose_backend(path: str | Path, backend: int, *, given: bool, where: str) -> int:
    """The store to read ``path`` with: ``backend`` as written (Caffe's default LEVELDB when ``given`` is False).

    An unset backend over an LMDB reads the LMDB, with one warning (Caffe stops there: its default is LevelDB);
    a backend set to the other kind of store is an error naming both.

    Raises:
        CaffeFormatError: the folder holds no database, or the other kind than the one asked for.
    """
    found = backend_of(path)
    if found is None:
        want = NAMES[backend] if given else "LEVELDB (Caffe's default, as data_param.backend is unset)"
        raise CaffeFormatError(f"{where}: {path} holds no database (expected {want}); make one with 'ddl-caffe convert'")
    if found == backend:
        return found
    if not given:
        log.warning("%s: data_param.backend is unset, so Caffe would read %s as a LevelDB; it is an LMDB and is read as "
                    "one (add backend: LMDB to run the net in Caffe too)", where, path)
        return found
    raise CaffeFormatError(f"{where}: data_param.backend is {NAMES[backend]} but {path} is a {NAMES[found]}; set "
                           f"backend: {NAMES[found]}")


class DatumReader:
    """Endless records of one database in key order, wrapping like Caffe; rank r of n keeps the records whose
    running offset % n == r. ``cursor`` (first/next/key/value), ``count`` and ``offset`` are what elastic training
    repositions."""

    def __init__(self, path: str | Path, *, backend: int = LMDB, rank: int = 0, size: int = 1) -> None:
        self.path, self.rank, self.size = str(path), rank, size
        records = LmdbRecords(path) if backend == LMDB else LevelDbRecords(path)
        self.records = records
        self.count = records.count
        if self.count == 0:
            raise CaffeFormatError(f"{path}: the {NAMES[backend]} is empty")
        self.cursor = records.cursor
        self.cursor.first()
        self.offset = 0
        self.restarts = 0

    def _advance(self) -> None:
        if not self.cursor.next():
            self.cursor.first()
            self.restarts += 1
        self.offset += 1

    def skip(self, records: int) -> None:
        """Move the stream's start ``records`` records on, for every rank alike (Caffe's ``rand_skip``)."""
        for _ in range(records):
            if not self.cursor.next():
                self.cursor.first()

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
        return schema.Datum.FromString(self.cursor.value())


def write_db(path: str | Path, records: Iterator[tuple[str, Any]], *, backend: int = LMDB) -> int:
    """Write (key, Datum) records into a new database of ``backend`` at ``path``; returns how many."""
    return write_lmdb(path, records) if backend == LMDB else write_leveldb(path, records)
