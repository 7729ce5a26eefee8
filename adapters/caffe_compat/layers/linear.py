"""InnerProduct and Embed: learned matrix products (a dense layer, a lookup table)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ddl.caffe.layers.base import Layer, axis_index


class InnerProduct(Layer):
    type = "InnerProduct"
    params = ("inner_product_param",)

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p = self.lp.inner_product_param
        if p.num_output <= 0:
            raise self.error("num_output must be given and positive")
        self.axis = axis_index(p.axis, len(shapes[0]), self)
        k = math.prod(shapes[0][self.axis:])
        self.transpose = p.transpose
        shape = (k, p.num_output) if p.transpose else (p.num_output, k)
        self.blobs = [self.make_blob(shape, p.weight_filler, what="weights")]
        if p.bias_term:
            self.blobs.append(self.make_blob((p.num_output,), p.bias_filler, what="bias"))

    def infer_top_shapes(self, shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]] | None:
        return [(*shapes[0][: self.axis], self.lp.inner_product_param.num_output)]

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        x = bottoms[0]
        lead = x.shape[: self.axis]
        x2 = x.reshape(math.prod(lead), -1)
        w = self.blobs[0].t() if self.transpose else self.blobs[0]
        y = F.linear(x2, w, self.blobs[1] if len(self.blobs) > 1 else None)
        return [y.reshape(*lead, y.shape[1])]


class Embed(Layer):
    """Rows of a learned (input_dim, num_output) table picked by integer indices; top = bottom shape + (num_output,)."""

    type = "Embed"
    params = ("embed_param",)

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p = self.lp.embed_param
        if p.num_output <= 0 or p.input_dim <= 0:
            raise self.error("embed_param needs positive num_output and input_dim")
        self.input_dim = p.input_dim
        self.blobs = [self.make_blob((p.input_dim, p.num_output), p.weight_filler, what="weights")]
        if p.bias_term:
            self.blobs.append(self.make_blob((p.num_output,), p.bias_filler, what="bias"))

    def allow_force_backward(self, i: int) -> bool:
        return False

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        x = bottoms[0].detach()
        idx = x.long()
        if bool((idx.to(x.dtype) != x).any()) or bool(((idx < 0) | (idx >= self.input_dim)).any()):
            raise self.error(f"indices must be integers in [0, {self.input_dim}); got values in "
                             f"[{float(x.min()):g}, {float(x.max()):g}]")
        y = F.embedding(idx, self.blobs[0])
        return [y + self.blobs[1] if len(self.blobs) > 1 else y]
