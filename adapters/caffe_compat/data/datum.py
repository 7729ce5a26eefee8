"""Caffe's Datum record: decoded to a (C, H, W) array (raw or encoded images) and made from one."""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from ddl.caffe.formats import schema


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
