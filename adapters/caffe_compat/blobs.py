"""BlobProto <-> numpy, and copying a .caffemodel's weights into a net, with shape checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from . import schema
from .textio import CaffeFormatError, read_binary


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


def _fits(src: tuple[int, ...], dst: tuple[int, ...]) -> bool:
    # Caffe accepts a legacy 4-D blob for a lower-rank one when the leading dims are 1
    # (e.g. InnerProduct weights stored as 1x1xNxK).
    if src == dst:
        return True
    if len(src) == 4 and len(dst) < 4:
        return src[: 4 - len(dst)] == (1,) * (4 - len(dst)) and src[4 - len(dst):] == dst
    return False


def copy_trained_layers(net: Any, weights: Any, *, source: str) -> int:
    """Copy blobs of same-named layers from a NetParameter into ``net`` (Caffe's CopyTrainedLayersFrom).

    Layers of the model absent from the net are ignored, as in Caffe.

    Returns:
        The number of layers copied.

    Raises:
        CaffeFormatError: a layer's blob count or a blob's shape differs (both named), or data
            is missing.
    """
    copied = 0
    for lp in weights.layer:
        layer = net.layer_by_name(lp.name)
        if layer is None or not len(lp.blobs):
            continue
        own = layer.blobs
        if len(lp.blobs) != len(own):
            raise CaffeFormatError(
                f"{source}: layer '{lp.name}' has {len(lp.blobs)} blobs in the file but the net's "
                f"{layer.type} layer has {len(own)} ({[list(t.shape) for t in own]}); the weights "
                "belong to another net definition")
        for i, (b, t) in enumerate(zip(lp.blobs, own, strict=True)):
            where = f"{source}: layer '{lp.name}' blob {i}"
            shape = blob_shape(b)
            if not _fits(shape, tuple(t.shape)):
                raise CaffeFormatError(
                    f"{where}: shape {list(shape)} in the file, but the net expects {list(t.shape)}; "
                    "the weights belong to another net definition (check num_output and kernel sizes)")
            arr = to_array(b, where=where).reshape(tuple(t.shape))
            with np.errstate(all="ignore"):
                t.data.copy_(_torch().from_numpy(arr))
        copied += 1
    return copied


def load_weights(net: Any, paths: str | Path | list[str]) -> None:
    """Load one or several (comma-separated) .caffemodel files into ``net`` in order."""
    items = paths.split(",") if isinstance(paths, str) else [str(p) for p in ([paths] if isinstance(paths, Path) else paths)]
    for p in items:
        copy_trained_layers(net, read_binary(p, schema.NetParameter()), source=str(p))


def _torch() -> Any:
    import torch
    return torch
