"""Caffe's DataTransformer: crop, mirror, mean subtraction and scale, per sample or per batch."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ddl.caffe.formats import schema
from ddl.caffe.formats.blobs import to_array
from ddl.caffe.formats.errors import CaffeFormatError
from ddl.caffe.formats.protofile import read_binary


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
