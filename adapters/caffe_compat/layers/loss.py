"""Loss layers with Caffe's normalizations and gradients: SoftmaxWithLoss, EuclideanLoss, ContrastiveLoss, SigmoidCrossEntropyLoss, HingeLoss, InfogainLoss and MultinomialLogisticLoss."""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F

from ddl.caffe.formats import schema
from ddl.caffe.layers.base import Layer, axis_index

FULL, VALID, BATCH_SIZE, NONE = 0, 1, 2, 3


LOG_FLT_MIN = math.log(1.1754943508222875e-38)   # Caffe takes log(max(p, FLT_MIN))


FLT_MIN = 1.1754943508222875e-38


LOG_THRESHOLD = 1e-20            # Caffe's kLOG_THRESHOLD


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


def with_gradient(value: torch.Tensor, linear: torch.Tensor) -> torch.Tensor:
    """``value`` forward, the gradient of ``linear`` backward (for Caffe's not-quite-true gradients)."""
    return value.detach() + (linear - linear.detach())


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


class _Loss(Layer):
    is_loss = True
    params: tuple[str, ...] = ("loss_param",)

    def allow_force_backward(self, i: int) -> bool:
        return i == 0


class ContrastiveLoss(_Loss):
    """Hadsell et al.: similar pairs d^2, dissimilar max(margin - d, 0)^2 (legacy: max(margin - d^2, 0)), / 2N."""

    type = "ContrastiveLoss"
    params = ("contrastive_loss_param", "loss_param")
    min_bottoms, max_bottoms = 3, 3

    def allow_force_backward(self, i: int) -> bool:
        return i < 2

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        a, b, y = shapes
        if a != b or len(a) < 2 or math.prod(a[2:]) != 1:
            raise self.error(f"the two feature bottoms must be equal (N, C[, 1, 1]), got {list(a)} and {list(b)}")
        if math.prod(y) != a[0]:
            raise self.error(f"the similarity bottom needs one value per pair ({a[0]}), got shape {list(y)}")

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        p = self.lp.contrastive_loss_param
        a, b, y = bottoms
        n = a.shape[0]
        diff = (a - b).reshape(n, -1)
        dist_sq = (diff * diff).sum(1)
        similar = y.detach().reshape(-1).to(torch.int64) != 0          # Caffe casts the label to int
        if p.legacy_version:
            far = F.relu(p.margin - dist_sq)
        else:
            dist = dist_sq.detach().sqrt()
            mdist = F.relu(p.margin - dist)
            # Caffe's gradient divides by (d + 1e-4), not d: beta = -(margin - d) / (d + 1e-4).
            coef = (-2 * mdist / (dist + 1e-4)).detach()
            far = with_gradient(mdist * mdist, coef * (diff * diff.detach()).sum(1))
        per = torch.where(similar, dist_sq, far)
        return [per.sum() / n / 2]


