"""BlobProto <-> numpy: shapes (current and legacy), data, and truncated files caught."""

from __future__ import annotations

from typing import Any

import numpy as np

from ddl.caffe.formats import schema
from ddl.caffe.formats.errors import CaffeFormatError


def blob_shape(b: Any) -> tuple[int, ...]:
    """The shape of a BlobProto: ``shape.dim``, or the legacy num/channels/height/width."""
    if b.HasField("shape"):
        return tuple(int(d) for d in b.shape.dim)
    if b.num or b.channels or b.height or b.width:
        return (b.num, b.channels, b.height, b.width)
    return (len(b.data) or len(b.double_data),)


def to_array(b: Any, *, where: str = "blob") -> np.ndarray:
    """The data of a BlobProto as a float32 array of its shape.

    Raises:
        CaffeFormatError: the data count does not match the shape (a truncated file).
    """
    shape = blob_shape(b)
    data = np.asarray(b.double_data if len(b.double_data) else b.data, dtype=np.float32)
    want = int(np.prod(shape)) if shape else 1
    if data.size != want:
        raise CaffeFormatError(
            f"{where}: shape {list(shape)} needs {want} values but the file holds {data.size}; "
            "the file is truncated or damaged")
    return data.reshape(shape)


def from_array(a: np.ndarray, *, diff: np.ndarray | None = None) -> Any:
    """A BlobProto (float data, ``shape`` set) holding ``a`` (and ``diff`` if given)."""
    b = schema.BlobProto()
    b.shape.dim.extend(int(d) for d in a.shape)
    b.data.extend(np.ascontiguousarray(a, dtype=np.float32).ravel().tolist())
    if diff is not None:
        b.diff.extend(np.ascontiguousarray(diff, dtype=np.float32).ravel().tolist())
    return b
