"""``ddl-caffe convert``: an LMDB or LevelDB of Datum records from numpy arrays (.npz/.npy) or an image list."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ddl.caffe.data.database import LMDB, write_db
from ddl.caffe.data.datum import array_datum
from ddl.caffe.formats import schema
from ddl.caffe.formats.errors import CaffeFormatError

log = logging.getLogger("ddl.caffe")


def _array_records(x: np.ndarray, y: np.ndarray, order: np.ndarray) -> Iterator[tuple[str, Any]]:
    for n, i in enumerate(order):
        yield f"{n:08d}", array_datum(x[i], int(y[i]))


def from_arrays(out: str | Path, x: np.ndarray, y: np.ndarray, *, shuffle: bool = False, seed: int = 0,
                backend: int = LMDB) -> int:
    """Write images ``x`` ((N,H,W) or (N,C,H,W); uint8 stays bytes, else float_data) with labels ``y``."""
    x, y = np.asarray(x), np.asarray(y).reshape(-1)
    if x.ndim not in (3, 4) or x.shape[0] != y.shape[0]:
        raise CaffeFormatError(f"images must be (N,H,W) or (N,C,H,W) with one label each; got {list(x.shape)} and {y.shape[0]} labels")
    if not np.all(y == np.round(y)):
        raise CaffeFormatError("labels must be integers")
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed)).numpy() if shuffle else np.arange(len(y))
    return write_db(out, _array_records(x, y, order), backend=backend)


def from_npz(out: str | Path, path: str | Path, *, x_key: str = "x", y_key: str = "y", shuffle: bool = False, seed: int = 0,
             backend: int = LMDB) -> int:
    """Convert the arrays ``x_key`` and ``y_key`` of an .npz file."""
    with np.load(path) as f:
        for k in (x_key, y_key):
            if k not in f:
                raise CaffeFormatError(f"{path}: no array '{k}' (arrays: {sorted(f.keys())}); pick them with --x-key/--y-key")
        return from_arrays(out, f[x_key], f[y_key], shuffle=shuffle, seed=seed, backend=backend)


def _image_records(lines: list[tuple[str, int]], root: Path, *, encoded: bool, gray: bool,
                   size: tuple[int, int] | None) -> Iterator[tuple[str, Any]]:
    from PIL import Image
    for n, (name, label) in enumerate(lines):
        p = root / name
        try:
            img: Any = Image.open(p)
            img = img.convert("L" if gray else "RGB")
        except OSError as e:
            raise CaffeFormatError(f"{p}: cannot read the image ({e})") from None
        if size is not None:
            img = img.resize((size[1], size[0]), Image.Resampling.BILINEAR)
        if encoded:
            buf = io.BytesIO()
            img.save(buf, format="PNG")
            d = schema.Datum(data=buf.getvalue(), label=label, encoded=True)
        else:
            arr = np.asarray(img)
            arr = arr[None] if arr.ndim == 2 else arr[:, :, ::-1].transpose(2, 0, 1)   # Caffe stores BGR
            d = array_datum(np.ascontiguousarray(arr), label)
        yield f"{n:08d}_{name}", d


def from_image_list(out: str | Path, listfile: str | Path, root: str | Path = "", *, encoded: bool = False,
                    gray: bool = False, size: tuple[int, int] | None = None, shuffle: bool = False, seed: int = 0,
                    backend: int = LMDB) -> int:
    """Caffe's convert_imageset: ``listfile`` holds ``path label`` lines, paths relative to ``root``."""
    lines = []
    for k, ln in enumerate(Path(listfile).read_text().splitlines(), 1):
        if not ln.strip():
            continue
        name, _, label = ln.strip().rpartition(" ")
        if not name or not label.lstrip("-").isdigit():
            raise CaffeFormatError(f"{listfile}:{k}: expected '<path> <integer label>', got {ln!r}")
        lines.append((name, int(label)))
    if shuffle:
        lines = [lines[i] for i in torch.randperm(len(lines), generator=torch.Generator().manual_seed(seed)).tolist()]
    return write_db(out, _image_records(lines, Path(root), encoded=encoded, gray=gray, size=size), backend=backend)
