"""LMDB, one of Caffe's two record stores: opened read-only and shared per path, walked by a cursor, written in batches."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ddl.caffe.formats.errors import CaffeFormatError

_OPEN: dict[str, Any] = {}   # py-lmdb allows one environment per path and process: readers share it


def is_lmdb(path: str | Path) -> bool:
    return (Path(path) / "data.mdb").is_file()


def open_lmdb(path: str | Path) -> Any:
    """The read-only environment of the LMDB folder ``path``, shared per path in this process.

    Raises:
        CaffeFormatError: no LMDB there.
    """
    import lmdb
    p = Path(path)
    if not is_lmdb(p):
        raise CaffeFormatError(f"{p}: no LMDB here (expected {p / 'data.mdb'}); make one with 'ddl-caffe convert'")
    key = str(p.resolve())
    if key not in _OPEN:
        _OPEN[key] = lmdb.open(key, readonly=True, lock=False, readahead=False, subdir=True)
    return _OPEN[key]


class LmdbRecords:
    """The records of one LMDB in key order: ``count``, and a ``cursor`` with first/next/key/value."""

    def __init__(self, path: str | Path) -> None:
        env = open_lmdb(path)
        self.count = int(env.stat()["entries"])
        self.txn = env.begin(buffers=False)
        self.cursor = self.txn.cursor()


def write_lmdb(path: str | Path, records: Iterator[tuple[str, Any]], *, map_size: int = 1 << 36) -> int:
    """Write (key, Datum) records into a new LMDB at ``path``; returns how many."""
    import lmdb
    p = Path(path)
    old = _OPEN.pop(str(p.resolve()), None)
    if old is not None:
        old.close()
    p.mkdir(parents=True, exist_ok=True)
    env = lmdb.open(str(p), map_size=map_size, subdir=True, meminit=False)
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
