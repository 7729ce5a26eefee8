"""Accuracy: top-k classification accuracy, overall and per class (a metric, not a loss)."""

from __future__ import annotations

import torch

from ddl.caffe.layers.base import Layer, axis_index
from ddl.caffe.layers.loss import _check_labels, _split


class Accuracy(Layer):
    """Top 0: the share of items whose label is among the top_k scores; top 1 (optional): that share per class."""

    type = "Accuracy"
    params = ("accuracy_param",)
    min_bottoms, max_bottoms = 2, 2
    max_tops = 2

    def allow_force_backward(self, i: int) -> bool:
        return False

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p = self.lp.accuracy_param
        self.axis = axis_index(p.axis, len(shapes[0]), self)
        _check_labels(self, shapes, self.axis)
        self.top_k = p.top_k
        if self.top_k > shapes[0][self.axis]:
            raise self.error(f"top_k {self.top_k} exceeds the {shapes[0][self.axis]} classes")
        self.ignore = p.ignore_label if p.HasField("ignore_label") else None

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        with torch.no_grad():
            x, label = bottoms
            outer, c, inner = _split(tuple(x.shape), self.axis)
            s = x.reshape(outer, c, inner)
            lab = label.reshape(outer, inner).long()
            valid = torch.ones_like(lab, dtype=torch.bool) if self.ignore is None else lab != self.ignore
            safe = torch.where(valid, lab, torch.zeros_like(lab))
            true = s.gather(1, safe.unsqueeze(1))
            # Caffe counts a hit when fewer than top_k other classes score at least as high: a tie with the true
            # class is a miss (accuracy_layer.cpp counts every score >= the true one, the true class itself too).
            better = (s >= true).sum(1) - 1
            hit = (better < self.top_k) & valid
            count = valid.sum()
            acc = hit.sum().to(x.dtype) / count.clamp(min=1).to(x.dtype)
            if len(self.top) == 1:
                return [acc]
            per = torch.zeros(c, dtype=x.dtype).index_add_(0, safe[hit], torch.ones(int(hit.sum()), dtype=x.dtype))
            seen = torch.zeros(c, dtype=x.dtype).index_add_(0, safe[valid], torch.ones(int(valid.sum()), dtype=x.dtype))
            return [acc, torch.where(seen > 0, per / seen.clamp(min=1), torch.zeros_like(per))]
