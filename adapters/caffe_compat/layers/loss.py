"""SoftmaxWithLoss (ignore_label, normalization modes), Accuracy (top_k) and EuclideanLoss."""

from __future__ import annotations

import math

import torch

from .base import Layer, axis_index

FULL, VALID, BATCH_SIZE, NONE = 0, 1, 2, 3
LOG_FLT_MIN = math.log(1.1754943508222875e-38)   # Caffe takes log(max(p, FLT_MIN))


def _split(shape: tuple[int, ...], axis: int) -> tuple[int, int, int]:
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])


def _check_labels(layer: Layer, shapes: list[tuple[int, ...]], axis: int) -> None:
    outer, _, inner = _split(shapes[0], axis)
    if math.prod(shapes[1]) != outer * inner:
        raise layer.error(f"label count {math.prod(shapes[1])} must equal outer x inner = {outer * inner} "
                          f"for prediction shape {list(shapes[0])} (axis {axis})")


class SoftmaxWithLoss(Layer):
    type = "SoftmaxWithLoss"
    is_loss = True
    min_bottoms, max_bottoms = 2, 2
    max_tops = 2

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        self.axis = axis_index(self.lp.softmax_param.axis, len(shapes[0]), self)
        _check_labels(self, shapes, self.axis)
        lp = self.lp.loss_param
        self.ignore = lp.ignore_label if lp.HasField("ignore_label") else None
        if not lp.HasField("normalization") and lp.HasField("normalize"):
            self.mode = VALID if lp.normalize else BATCH_SIZE
        else:
            self.mode = lp.normalization

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        x, label = bottoms
        outer, c, inner = _split(tuple(x.shape), self.axis)
        logp = torch.log_softmax(x.reshape(outer, c, inner), 1)
        # The value is capped like Caffe's log(max(p, FLT_MIN)); the gradient is Caffe's p - 1{label}.
        capped = logp - (logp - logp.clamp(min=LOG_FLT_MIN)).detach()
        lab = label.reshape(outer, inner).long()
        valid = torch.ones_like(lab, dtype=torch.bool) if self.ignore is None else lab != self.ignore
        safe = torch.where(valid, lab, torch.zeros_like(lab))
        if int(safe.min()) < 0 or int(safe.max()) >= c:
            raise self.error(f"labels must lie in [0, {c}) (or equal ignore_label), got {int(lab.min())}..{int(lab.max())}")
        nll = -capped.gather(1, safe.unsqueeze(1)).squeeze(1)
        total = (nll * valid.to(nll.dtype)).sum()
        if self.mode == FULL or (self.mode == VALID and self.ignore is None):
            norm = float(outer * inner)
        elif self.mode == VALID:
            norm = float(valid.sum())
        elif self.mode == BATCH_SIZE:
            norm = float(outer)
        else:
            norm = 1.0
        tops = [total / max(1.0, norm)]
        if len(self.top) == 2:
            tops.append(torch.softmax(x, self.axis))
        return tops


class Accuracy(Layer):
    type = "Accuracy"
    min_bottoms, max_bottoms = 2, 2

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
            # Caffe counts a hit when fewer than top_k classes score strictly higher.
            better = (s > true).sum(1)
            hits = ((better < self.top_k) & valid).sum()
            count = valid.sum()
            return [hits.to(torch.float32) / count.clamp(min=1).to(torch.float32)]


class EuclideanLoss(Layer):
    type = "EuclideanLoss"
    is_loss = True
    min_bottoms, max_bottoms = 2, 2

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        if math.prod(shapes[0]) != math.prod(shapes[1]):
            raise self.error(f"bottoms must have equal counts, got {list(shapes[0])} and {list(shapes[1])}")

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        a, b = bottoms
        d = a.reshape(-1) - b.reshape(-1)
        return [(d * d).sum() / a.shape[0] / 2]
