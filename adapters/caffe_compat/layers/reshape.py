"""Flatten, Reshape and SSD's Permute: the same values under another shape or axis order."""

from __future__ import annotations

import math

import torch

from ddl.caffe.layers.base import Layer, axis_index


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


class Permute(Layer):
    """Axes reordered as ``order`` says; axes it leaves out follow in their own order."""

    type = "Permute"
    params = ("permute_param",)

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        n = len(shapes[0])
        given = [int(o) for o in self.lp.permute_param.order]
        if len(set(given)) != len(given) or any(o >= n for o in given):
            raise self.error(f"order {given} must name distinct axes of the {n}-D bottom")
        self.order = given + [a for a in range(n) if a not in given]

    def infer_top_shapes(self, shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]] | None:
        return [tuple(shapes[0][a] for a in self.order)]

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        return [bottoms[0].permute(*self.order).contiguous()]
