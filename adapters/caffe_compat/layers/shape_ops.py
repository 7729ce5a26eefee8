"""Layers that move, copy or pick values: Concat, Slice, Split, Silence, Flatten, Reshape, Crop, Tile, BatchReindex, Filter, Parameter, ArgMax, Reduction."""

from __future__ import annotations

import math

import torch

from .base import Layer, axis_index

MANY = 1 << 16


def _legacy_axis(layer: Layer, p: object, legacy: str, ndim: int) -> int:
    """Concat's ``concat_dim`` and Slice's ``slice_dim``: the deprecated axis, used when given (no negatives)."""
    if p.HasField(legacy):                                     # type: ignore[attr-defined]
        if p.HasField("axis"):                                 # type: ignore[attr-defined]
            raise layer.error(f"give either axis or the deprecated {legacy}, not both")
        return axis_index(int(getattr(p, legacy)), ndim, layer)
    return axis_index(int(p.axis), ndim, layer)                # type: ignore[attr-defined]


class Concat(Layer):
    type = "Concat"
    params = ("concat_param",)
    max_bottoms = MANY

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        self.axis = _legacy_axis(self, self.lp.concat_param, "concat_dim", len(shapes[0]))
        for s in shapes:
            if len(s) != len(shapes[0]) or any(a != b for i, (a, b) in enumerate(zip(s, shapes[0], strict=True)) if i != self.axis):
                raise self.error(f"bottoms must match except on axis {self.axis}, got {[list(x) for x in shapes]}")

    def infer_top_shapes(self, shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]] | None:
        out = list(shapes[0])
        out[self.axis] = sum(s[self.axis] for s in shapes)
        return [tuple(out)]

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        return [torch.cat(bottoms, self.axis) if len(bottoms) > 1 else bottoms[0]]


class Slice(Layer):
    """Cuts the bottom along ``axis`` at ``slice_point``s, or into equal parts, one per top."""

    type = "Slice"
    params = ("slice_param",)
    max_tops = MANY

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p = self.lp.slice_param
        self.axis = _legacy_axis(self, p, "slice_dim", len(shapes[0]))
        size, n = shapes[0][self.axis], len(self.top)
        points = [int(v) for v in p.slice_point]
        if points:
            if len(points) != n - 1:
                raise self.error(f"{len(points)} slice_point values need {len(points) + 1} tops, got {n}")
            bounds = [0, *points, size]
            if any(b >= a for a, b in zip(bounds[1:], bounds[:-1], strict=True)):
                raise self.error(f"slice_point values {points} must increase strictly within (0, {size})")
            self.sizes = [b - a for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        else:
            if size % n:
                raise self.error(f"axis {self.axis} of size {size} does not split into {n} equal tops; give slice_point")
            self.sizes = [size // n] * n

    def infer_top_shapes(self, shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]] | None:
        return [tuple(n if i == self.axis else d for i, d in enumerate(shapes[0])) for n in self.sizes]

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        return list(torch.split(bottoms[0], self.sizes, self.axis))


class Split(Layer):
    """Hands its bottom to every top (gradients add up)."""

    type = "Split"
    max_tops = MANY
    same_shape = True

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        return [bottoms[0]] * len(self.top)


class Silence(Layer):
    """Consumes blobs so that they are not net outputs; no tops."""

    type = "Silence"
    max_bottoms = MANY
    min_tops, max_tops = 0, 0

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        return []


def _reshape_target(layer: Layer, s: tuple[int, ...]) -> tuple[int, ...]:
    p = layer.lp.reshape_param
    start = p.axis if p.axis >= 0 else len(s) + 1 + p.axis
    end = len(s) if p.num_axes == -1 else start + p.num_axes
    if not 0 <= start <= end <= len(s):
        raise layer.error(f"axis {p.axis} / num_axes {p.num_axes} out of range for bottom {list(s)}")
    dims = [int(d) for d in p.shape.dim]
    if dims.count(-1) > 1:
        raise layer.error("at most one shape dim may be -1")
    for i, d in enumerate(dims):
        if d == 0 and start + i >= end:
            raise layer.error(f"shape dim {i} is 0 (copy), but the bottom has no axis {start + i} in the reshaped range")
    new = [s[start + i] if d == 0 else d for i, d in enumerate(dims)]
    out = list(s[:start]) + new + list(s[end:])
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        if not known or math.prod(s) % known:
            raise layer.error(f"cannot reshape {list(s)} ({math.prod(s)} values) to {out}")
        out[out.index(-1)] = math.prod(s) // known
    if math.prod(out) != math.prod(s):
        raise layer.error(f"cannot reshape {list(s)} ({math.prod(s)} values) to {out}")
    return tuple(out)


class Flatten(Layer):
    type = "Flatten"
    params = ("flatten_param",)

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p, n = self.lp.flatten_param, len(shapes[0])
        self.first, self.last = axis_index(p.axis, n, self), axis_index(p.end_axis, n, self)

    def infer_top_shapes(self, shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]] | None:
        s = shapes[0]
        return [(*s[: self.first], math.prod(s[self.first:self.last + 1]), *s[self.last + 1:])]

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        return [bottoms[0].flatten(self.first, self.last) if self.last > self.first else bottoms[0]]


