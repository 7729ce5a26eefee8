"""SSD's detection layers (weiliu89/caffe, ssd branch): PriorBox and DetectionOutput (inference)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ddl.caffe.layers.base import Layer

CORNER, CENTER_SIZE, CORNER_SIZE = 1, 2, 3


def prior_boxes(p: object, layer_hw: tuple[int, int], image_hw: tuple[int, int]) -> np.ndarray:
    """SSD's priors for one feature map: (2, H*W*num_priors*4) float32 = corners, then variances."""
    pp: Any = p
    mins = [int(m) for m in pp.min_size]        # the reference truncates sizes to int
    maxs = [int(m) for m in pp.max_size]
    ratios = [1.0]
    for ar in pp.aspect_ratio:
        if all(abs(ar - r) >= 1e-6 for r in ratios):
            ratios.append(ar)
            if pp.flip:
                ratios.append(1.0 / ar)
    lh, lw = layer_hw
    ih, iw = (pp.img_h, pp.img_w) if (pp.HasField("img_h") or pp.HasField("img_w")) else \
        ((pp.img_size, pp.img_size) if pp.HasField("img_size") else image_hw)
    if pp.HasField("step_h") or pp.HasField("step_w"):
        sh, sw = pp.step_h, pp.step_w
    elif pp.HasField("step"):
        sh = sw = pp.step
    else:
        sh, sw = np.float32(ih) / np.float32(lh), np.float32(iw) / np.float32(lw)
    boxes: list[float] = []
    for h in range(lh):
        for w in range(lw):
            cx, cy = np.float32((w + pp.offset) * sw), np.float32((h + pp.offset) * sh)
            for s, mn in enumerate(mins):
                sizes: list[tuple[float, float]] = [(float(mn), float(mn))]
                if maxs:
                    side = math.sqrt(mn * maxs[s])
                    sizes.append((side, side))
                sizes += [(mn * math.sqrt(ar), mn / math.sqrt(ar)) for ar in ratios if abs(ar - 1.0) >= 1e-6]
                for bw, bh in sizes:
                    boxes += [(cx - bw / 2.0) / iw, (cy - bh / 2.0) / ih, (cx + bw / 2.0) / iw, (cy + bh / 2.0) / ih]
    corners = np.asarray(boxes, np.float32)
    if pp.clip:
        corners = np.clip(corners, 0.0, 1.0)
    var = list(pp.variance) or [0.1]
    variances = np.tile(np.asarray(var, np.float32), len(corners) // len(var))
    return np.stack([corners, variances])


class PriorBox(Layer):
    """Default boxes of one feature map (bottom 0) over the image (bottom 1): top (1, 2, H*W*priors*4)."""

    type = "PriorBox"
    params = ("prior_box_param",)
    min_bottoms, max_bottoms = 2, 2

    def allow_force_backward(self, i: int) -> bool:
        return False

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p = self.lp.prior_box_param
        if not len(p.min_size) or min(p.min_size) <= 0:
            raise self.error("prior_box_param needs positive min_size values")
        if len(p.max_size) and (len(p.max_size) != len(p.min_size) or any(b <= a for a, b in zip(p.min_size, p.max_size, strict=True))):
            raise self.error("give one max_size per min_size, each larger than its min_size")
        if len(p.variance) not in (0, 1, 4) or any(v <= 0 for v in p.variance):
            raise self.error(f"give 1 or 4 positive variance values, got {list(p.variance)}")
        if p.HasField("img_size") and (p.HasField("img_h") or p.HasField("img_w")):
            raise self.error("give img_size or img_h/img_w, not both")
        if p.HasField("step") and (p.HasField("step_h") or p.HasField("step_w")):
            raise self.error("give step or step_h/step_w, not both")
        self.cache: dict[tuple[int, ...], torch.Tensor] = {}

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        key = tuple(bottoms[0].shape[-2:]) + tuple(bottoms[1].shape[-2:])
        if key not in self.cache:
            arr = prior_boxes(self.lp.prior_box_param, (key[0], key[1]), (key[2], key[3]))
            self.cache[key] = torch.from_numpy(arr[None])
        return [self.cache[key].to(bottoms[0].dtype)]


def decode_boxes(loc: np.ndarray, priors: np.ndarray, variances: np.ndarray, code: int, in_target: bool) -> np.ndarray:
    """SSD's DecodeBBox for arrays of (P, 4) predictions, priors and variances (no clipping)."""
    v = np.ones_like(variances) if in_target else variances
    pw, ph = priors[:, 2] - priors[:, 0], priors[:, 3] - priors[:, 1]
    if code == CORNER:
        return np.asarray(priors + v * loc)
    if code == CORNER_SIZE:
        return np.asarray(priors + v * loc * np.stack([pw, ph, pw, ph], 1))
    pcx, pcy = (priors[:, 0] + priors[:, 2]) / 2, (priors[:, 1] + priors[:, 3]) / 2
    cx, cy = v[:, 0] * loc[:, 0] * pw + pcx, v[:, 1] * loc[:, 1] * ph + pcy
    w, h = np.exp(v[:, 2] * loc[:, 2]) * pw, np.exp(v[:, 3] * loc[:, 3]) * ph
    return np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1)


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """SSD's JaccardOverlap on normalized boxes (0 when they do not intersect)."""
    if b[0] > a[2] or b[2] < a[0] or b[1] > a[3] or b[3] < a[1]:
        return 0.0
    iw, ih = min(a[2], b[2]) - max(a[0], b[0]), min(a[3], b[3]) - max(a[1], b[1])
    inter = iw * ih

    def size(x: np.ndarray) -> float:
        return 0.0 if (x[2] < x[0] or x[3] < x[1]) else float((x[2] - x[0]) * (x[3] - x[1]))
    return float(inter / (size(a) + size(b) - inter))