class SigmoidCrossEntropyLoss(_Loss):
    """-sum[t log sigmoid(x) + (1 - t) log(1 - sigmoid(x))], computed stably; default normalization BATCH_SIZE."""

    type = "SigmoidCrossEntropyLoss"
    min_bottoms, max_bottoms = 2, 2

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        if math.prod(shapes[0]) != math.prod(shapes[1]):
            raise self.error(f"scores and targets must have equal counts, got {list(shapes[0])} and {list(shapes[1])}")
        lp = self.lp.loss_param
        self.ignore = int(lp.ignore_label) if lp.HasField("ignore_label") else None
        self.mode = normalization_mode(self, BATCH_SIZE)     # Caffe's historical default here

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        x, t = bottoms[0], bottoms[1].detach().reshape(bottoms[0].shape)
        per = F.binary_cross_entropy_with_logits(x, t.to(x.dtype), reduction="none")
        valid = None
        if self.ignore is not None:
            keep = t.to(torch.int64) != self.ignore
            per = per * keep
            valid = float(keep.sum())
        outer = x.shape[0] if x.dim() else 1
        return [per.sum() / normalizer(self.mode, outer, x.numel() // max(outer, 1), valid)]


class HingeLoss(_Loss):
    """One-vs-all hinge: sum_j max(0, 1 - delta(j = label) * x_j) (L1) or its square (L2), / N."""

    type = "HingeLoss"
    params = ("hinge_loss_param", "loss_param")
    min_bottoms, max_bottoms = 2, 2

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        if math.prod(shapes[1]) != shapes[0][0]:
            raise self.error(f"needs one label per item ({shapes[0][0]}), got shape {list(shapes[1])}")

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        x = bottoms[0].reshape(bottoms[0].shape[0], -1)
        lab = bottoms[1].detach().reshape(-1).to(torch.int64)
        sign = torch.ones_like(x).scatter_(1, lab[:, None], -1.0)
        margin = F.relu(1 + x * sign)
        per = margin if self.lp.hinge_loss_param.norm == 1 else margin * margin
        return [per.sum() / x.shape[0]]


class InfogainLoss(_Loss):
    """-sum_l H[label, l] log softmax(x)_l (BVLC master: the softmax is inside the layer), normalized as SoftmaxWithLoss."""

    type = "InfogainLoss"
    params = ("infogain_loss_param", "loss_param", "softmax_param")
    min_bottoms, max_bottoms = 2, 3
    max_tops = 2

    def allow_force_backward(self, i: int) -> bool:
        return i == 0

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        from ddl.caffe.formats.blobs import to_array
        from ddl.caffe.formats.protofile import read_binary
        p = self.lp.infogain_loss_param
        self.axis = axis_index(p.axis, len(shapes[0]), self)
        self.outer = math.prod(shapes[0][: self.axis])
        self.labels = shapes[0][self.axis]
        self.inner = math.prod(shapes[0][self.axis + 1:])
        if math.prod(shapes[1]) != self.outer * self.inner:
            raise self.error(f"label count {math.prod(shapes[1])} must equal outer x inner = {self.outer * self.inner}")
        self.H: torch.Tensor | None = None
        if len(shapes) == 3:
            if math.prod(shapes[2]) != self.labels ** 2:
                raise self.error(f"the infogain bottom must hold {self.labels}x{self.labels} values, got {list(shapes[2])}")
        else:
            if not p.source:
                raise self.error("give infogain_loss_param.source (a .binaryproto matrix) or a third bottom")
            if not Path(p.source).exists():
                raise self.error(f"infogain matrix {p.source} does not exist")
            h = to_array(read_binary(p.source, schema.BlobProto()), where=p.source)
            if h.size != self.labels ** 2:
                raise self.error(f"{p.source} holds {h.size} values; {self.labels} classes need {self.labels ** 2}")
            self.H = torch.from_numpy(h.reshape(self.labels, self.labels).copy())
        lp = self.lp.loss_param
        self.ignore = int(lp.ignore_label) if lp.HasField("ignore_label") else None
        self.mode = normalization_mode(self, VALID)

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        x = bottoms[0]
        h = (bottoms[2].detach() if len(bottoms) == 3 else self.H).reshape(self.labels, self.labels).to(x.dtype)  # type: ignore[union-attr]
        logp_all = torch.log_softmax(x, self.axis)
        prob = logp_all.exp()
        # Caffe takes log(max(p, FLT_MIN)); its gradient stays p * rowsum(H) - H[label].
        raw = logp_all.reshape(self.outer, self.labels, self.inner)
        logp = with_gradient(raw.clamp(min=math.log(FLT_MIN)), raw)
        lab = bottoms[1].detach().reshape(self.outer, self.inner).to(torch.int64)
        valid = torch.ones_like(lab, dtype=torch.bool) if self.ignore is None else lab != self.ignore
        rows = h[torch.where(valid, lab, torch.zeros_like(lab))]          # (outer, inner, labels)
        per = -(rows.permute(0, 2, 1) * logp).sum(1) * valid
        count = None if self.ignore is None else float(valid.sum())
        loss = per.sum() / normalizer(self.mode, self.outer, self.inner, count)
        return [loss, prob] if len(self.top) == 2 else [loss]


class MultinomialLogisticLoss(_Loss):
    """-log(max(p[label], 1e-20)) averaged over items, where the bottom already holds probabilities."""

    type = "MultinomialLogisticLoss"
    min_bottoms, max_bottoms = 2, 2

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        if math.prod(shapes[1]) != shapes[0][0]:
            raise self.error(f"needs one label per item ({shapes[0][0]}), got shape {list(shapes[1])}")

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        p = bottoms[0].reshape(bottoms[0].shape[0], -1)
        lab = bottoms[1].detach().reshape(-1).to(torch.int64)
        if int(lab.min()) < 0 or int(lab.max()) >= p.shape[1]:
            raise self.error(f"labels must lie in [0, {p.shape[1]}), got [{int(lab.min())}, {int(lab.max())}]")
        picked = p.gather(1, lab[:, None])[:, 0]
        # Value log(max(p, 1e-20)); gradient -1/max(p, 1e-20) even below the threshold, as in Caffe.
        clamped = picked + (picked.clamp(min=LOG_THRESHOLD) - picked).detach()
        return [-torch.log(clamped).sum() / p.shape[0]]