class Reshape(Layer):
    type = "Reshape"
    params = ("reshape_param",)

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        self.in_shape = shapes[0]
        self.shape = _reshape_target(self, shapes[0])

    def infer_top_shapes(self, shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]] | None:
        return [self.shape]

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        x = bottoms[0]
        if tuple(x.shape) != self.in_shape:          # the batch changed (Caffe reshapes every pass)
            self.in_shape, self.shape = tuple(x.shape), _reshape_target(self, tuple(x.shape))
        return [x.reshape(self.shape)]


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


class Parameter(Layer):
    """Its learned blob (``parameter_param.shape``) as its top."""

    type = "Parameter"
    params = ("parameter_param",)
    min_bottoms, max_bottoms = 0, 0

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        shape = tuple(int(d) for d in self.lp.parameter_param.shape.dim)
        from .. import schema
        self.blobs = [self.make_blob(shape, schema.FillerParameter(), what="parameter")]

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        return [self.blobs[0]]


class ArgMax(Layer):
    """Indices (and with ``out_max_val`` the values) of the top_k largest, over ``axis`` or each item's values."""

    type = "ArgMax"
    params = ("argmax_param",)

    def allow_force_backward(self, i: int) -> bool:
        return False

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p, s = self.lp.argmax_param, shapes[0]
        self.k, self.with_values = int(p.top_k), p.out_max_val
        self.axis = axis_index(p.axis, len(s), self) if p.HasField("axis") else None
        size = s[self.axis] if self.axis is not None else math.prod(s[1:])
        if self.k < 1 or self.k > size:
            raise self.error(f"top_k {self.k} must lie in [1, {size}]")

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        x = bottoms[0].detach()
        dim = self.axis if self.axis is not None else 1
        v = x if self.axis is not None else x.reshape(x.shape[0], -1)
        # Caffe sorts (value, index) pairs with std::greater: equal values put the larger index first.
        n = v.shape[dim]
        vals, order = torch.sort(v.flip(dim), dim=dim, descending=True, stable=True)
        vals, idx = vals.narrow(dim, 0, self.k), (n - 1 - order.narrow(dim, 0, self.k)).to(x.dtype)
        if self.axis is not None:
            return [vals if self.with_values else idx]
        out = torch.stack([idx, vals], 1) if self.with_values else idx[:, None]
        return [out.reshape(out.shape + (1,) * (max(x.dim(), 3) - 3))]


class Reduction(Layer):
    """SUM, ASUM, SUMSQ or MEAN of every axis from ``axis`` on, times ``coeff``; top shape = the leading axes."""

    type = "Reduction"
    params = ("reduction_param",)

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p = self.lp.reduction_param
        self.axis = axis_index(p.axis, len(shapes[0]), self) if len(shapes[0]) else 0
        self.op, self.coeff = p.operation, p.coeff

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        x = bottoms[0]
        flat = x.reshape(*x.shape[: self.axis], -1)
        if self.op == 2:
            flat = flat.abs()
        elif self.op == 3:
            flat = flat * flat
        y = flat.mean(-1) if self.op == 4 else flat.sum(-1)
        return [y * self.coeff if self.coeff != 1 else y]
