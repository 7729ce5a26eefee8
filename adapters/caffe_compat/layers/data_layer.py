"""Data: batches of Datum records from an LMDB or LevelDB, each rank reading its own records in TRAIN."""

from __future__ import annotations

import numpy as np
import torch

from ddl.caffe.data.database import DatumReader, choose_backend
from ddl.caffe.data.datum import datum_to_array
from ddl.caffe.data.transform import Transformer
from ddl.caffe.formats import schema
from ddl.caffe.layers.inputs import DataLayer

CACHE_BYTES = 512 << 20          # decoded Data records kept per layer


class Data(DataLayer):
    """Batches of Datum records from a LevelDB (Caffe's default backend) or an LMDB; in TRAIN each rank reads its own
    records."""

    type = "Data"
    params = ("data_param", "transform_param")
    max_tops = 2

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p = self.lp.data_param
        if not p.source:
            raise self.error("data_param.source is required")
        if p.batch_size <= 0:
            raise self.error("data_param.batch_size must be given and positive")
        tp = self.lp.transform_param
        if p.HasField("scale") or p.HasField("mean_file") or p.HasField("crop_size") or p.HasField("mirror"):
            raise self.error("the deprecated data_param scale/mean_file/crop_size/mirror are not supported; move them to transform_param")
        shard = self.phase == schema.TRAIN and self.size > 1
        backend = choose_backend(p.source, p.backend, given=p.HasField("backend"), where=f"layer '{self.name}'")
        self.reader = DatumReader(p.source, backend=backend, rank=self.rank if shard else 0, size=self.size if shard else 1)
        # The world skips rand_skip records of the stream (Caffe 1.0's Data layer ignores the field; older Caffe
        # skipped a random count below it): one process at batch N x B still reads what N ranks at batch B read.
        self.reader.skip(p.rand_skip)
        self.batch = p.batch_size
        self.tf = Transformer(tp, self.phase, self.gen, where=f"layer '{self.name}'")
        first = datum_to_array(self.reader.peek(), force_color=tp.force_color or p.force_encoded_color, force_gray=tp.force_gray)
        self.shape = (self.batch, *self.tf.out_shape(*first.shape))
        self.force_color = tp.force_color or p.force_encoded_color
        self.cache: dict[bytes, tuple[np.ndarray, int]] = {}
        self.cached_bytes = 0

    def top_shapes(self) -> list[tuple[int, ...]]:
        return [self.shape, (self.batch,)][: len(self.top)]

    def _decoded(self) -> tuple[np.ndarray, int]:
        key, raw = self.reader.next_raw()
        hit = self.cache.get(key)
        if hit is None:
            d = schema.Datum.FromString(raw)
            hit = (datum_to_array(d, force_color=self.force_color, force_gray=self.tf.force_gray), d.label)
            # Decoded records are kept while they fit, so later epochs skip parsing and decoding.
            if self.cached_bytes + hit[0].nbytes <= CACHE_BYTES:
                self.cache[key] = hit
                self.cached_bytes += hit[0].nbytes
        return hit

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        recs = [self._decoded() for _ in range(self.batch)]
        ys = np.array([r[1] for r in recs], np.float32)
        if self.tf.per_sample:
            xs = np.empty(self.shape, np.float32)
            for i, (x, _) in enumerate(recs):
                xs[i] = self._fit(self.tf(x))
        else:
            xs = self.tf.batch(np.stack([self._fit(r[0]) for r in recs]).astype(np.float32, copy=False))
        out = [torch.from_numpy(np.ascontiguousarray(xs, dtype=np.float32)), torch.from_numpy(ys)]
        return out[: len(self.top)]

    def _fit(self, x: np.ndarray) -> np.ndarray:
        if x.shape != self.shape[1:]:
            raise self.error(f"record of shape {list(x.shape)} after transform; the first was {list(self.shape[1:])}")
        return x
