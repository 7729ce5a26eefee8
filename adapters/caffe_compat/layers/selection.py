"""Crop, Tile, BatchReindex and Filter: values picked or repeated by position or by index."""

from __future__ import annotations

import torch

from ddl.caffe.layers.base import MANY, Layer, axis_index


class Crop(Layer):
    """Bottom 0 cut to bottom 1's shape from ``axis`` on, starting at ``offset`` (one for all axes, or one each)."""

    type = "Crop"
    params = ("crop_param",)
    min_bottoms, max_bottoms = 2, 2

    def allow_force_backward(self, i: int) -> bool:
        return i == 0

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p, (a, b) = self.lp.crop_param, shapes
        if len(a) != len(b):
            raise self.error(f"bottoms must have the same number of axes, got {list(a)} and {list(b)}")
        start = axis_index(p.axis, len(a), self)
        offs = [int(o) for o in p.offset]
        if len(offs) > 1 and start + len(offs) != len(a):
            raise self.error(f"{len(offs)} offsets for the {len(a) - start} axes from axis {start}; give one or one per axis")
        self.slices: list[slice] = []
        for i in range(len(a)):
            if i < start:
                self.slices.append(slice(None))
                continue
            off = offs[0] if len(offs) == 1 else (offs[i - start] if offs else 0)
            if a[i] - off < b[i]:
                raise self.error(f"axis {i}: offset {off} + size {b[i]} exceeds bottom 0's {a[i]}")
            self.slices.append(slice(off, off + b[i]))

    def infer_top_shapes(self, shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]] | None:
        return [tuple(d if sl.start is None else sl.stop - sl.start for d, sl in zip(shapes[0], self.slices, strict=True))]

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        return [bottoms[0][tuple(self.slices)]]


class Tile(Layer):
    """``tiles`` copies of the bottom's blocks from ``axis`` on, one after another along ``axis``."""

    type = "Tile"
    params = ("tile_param",)

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p = self.lp.tile_param
        self.axis = axis_index(p.axis, len(shapes[0]), self)
        if p.tiles <= 0:
            raise self.error("tile_param.tiles must be given and positive")
        self.reps = [1] * len(shapes[0])
        self.reps[self.axis] = p.tiles

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        return [bottoms[0].repeat(*self.reps)]


class BatchReindex(Layer):
    """Rows of bottom 0 picked (and repeated) by the indices in bottom 1."""

    type = "BatchReindex"
    min_bottoms, max_bottoms = 2, 2

    def allow_force_backward(self, i: int) -> bool:
        return i == 0

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        if len(shapes[1]) != 1:
            raise self.error(f"the index bottom must be 1-D, got shape {list(shapes[1])}")

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        x, perm = bottoms[0], bottoms[1].detach()
        idx = perm.long()
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= x.shape[0]):
            raise self.error(f"indices must lie in [0, {x.shape[0]}), got [{int(idx.min())}, {int(idx.max())}]")
        return [x.index_select(0, idx)]


class Filter(Layer):
    """Keeps the items (axis 0) of each bottom whose selector (the last bottom) is non-zero."""

    type = "Filter"
    min_bottoms, max_bottoms = 2, MANY
    max_tops = MANY

    def allow_force_backward(self, i: int) -> bool:
        return i < len(self.bottom) - 1

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        if len(self.top) != len(self.bottom) - 1:
            raise self.error(f"needs one top per filtered bottom ({len(self.bottom) - 1}), got {len(self.top)}")
        sel = shapes[-1]
        if not (len(sel) == 1 or (len(sel) == 2 and sel[1] == 1)):
            raise self.error(f"the selector must have shape (N) or (N, 1), got {list(sel)}")
        if any(s[0] != sel[0] for s in shapes[:-1]):
            raise self.error(f"every bottom needs the selector's {sel[0]} items, got {[list(s) for s in shapes]}")

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        if not self.update_stats:      # shape probing: Caffe's first reshape keeps every item
            return list(bottoms[:-1])
        keep = bottoms[-1].detach().reshape(-1).ne(0).nonzero().reshape(-1)
        return [b.index_select(0, keep) for b in bottoms[:-1]]
