"""Dropout: Caffe's inverted dropout (kept units scaled by 1/(1-ratio) in TRAIN, identity in TEST)."""

from __future__ import annotations

import torch

from ddl.caffe.formats import schema
from ddl.caffe.layers.base import Layer


class Dropout(Layer):
    type = "Dropout"
    same_shape = True
    params = ("dropout_param",)

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        x, ratio = bottoms[0], self.lp.dropout_param.dropout_ratio
        if self.phase == schema.TEST or ratio == 0:
            return [x]
        # Caffe scales the kept units by 1/(1-ratio) at train time (inverted dropout).
        keep = (torch.rand(x.shape, generator=self.gen) >= ratio).to(x.dtype)
        return [x * keep * (1.0 / (1.0 - ratio))]