def nms(boxes: np.ndarray, scores: np.ndarray, threshold: float, nms_threshold: float, eta: float, top_k: int) -> list[int]:
    """SSD's ApplyNMSFast: scores above threshold, best first (stable), at most top_k, greedy by overlap."""
    cand = [i for i in np.argsort(-scores, kind="stable") if scores[i] > threshold]
    if top_k > -1:
        cand = cand[:top_k]
    keep: list[int] = []
    adaptive = nms_threshold
    for i in cand:
        ok = all(jaccard(boxes[i], boxes[k]) <= adaptive for k in keep)
        if ok:
            keep.append(int(i))
            if eta < 1 and adaptive > 0.5:
                adaptive *= eta
    return keep


class DetectionOutput(Layer):
    """Boxes decoded from loc/conf/priors, per-class NMS, keep_top_k; top (1, 1, D, 7): image, label, score, box."""

    type = "DetectionOutput"
    params = ("detection_output_param",)
    min_bottoms, max_bottoms = 3, 3

    def allow_force_backward(self, i: int) -> bool:
        return False

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p = self.lp.detection_output_param
        if p.num_classes <= 0:
            raise self.error("detection_output_param.num_classes must be given")
        if p.save_output_param.output_directory or p.visualize:
            raise self.error("save_output_param and visualize are not supported; read the top instead")
        self.num_priors = shapes[2][2] // 4
        loc_classes = 1 if p.share_location else p.num_classes
        if math.prod(shapes[0][1:]) != self.num_priors * loc_classes * 4:
            raise self.error(f"loc has {math.prod(shapes[0][1:])} values per image; {self.num_priors} priors need {self.num_priors * loc_classes * 4}")
        if math.prod(shapes[1][1:]) != self.num_priors * p.num_classes:
            raise self.error(f"conf has {math.prod(shapes[1][1:])} values per image; {self.num_priors} priors x {p.num_classes} classes need {self.num_priors * p.num_classes}")

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        p = self.lp.detection_output_param
        loc_all = bottoms[0].detach().cpu().double().numpy().reshape(bottoms[0].shape[0], self.num_priors, -1, 4)
        conf_all = bottoms[1].detach().cpu().double().numpy().reshape(bottoms[1].shape[0], self.num_priors, p.num_classes)
        prior = bottoms[2].detach().cpu().double().numpy().reshape(2, self.num_priors, 4)
        thr = p.confidence_threshold if p.HasField("confidence_threshold") else -np.finfo(np.float32).max
        top_k = p.nms_param.top_k if p.nms_param.HasField("top_k") else -1
        rows: list[list[float]] = []
        for i in range(loc_all.shape[0]):
            found: dict[int, list[int]] = {}
            boxes_of: dict[int, np.ndarray] = {}
            for c in range(p.num_classes):
                if c == p.background_label_id:
                    continue
                li = 0 if p.share_location else c
                boxes = decode_boxes(loc_all[i, :, li], prior[0], prior[1], p.code_type, p.variance_encoded_in_target)
                boxes_of[c] = boxes
                found[c] = nms(boxes, conf_all[i, :, c], thr, p.nms_param.nms_threshold, p.nms_param.eta, top_k)
            total = sum(len(v) for v in found.values())
            if p.keep_top_k > -1 and total > p.keep_top_k:
                pairs = sorted(((conf_all[i, k, c], c, k) for c, ks in found.items() for k in ks), key=lambda t: -t[0])
                found = {}
                for _, c, k in pairs[: p.keep_top_k]:
                    found.setdefault(c, []).append(k)
            for c in sorted(found):
                for k in found[c]:
                    rows.append([float(i), float(c), float(conf_all[i, k, c]), *boxes_of[c][k].tolist()])
        if not rows:
            rows = [[float(i)] + [-1.0] * 6 for i in range(loc_all.shape[0])]
        return [torch.tensor(rows, dtype=bottoms[0].dtype).reshape(1, 1, len(rows), 7)]
