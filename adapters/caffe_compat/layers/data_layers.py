"""Input, DummyData, Data (LMDB), HDF5Data, MemoryData (fed from Python) and HDF5Output layers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .. import schema
from ..data import LmdbReader, Transformer, datum_to_array
from ..fillers import fill
from .base import Layer

LEVELDB, LMDB = 0, 1
CACHE_BYTES = 512 << 20          # decoded Data records kept per layer


class _DataLayer(Layer):
    is_data = True
    min_bottoms, max_bottoms = 0, 0
    rank, size = 0, 1

    def _shapes_from(self, shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
        if len(shapes) == 1:
            return shapes * len(self.top)
        if len(shapes) != len(self.top):
            raise self.error(f"give one shape for all tops or one per top ({len(self.top)}), got {len(shapes)}")
        return shapes


class Input(_DataLayer):
    """Tops fed from outside (``Net.feed``); zeros until fed, random values for ``ddl-caffe time``."""

    type = "Input"
    params = ("input_param",)
    max_tops = 1 << 16

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        given = [tuple(int(d) for d in s.dim) for s in self.lp.input_param.shape]
        if not given:
            raise self.error("input_param needs a shape")
        self.shapes = self._shapes_from(given)
        self.values = [torch.zeros(s) for s in self.shapes]

    def top_shapes(self) -> list[tuple[int, ...]]:
        return list(self.shapes)

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        return list(self.values)


class DummyData(_DataLayer):
    type = "DummyData"
    params = ("dummy_data_param",)
    max_tops = 1 << 16

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p = self.lp.dummy_data_param
        if len(p.shape):
            given = [tuple(int(d) for d in s.dim) for s in p.shape]
        else:
            n = len(p.num)
            if not n or not (len(p.channels) == len(p.height) == len(p.width) == n):
                raise self.error("give shape, or num/channels/height/width with equal counts")
            given = [(p.num[i], p.channels[i], p.height[i], p.width[i]) for i in range(n)]
        self.shapes = self._shapes_from(given)
        fillers = list(p.data_filler) or [schema.FillerParameter()]
        if len(fillers) == 1:
            fillers = fillers * len(self.top)
        if len(fillers) != len(self.top):
            raise self.error(f"give one data_filler for all tops or one per top, got {len(fillers)}")
        self.fillers = fillers
        # Constant fillers are filled once; others refill each forward, as in Caffe.
        self.values = [fill(s, f, self.gen, where=f"layer '{self.name}'") for s, f in zip(self.shapes, fillers, strict=True)]

    def top_shapes(self) -> list[tuple[int, ...]]:
        return list(self.shapes)

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        for i, (s, f) in enumerate(zip(self.shapes, self.fillers, strict=True)):
            if f.type != "constant":
                self.values[i] = fill(s, f, self.gen)
        return list(self.values)


class Data(_DataLayer):
    """Batches of Datum records from an LMDB; in TRAIN each rank reads its own records."""

    type = "Data"
    params = ("data_param", "transform_param")
    max_tops = 2

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p = self.lp.data_param
        if p.backend == LEVELDB and p.HasField("backend"):
            raise self.error("backend LEVELDB is not supported; convert the data to LMDB with 'ddl-caffe convert'")
        if not p.source:
            raise self.error("data_param.source is required")
        if p.batch_size <= 0:
            raise self.error("data_param.batch_size must be given and positive")
        tp = self.lp.transform_param
        if p.HasField("scale") or p.HasField("mean_file") or p.HasField("crop_size") or p.HasField("mirror"):
            raise self.error("the deprecated data_param scale/mean_file/crop_size/mirror are not supported; move them to transform_param")
        shard = self.phase == schema.TRAIN and self.size > 1
        self.reader = LmdbReader(p.source, rank=self.rank if shard else 0, size=self.size if shard else 1)
        for _ in range(p.rand_skip):
            self.reader.next()
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


class HDF5Data(_DataLayer):
    """Rows of the datasets named like the tops, from the .h5 files listed in ``source``."""

    type = "HDF5Data"
    params = ("hdf5_data_param",)
    max_tops = 1 << 16

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        import h5py
        p = self.lp.hdf5_data_param
        src = Path(p.source)
        if not src.exists():
            raise self.error(f"hdf5_data_param.source {src} does not exist (it lists one .h5 file per line)")
        files = [ln.strip() for ln in src.read_text().splitlines() if ln.strip()]
        if not files or p.batch_size <= 0:
            raise self.error("source must list at least one file and batch_size must be positive")
        parts: list[list[np.ndarray]] = [[] for _ in self.top]
        for f in files:
            with h5py.File(f, "r") as h:
                for i, t in enumerate(self.top):
                    if t not in h:
                        raise self.error(f"{f} has no dataset '{t}' (datasets: {sorted(h.keys())})")
                    parts[i].append(np.asarray(h[t], dtype=np.float32))
        self.arrays = [np.concatenate(ps) for ps in parts]
        n = self.arrays[0].shape[0]
        if any(a.shape[0] != n for a in self.arrays):
            raise self.error(f"datasets have different row counts {[a.shape[0] for a in self.arrays]}")
        shard = self.phase == schema.TRAIN and self.size > 1
        rows = np.arange(n)
        if p.shuffle:
            rows = rows[torch.randperm(n, generator=self.gen).numpy()]
        self.rows = rows[self.rank::self.size] if shard else rows
        self.batch, self.pos = p.batch_size, 0

    def top_shapes(self) -> list[tuple[int, ...]]:
        return [(self.batch, *a.shape[1:]) for a in self.arrays]

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        take = np.take(self.rows, np.arange(self.pos, self.pos + self.batch), mode="wrap")
        self.pos = (self.pos + self.batch) % len(self.rows)
        return [torch.from_numpy(np.ascontiguousarray(a[take])) for a in self.arrays]


class MemoryData(_DataLayer):
    """Batches of arrays handed over from Python (pycaffe's ``set_input_arrays``); in TRAIN each rank takes
    every size-th item of what it is given."""

    type = "MemoryData"
    params = ("memory_data_param", "transform_param")
    max_tops = 2

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p = self.lp.memory_data_param
        dims = (p.batch_size, p.channels, p.height, p.width)
        if min(dims) <= 0:
            raise self.error(f"memory_data_param needs positive batch_size, channels, height and width, got {list(dims)}")
        self.shape = tuple(int(d) for d in dims)
        self.batch = self.shape[0]
        self.data: np.ndarray | None = None
        self.labels = np.zeros(0, np.float32)
        self.pos = 0

    def top_shapes(self) -> list[tuple[int, ...]]:
        return [self.shape, (self.batch,)][: len(self.top)]

    def set_input_arrays(self, data: np.ndarray, labels: np.ndarray) -> None:
        """Use ``data`` (N, C, H, W) and ``labels`` (N,) from now on; N must be a multiple of batch_size.

        As in Caffe, the arrays are used as they are (transform_param is not applied to them).
        """
        x = np.ascontiguousarray(data, dtype=np.float32)
        y = np.ascontiguousarray(labels, dtype=np.float32).reshape(-1)
        if x.ndim != 4 or x.shape[1:] != self.shape[1:]:
            raise self.error(f"data must be (N, {', '.join(map(str, self.shape[1:]))}), got {list(x.shape)}")
        if x.shape[0] != y.shape[0] or x.shape[0] % self.batch:
            raise self.error(f"need one label per item and a multiple of batch_size {self.batch} items; got {x.shape[0]} items, {y.shape[0]} labels")
        if self.phase == schema.TRAIN and self.size > 1:
            x, y = x[self.rank::self.size], y[self.rank::self.size]
            if x.shape[0] < self.batch:
                raise self.error(f"rank {self.rank} of {self.size} got {x.shape[0]} items, fewer than a batch")
        self.data, self.labels, self.pos = x, y, 0

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        if self.data is None:
            raise self.error("no data yet: hand it over with net.set_input_arrays(data, labels) (or the layer's own)")
        take = np.arange(self.pos, self.pos + self.batch) % self.data.shape[0]
        self.pos = (self.pos + self.batch) % self.data.shape[0]
        return [torch.from_numpy(self.data[take]), torch.from_numpy(self.labels[take])][: len(self.top)]


class HDF5Output(Layer):
    """Writes its two bottoms (as datasets ``data`` and ``label``) to ``file_name``; rows of later batches are appended
    (Caffe writes the first batch and then fails on the second)."""

    type = "HDF5Output"
    params = ("hdf5_output_param",)
    min_bottoms, max_bottoms = 2, 2
    min_tops, max_tops = 0, 0

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        import h5py
        name = self.lp.hdf5_output_param.file_name
        if not name:
            raise self.error("hdf5_output_param.file_name is required")
        if shapes[0][0] != shapes[1][0]:
            raise self.error(f"data and label need the same number of items, got {list(shapes[0])} and {list(shapes[1])}")
        try:
            self.file = h5py.File(name, "w")
        except OSError as e:
            raise self.error(f"cannot create {name}: {e}") from None
        self.sets = {k: self.file.create_dataset(k, shape=(0, *s[1:]), maxshape=(None, *s[1:]), dtype="f4")
                     for k, s in (("data", shapes[0]), ("label", shapes[1]))}

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        if not self.update_stats:
            return []
        for (_, ds), b in zip(self.sets.items(), bottoms, strict=True):
            arr = b.detach().cpu().numpy()
            n = ds.shape[0]
            ds.resize(n + arr.shape[0], axis=0)
            ds[n:] = arr
        self.file.flush()
        return []
