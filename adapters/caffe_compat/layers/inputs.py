"""Layers whose tops come from outside the net or from their own blobs: Input, DummyData, MemoryData (fed from Python) and Parameter; the base of every data layer."""

from __future__ import annotations

import numpy as np
import torch

from ddl.caffe.formats import schema
from ddl.caffe.layers.base import Layer
from ddl.caffe.layers.fillers import fill


class DataLayer(Layer):
    is_data = True
    min_bottoms, max_bottoms = 0, 0
    rank, size = 0, 1

    def _shapes_from(self, shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
        if len(shapes) == 1:
            return shapes * len(self.top)
        if len(shapes) != len(self.top):
            raise self.error(f"give one shape for all tops or one per top ({len(self.top)}), got {len(shapes)}")
        return shapes


class Input(DataLayer):
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


class DummyData(DataLayer):
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


class MemoryData(DataLayer):
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


class Parameter(Layer):
    """Its learned blob (``parameter_param.shape``) as its top."""

    type = "Parameter"
    params = ("parameter_param",)
    min_bottoms, max_bottoms = 0, 0

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        shape = tuple(int(d) for d in self.lp.parameter_param.shape.dim)
        from ddl.caffe.formats import schema
        self.blobs = [self.make_blob(shape, schema.FillerParameter(), what="parameter")]

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        return [self.blobs[0]]
