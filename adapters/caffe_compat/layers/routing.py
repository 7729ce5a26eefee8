"""Concat, Slice, Split and Silence: blobs joined, cut along an axis, handed to many consumers, or consumed."""

from __future__ import annotations

import torch

from ddl.caffe.layers.base import MANY, Layer, axis_index


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
