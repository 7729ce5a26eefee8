"""Softmax along an axis."""

from __future__ import annotations

import torch

from ddl.caffe.layers.base import Layer, axis_index


class Softmax(Layer):
    type = "Softmax"
    same_shape = True
    params = ("softmax_param",)

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        self.axis = axis_index(self.lp.softmax_param.axis, len(shapes[0]), self)

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        return [torch.softmax(bottoms[0], self.axis)]
