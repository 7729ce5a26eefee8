"""LMDB of Datum records: reading (sharded per rank, wrapping like Caffe), decoding, transforming, writing."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import schema
from .blobs import to_array
from .textio import CaffeFormatError, read_binary

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


def datum_to_array(d: Any, *, force_color: bool = False, force_gray: bool = False) -> np.ndarray:
    """A Datum's pixels as a (C, H, W) float32 array; encoded images decode to BGR as in Caffe."""
    if d.encoded:
        from PIL import Image
        img = Image.open(io.BytesIO(d.data))
        if force_color or (img.mode not in ("L", "1", "I;16", "I") and not force_gray):
            arr = np.asarray(img.convert("RGB"))[:, :, ::-1]          # Caffe decodes with OpenCV: BGR
            return np.ascontiguousarray(arr.transpose(2, 0, 1), dtype=np.float32)
        return np.asarray(img.convert("L"), dtype=np.float32)[None]
    shape = (d.channels, d.height, d.width)
    if len(d.data):
        return np.frombuffer(d.data, dtype=np.uint8).astype(np.float32).reshape(shape)
    return np.asarray(d.float_data, dtype=np.float32).reshape(shape)


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


class Transformer:
    """Caffe's DataTransformer: crop (random in TRAIN, centre in TEST), mirror, mean, scale."""

    def __init__(self, tp: Any, phase: int, gen: torch.Generator, *, where: str) -> None:
        unsupported = [f for f in ("resize_param", "noise_param", "distort_param", "expand_param", "emit_constraint",
                                   "crop_h", "crop_w") if tp.HasField(f)]
        if unsupported:
            raise CaffeFormatError(f"{where}: transform_param {', '.join(unsupported)} (SSD's augmentation) is not "
                                   "supported by ddl-caffe; use crop_size, mirror, mean_file/mean_value and scale")
        self.scale, self.crop, self.mirror = tp.scale, tp.crop_size, tp.mirror
        self.phase, self.gen, self.where = phase, gen, where
        self.force_color, self.force_gray = tp.force_color, tp.force_gray
        self.mean: np.ndarray | None = None
        self.mean_values = list(tp.mean_value)
        if tp.HasField("mean_file"):
            if self.mean_values:
                raise CaffeFormatError(f"{where}: give mean_file or mean_value, not both")
            blob = read_binary(tp.mean_file, schema.BlobProto())
            m = to_array(blob, where=f"{tp.mean_file}")
            self.mean = m.reshape(m.shape[-3:]) if m.ndim >= 3 else m

    @property
    def per_sample(self) -> bool:
        """Whether each sample needs its own draw or mean image (else a batch transforms at once)."""
        return bool(self.crop or self.mirror or self.mean is not None)

    def batch(self, xs: np.ndarray) -> np.ndarray:
        """Transform a stacked (N, C, H, W) batch when ``per_sample`` is False."""
        c = xs.shape[1]
        if self.mean_values:
            self._check_means(c)
            xs = xs - np.asarray(self.mean_values, np.float32).reshape(1, -1, 1, 1)
        return xs * np.float32(self.scale) if self.scale != 1 else xs

    def _check_means(self, c: int) -> None:
        n = len(self.mean_values)
        if n not in (1, c):
            give = "a single mean_value" if c == 1 else f"one mean_value for all channels or one per channel ({c})"
            raise CaffeFormatError(f"{self.where}: {n} mean_value entries for {c}-channel data; give {give}, "
                                   f"or point the layer at {n}-channel data")

    def out_shape(self, c: int, h: int, w: int) -> tuple[int, int, int]:
        return (c, self.crop or h, self.crop or w)

    def _rand(self, n: int) -> int:
        return int(torch.randint(n, (1,), generator=self.gen)) if n > 1 else 0

    def __call__(self, x: np.ndarray) -> np.ndarray:
        c, h, w = x.shape
        if self.mean_values:
            self._check_means(c)
        mirror = self.mirror and self._rand(2) == 1
        ho = wo = 0
        if self.crop:
            if self.crop > h or self.crop > w:
                raise CaffeFormatError(f"{self.where}: crop_size {self.crop} exceeds the {h}x{w} image")
            if self.phase == schema.TRAIN:
                ho, wo = self._rand(h - self.crop + 1), self._rand(w - self.crop + 1)
            else:
                ho, wo = (h - self.crop) // 2, (w - self.crop) // 2
        if self.mean is not None:
            if self.mean.shape != x.shape:
                raise CaffeFormatError(f"{self.where}: mean_file shape {list(self.mean.shape)} differs from the data's {list(x.shape)}")
            x = x - self.mean
        elif self.mean_values:
            x = x - np.asarray(self.mean_values, np.float32).reshape(-1, 1, 1)
        if self.crop:
            x = x[:, ho:ho + self.crop, wo:wo + self.crop]
        if mirror:
            x = x[:, :, ::-1]
        return x * np.float32(self.scale) if self.scale != 1 else x


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


def array_datum(x: np.ndarray, label: int) -> Any:
    """A raw Datum from a (C, H, W) or (H, W) array: uint8 data when the values are bytes, else float_data."""
    a = np.asarray(x)
    if a.ndim == 2:
        a = a[None]
    d = schema.Datum(channels=a.shape[0], height=a.shape[1], width=a.shape[2], label=int(label))
    if a.dtype == np.uint8:
        d.data = a.tobytes()
    else:
        d.float_data.extend(a.astype(np.float32).ravel().tolist())
    return d
