"""LevelDB, Caffe's default record store (``data_param.backend`` unset): opened through plyvel, walked by a cursor,
written in batches with Caffe's options.

LevelDB lets one process open a database at a time (its LOCK file). Readers in one process share one handle; a
process that finds the lock held (another rank reading the same source) reads a private snapshot instead: hard
links to the database's files in a sibling folder, removed when the process exits. Table files never change once
written, so the snapshot holds the same records and the user's folder is left as it was.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ddl.caffe.formats.errors import CaffeFormatError

_OPEN: dict[str, Any] = {}          # one plyvel handle per database and process
WRITE_BUFFER = 256 << 20            # Caffe's db_leveldb.cpp: write_buffer_size
BATCH = 1000                        # records per write batch (Caffe's convert tools commit every 1000)


def is_leveldb(path: str | Path) -> bool:
    p = Path(path)
    return (p / "CURRENT").is_file() and any(p.glob("MANIFEST-*"))


def _plyvel() -> Any:
    try:
        import plyvel
    except ImportError:
        raise CaffeFormatError("reading or writing a LevelDB needs plyvel: pip install 'ddl-runtime[caffe]' "
                               "(or pip install plyvel)") from None
    return plyvel


def _snapshot(src: Path) -> Path:
    """A private copy of ``src`` made of hard links (a plain copy where links are impossible), removed at exit."""
    try:
        dest = Path(tempfile.mkdtemp(prefix=f".{src.name}.ddl-{os.getpid()}-", dir=src.parent))
    except OSError:
        dest = Path(tempfile.mkdtemp(prefix=f"ddl-leveldb-{os.getpid()}-"))
    atexit.register(shutil.rmtree, dest, True)
    for f in src.iterdir():
        if f.name == "LOCK" or not f.is_file():
            continue
        try:
            os.link(f, dest / f.name)
        except OSError:
            shutil.copy2(f, dest / f.name)
    return dest


def open_leveldb(path: str | Path, *, attempts: int = 5) -> Any:
    """A plyvel handle on the LevelDB folder ``path``, shared per path in this process (a snapshot when another
    process holds the database's lock).

    Raises:
        CaffeFormatError: no LevelDB there, or it cannot be opened (the message says why).
    """
    plyvel = _plyvel()
    p = Path(path)
    if not is_leveldb(p):
        raise CaffeFormatError(f"{p}: no LevelDB here (expected {p / 'CURRENT'} and a MANIFEST file); make one with "
                               "'ddl-caffe convert --backend leveldb'")
    key = str(p.resolve())
    if key in _OPEN:
        return _OPEN[key]
    error: Exception | None = None
    for attempt in range(attempts):
        try:
            _OPEN[key] = plyvel.DB(key, create_if_missing=False)
            return _OPEN[key]
        except plyvel.IOError as e:
            if "lock" not in str(e).lower():
                raise CaffeFormatError(f"{p}: cannot open the LevelDB ({e})") from None
        except plyvel.Error as e:
            raise CaffeFormatError(f"{p}: cannot open the LevelDB ({e})") from None
        # Another process (another rank) holds it: read a snapshot. Its files can change while it recovers a
        # log on opening, so a snapshot that does not open is taken again.
        snap = _snapshot(Path(key))
        try:
            _OPEN[key] = plyvel.DB(str(snap), create_if_missing=False)
            return _OPEN[key]
        except plyvel.Error as e:
            error = e
            shutil.rmtree(snap, ignore_errors=True)
            time.sleep(0.1 * (attempt + 1))
    raise CaffeFormatError(f"{p}: another process holds the LevelDB and no snapshot of it opened ({error})")


class LevelDbCursor:
    """LMDB's cursor calls (first, next, key, value) over a LevelDB iterator."""

    def __init__(self, db: Any) -> None:
        self.it = db.raw_iterator()

    def first(self) -> bool:
        self.it.seek_to_first()
        return bool(self.it.valid())

    def next(self) -> bool:
        self.it.next()
        return bool(self.it.valid())

    def key(self) -> bytes:
        return bytes(self.it.key())

    def value(self) -> bytes:
        return bytes(self.it.value())


class LevelDbRecords:
    """The records of one LevelDB in key order: ``count`` (one pass over the keys), and a ``cursor``."""

    def __init__(self, path: str | Path) -> None:
        db = open_leveldb(path)
        self.count = sum(1 for _ in db.iterator(include_value=False))
        self.cursor = LevelDbCursor(db)


def write_leveldb(path: str | Path, records: Iterator[tuple[str, Any]]) -> int:
    """Write (key, Datum) records into a new LevelDB at ``path`` (it must not exist, as Caffe's NEW mode); returns
    how many.

    Raises:
        CaffeFormatError: ``path`` exists.
    """
    plyvel = _plyvel()
    p = Path(path)
    old = _OPEN.pop(str(p.resolve()), None)
    if old is not None:
        old.close()
    if p.exists():
        raise CaffeFormatError(f"{p} exists; a LevelDB is written to a new folder (remove it, or pick another)")
    db = plyvel.DB(str(p), create_if_missing=True, error_if_exists=True, write_buffer_size=WRITE_BUFFER,
                   max_open_files=100)
    n = 0
    batch = db.write_batch()
    for key, d in records:
        batch.put(key.encode(), d.SerializeToString())
        n += 1
        if n % BATCH == 0:
            batch.write()
            batch = db.write_batch()
    batch.write()
    db.close()
    return n
