"""ArgMax and Reduction: values reduced along axes (indices of the largest, sums, means, norms)."""

from __future__ import annotations

import math

import torch

from ddl.caffe.layers.base import Layer, axis_index


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
