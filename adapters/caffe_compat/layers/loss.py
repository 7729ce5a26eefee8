"""SoftmaxWithLoss (ignore_label, normalization modes), Accuracy (top_k, per-class top) and EuclideanLoss; the loss normalizers."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

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


def normalization_mode(layer: Layer, default: int) -> int:
    """LossParameter's mode: ``normalization``, else the deprecated ``normalize`` (VALID or BATCH_SIZE), else ``default``."""
    lp = layer.lp.loss_param
    if lp.HasField("normalization"):
        return int(lp.normalization)
    if lp.HasField("normalize"):
        return VALID if lp.normalize else BATCH_SIZE
    return default


def normalizer(mode: int, outer: int, inner: int, valid: float | None) -> float:
    """Caffe's LossLayer::GetNormalizer (at least 1); ``valid`` is None when no ignore_label is set."""
    if mode == FULL or (mode == VALID and valid is None):
        n = float(outer * inner)
    elif mode == VALID:
        n = float(valid)                                    # type: ignore[arg-type]
    elif mode == BATCH_SIZE:
        n = float(outer)
    else:
        n = 1.0
    return max(1.0, n)


class SoftmaxWithLoss(Layer):
    type = "SoftmaxWithLoss"
    params = ("softmax_param", "loss_param")
    is_loss = True
    min_bottoms, max_bottoms = 2, 2
    max_tops = 2

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        self.axis = axis_index(self.lp.softmax_param.axis, len(shapes[0]), self)
        _check_labels(self, shapes, self.axis)
        lp = self.lp.loss_param
        self.ignore: int | None = int(lp.ignore_label) if lp.HasField("ignore_label") else None
        self.mode = normalization_mode(self, VALID)

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        x, label = bottoms
        outer, c, inner = _split(tuple(x.shape), self.axis)
        x3 = x.reshape(outer, c, inner) if inner > 1 else x.reshape(outer, c)
        lab = label.reshape(outer, inner).long() if inner > 1 else label.reshape(outer).long()
        try:
            nll = F.cross_entropy(x3, lab, ignore_index=-100 if self.ignore is None else self.ignore, reduction="none")
        except (IndexError, RuntimeError) as e:
            raise self.error(f"labels must lie in [0, {c}) or equal ignore_label ({e})") from None
        if float(nll.detach().max()) > -LOG_FLT_MIN:
            # Caffe's value is -log(max(p, FLT_MIN)); its gradient stays p - 1{label}.
            nll = nll - (nll - nll.clamp(max=-LOG_FLT_MIN)).detach()
        total = nll.sum()
        valid = None if self.ignore is None else float(lab.ne(self.ignore).sum())
        tops = [total / normalizer(self.mode, outer, inner, valid)]
        if len(self.top) == 2:
            tops.append(torch.softmax(x, self.axis))
        return tops


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
            # Caffe counts a hit when fewer than top_k classes score strictly higher.
            better = (s > true).sum(1)
            hit = (better < self.top_k) & valid
            count = valid.sum()
            acc = hit.sum().to(x.dtype) / count.clamp(min=1).to(x.dtype)
            if len(self.top) == 1:
                return [acc]
            per = torch.zeros(c, dtype=x.dtype).index_add_(0, safe[hit], torch.ones(int(hit.sum()), dtype=x.dtype))
            seen = torch.zeros(c, dtype=x.dtype).index_add_(0, safe[valid], torch.ones(int(valid.sum()), dtype=x.dtype))
            return [acc, torch.where(seen > 0, per / seen.clamp(min=1), torch.zeros_like(per))]


class EuclideanLoss(Layer):
    type = "EuclideanLoss"
    params = ("loss_param",)
    is_loss = True
    min_bottoms, max_bottoms = 2, 2

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        if math.prod(shapes[0]) != math.prod(shapes[1]):
            raise self.error(f"bottoms must have equal counts, got {list(shapes[0])} and {list(shapes[1])}")

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        a, b = bottoms
        d = a.reshape(-1) - b.reshape(-1)
        return [(d * d).sum() / a.shape[0] / 2]
