"""The part of pycaffe that Python layers use (``caffe.Layer``, blobs with ``.data``/``.diff``, ``caffe.TRAIN``), served as ``caffe`` to them."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

TRAIN, TEST = 0, 1


class Blob:
    """pycaffe's Blob: float32 ``data`` and ``diff`` arrays of one shape, resized by ``reshape``."""

    def __init__(self, shape: tuple[int, ...] = ()) -> None:
        self.data = np.zeros(shape, np.float32)
        self.diff = np.zeros(shape, np.float32)

    def reshape(self, *shape: int) -> None:
        """Give the blob a new shape (zeros when the count changes, as Caffe's Reshape may)."""
        dims = tuple(int(d) for d in (shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape))
        if dims != self.data.shape:
            self.data = np.zeros(dims, np.float32)
            self.diff = np.zeros(dims, np.float32)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def count(self) -> int:
        return math.prod(self.data.shape)

    def _dim(self, i: int) -> int:
        return int(self.data.shape[i]) if self.data.ndim > i else 1

    @property
    def num(self) -> int:
        return self._dim(0)

    @property
    def channels(self) -> int:
        return self._dim(1)

    @property
    def height(self) -> int:
        return self._dim(2)

    @property
    def width(self) -> int:
        return self._dim(3)


class BlobVec(list):  # type: ignore[type-arg]
    """A layer's own blobs (``self.blobs``); ``add_blob(*shape)`` as in pycaffe."""

    def add_blob(self, *shape: int) -> None:
        self.append(Blob(tuple(int(d) for d in shape)))

    def __iter__(self) -> Iterator[Blob]:
        return super().__iter__()


class Layer:
    """Base class of Python layers: override ``setup``, ``reshape``, ``forward`` and ``backward``.

    ``param_str`` (the prototxt's ``python_param.param_str``) and ``phase`` (``caffe.TRAIN`` or
    ``caffe.TEST``) are set before ``setup`` runs.
    """

    def __init__(self, layer_param: Any = None) -> None:
        self.layer_param = layer_param
        self.param_str = ""
        self.phase = TRAIN
        self.blobs = BlobVec()

    def setup(self, bottom: list[Blob], top: list[Blob]) -> None:
        """Read ``param_str``, check the bottoms (called once)."""

    def reshape(self, bottom: list[Blob], top: list[Blob]) -> None:
        """Shape the tops (called before every forward)."""

    def forward(self, bottom: list[Blob], top: list[Blob]) -> None:
        """Fill ``top[i].data`` from ``bottom[j].data``."""

    def backward(self, top: list[Blob], propagate_down: list[bool], bottom: list[Blob]) -> None:
        """Fill ``bottom[j].diff`` (where ``propagate_down[j]``) from ``top[i].diff``."""


def set_mode_cpu() -> None:
    """Accepted for pycaffe scripts; ddl-caffe picks the device itself."""


def set_mode_gpu() -> None:
    """Accepted for pycaffe scripts; ddl-caffe picks the device itself."""


def set_device(device_id: int) -> None:
    """Accepted for pycaffe scripts; ddl-caffe picks the device itself."""
