"""Copying a .caffemodel's (or HDF5 file's) weights into a net by layer name, with Caffe's shape checks."""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from ddl.caffe.formats.blobs import to_array
from ddl.caffe.formats.caffemodel import LayerBlobs
from ddl.caffe.formats.errors import CaffeFormatError


def _fits(src: tuple[int, ...], dst: tuple[int, ...]) -> bool:
    # Caffe accepts a legacy 4-D blob for a lower-rank one when the leading dims are 1
    # (e.g. InnerProduct weights stored as 1x1xNxK).
    if src == dst:
        return True
    if len(src) == 4 and len(dst) < 4:
        return src[: 4 - len(dst)] == (1,) * (4 - len(dst)) and src[4 - len(dst):] == dst
    return False


def copy_trained_layers(net: Any, weights: Any, *, source: str) -> int:
    """Copy blobs of same-named layers from a NetParameter into ``net`` (Caffe's CopyTrainedLayersFrom)."""
    layers = (LayerBlobs(lp.name, lp.type, [to_array(b, where=f"{source}: layer '{lp.name}' blob {i}")
                                            for i, b in enumerate(lp.blobs)]) for lp in weights.layer)
    return copy_layers(net, layers, source=source)


def copy_layers(net: Any, layers: Iterable[LayerBlobs], *, source: str) -> int:
    """Copy the blobs of same-named layers into ``net``; layers the net lacks are ignored, as in Caffe.

    Returns:
        The number of layers copied.

    Raises:
        CaffeFormatError: a layer's blob count or a blob's shape differs (both named).
    """
    import torch
    copied = 0
    for src in layers:
        layer = net.layer_by_name(src.name)
        if layer is None or not src.blobs:
            continue
        own = layer.blobs
        if len(src.blobs) != len(own):
            raise CaffeFormatError(
                f"{source}: layer '{src.name}' has {len(src.blobs)} blobs in the file but the net's "
                f"{layer.type} layer has {len(own)} ({[list(t.shape) for t in own]}); the weights "
                "belong to another net definition")
        for i, (arr, t) in enumerate(zip(src.blobs, own, strict=True)):
            if not _fits(tuple(arr.shape), tuple(t.shape)):
                raise CaffeFormatError(
                    f"{source}: layer '{src.name}' blob {i}: shape {list(arr.shape)} in the file, but the net expects "
                    f"{list(t.shape)}; the weights belong to another net definition (check num_output and kernel sizes)")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)     # a read-only view of the file's memory map
                src_t = torch.from_numpy(np.asarray(arr, dtype=np.float32))
            with torch.no_grad():
                t.copy_(src_t.reshape(t.shape))
        copied += 1
    return copied


def load_weights(net: Any, paths: str | Path | list[str]) -> None:
    """Load one or several (comma-separated) .caffemodel (or .caffemodel.h5) files into ``net`` in order."""
    from ddl.caffe.formats.caffemodel import CaffemodelReader, read_hdf5_weights
    items = paths.split(",") if isinstance(paths, str) else [str(p) for p in ([paths] if isinstance(paths, Path) else paths)]
    for p in items:
        if p.endswith(".h5"):
            copy_layers(net, read_hdf5_weights(p), source=p)
            continue
        with CaffemodelReader(p) as r:
            copy_layers(net, r.layers(), source=p)
