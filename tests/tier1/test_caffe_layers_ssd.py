"""SSD's layers (weiliu89/caffe ssd branch): PriorBox and DetectionOutput against transcriptions of its loops; Permute, Normalize."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("google.protobuf")

from ddl.caffe.layers.check import forward, numeric_check, single_layer  # noqa: E402

RNG = np.random.default_rng(4)


def prior_ref(lh: int, lw: int, ih: int, iw: int, mins: list[float], maxs: list[float], ars: list[float], flip: bool,
              clip: bool, var: list[float], offset: float = 0.5) -> np.ndarray:
    """The reference PriorBoxLayer::Forward_cpu loop (sizes truncated to int, as there)."""
    ratios = [1.0]
    for ar in ars:
        if all(abs(ar - r) >= 1e-6 for r in ratios):
            ratios.append(ar)
            if flip:
                ratios.append(1 / ar)
    sw, sh = iw / lw, ih / lh
    out = []
    for h in range(lh):
        for w in range(lw):
            cx, cy = (w + offset) * sw, (h + offset) * sh
            for s, mn in enumerate(mins):
                m = int(mn)
                boxes = [(m, m)]
                if maxs:
                    boxes.append((math.sqrt(m * int(maxs[s])),) * 2)
                boxes += [(m * math.sqrt(ar), m / math.sqrt(ar)) for ar in ratios if abs(ar - 1) >= 1e-6]
                for bw, bh in boxes:
                    out += [(cx - bw / 2) / iw, (cy - bh / 2) / ih, (cx + bw / 2) / iw, (cy + bh / 2) / ih]
    corners = np.clip(out, 0, 1) if clip else np.asarray(out)
    return np.stack([corners, np.tile(var, len(corners) // len(var))])[None]


def test_priorbox_matches_the_reference_loop_mobilenet_ssd_settings() -> None:
    la = single_layer('name: "p" type: "PriorBox" bottom: "f" bottom: "img" top: "pr" prior_box_param { min_size: 60.0 max_size: 105.0 '
                      'aspect_ratio: 2.0 aspect_ratio: 3.0 flip: true clip: false variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2 offset: 0.5 }',
                      [(1, 512, 5, 5), (1, 3, 300, 300)])
    got = forward(la, [np.zeros((1, 512, 5, 5)), np.zeros((1, 3, 300, 300))])[0]
    ref = prior_ref(5, 5, 300, 300, [60], [105], [2, 3], True, False, [0.1, 0.1, 0.2, 0.2])
    assert got.shape == (1, 2, 5 * 5 * 6 * 4)
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-7)
    clipped = single_layer('name: "p" type: "PriorBox" bottom: "f" bottom: "img" top: "pr" prior_box_param { min_size: 30 aspect_ratio: 2 clip: true step: 16 }',
                           [(1, 8, 3, 4), (1, 3, 48, 64)])
    got = forward(clipped, [np.zeros((1, 8, 3, 4)), np.zeros((1, 3, 48, 64))])[0]
    assert got.shape == (1, 2, 3 * 4 * 3 * 4) and got[0, 0].min() >= 0 and got[0, 0].max() <= 1
    np.testing.assert_allclose(got[0, 1], 0.1, rtol=1e-7)   # the default variance


def _jaccard(a: np.ndarray, b: np.ndarray) -> float:
    iw, ih = min(a[2], b[2]) - max(a[0], b[0]), min(a[3], b[3]) - max(a[1], b[1])
    if iw < 0 or ih < 0:
        return 0.0
    inter = iw * ih
    return float(inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter))


def test_detection_output_decodes_suppresses_and_keeps_top_k() -> None:
    priors = np.array([[0.1, 0.1, 0.3, 0.3], [0.12, 0.1, 0.32, 0.3], [0.6, 0.6, 0.9, 0.8], [0.5, 0.1, 0.7, 0.3]])
    var = np.array([0.1, 0.1, 0.2, 0.2])
    loc = RNG.standard_normal((1, 4, 4)) * 0.5
    conf = np.array([[[0.1, 0.8, 0.1], [0.2, 0.7, 0.1], [0.1, 0.1, 0.8], [0.9, 0.05, 0.05]]])
    prior_blob = np.stack([priors.reshape(-1), np.tile(var, 4)])[None]
    la = single_layer('name: "d" type: "DetectionOutput" bottom: "loc" bottom: "conf" bottom: "pr" top: "det" detection_output_param { '
                      'num_classes: 3 share_location: true background_label_id: 0 nms_param { nms_threshold: 0.45 top_k: 400 } '
                      'code_type: CENTER_SIZE keep_top_k: 2 confidence_threshold: 0.04 }',
                      [(1, 16), (1, 12), prior_blob.shape])
    det = forward(la, [loc.reshape(1, 16), conf.reshape(1, 12), prior_blob])[0][0, 0]
    # Reference: CENTER_SIZE decode, per-class NMS over scores > threshold, then keep the 2 best overall.
    pw, ph = priors[:, 2] - priors[:, 0], priors[:, 3] - priors[:, 1]
    cx = var[0] * loc[0, :, 0] * pw + (priors[:, 0] + priors[:, 2]) / 2
    cy = var[1] * loc[0, :, 1] * ph + (priors[:, 1] + priors[:, 3]) / 2
    w, h = np.exp(var[2] * loc[0, :, 2]) * pw, np.exp(var[3] * loc[0, :, 3]) * ph
    boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1)
    found = []
    for c in (1, 2):
        keep: list[int] = []
        for i in sorted(range(4), key=lambda i: -conf[0, i, c]):
            if conf[0, i, c] > 0.04 and all(_jaccard(boxes[i], boxes[k]) <= 0.45 for k in keep):
                keep.append(i)
        found += [(conf[0, i, c], c, i) for i in keep]
    best = sorted(found, reverse=True)[:2]
    rows = sorted(best, key=lambda t: (t[1], -t[0]))
    ref = np.array([[0, c, s, *boxes[i]] for s, c, i in rows])
    np.testing.assert_allclose(det, ref, rtol=1e-6)
    empty = forward(la, [loc.reshape(1, 16), np.full((1, 12), 0.01), prior_blob])[0]
    np.testing.assert_array_equal(empty[0, 0], [[0, -1, -1, -1, -1, -1, -1]])


def test_permute_and_normalize() -> None:
    x = RNG.standard_normal((2, 3, 4, 5))
    pm = single_layer('name: "p" type: "Permute" bottom: "x" top: "y" permute_param { order: 0 order: 2 order: 3 order: 1 }', [x.shape])
    np.testing.assert_array_equal(forward(pm, [x])[0], x.transpose(0, 2, 3, 1))
    for body, axes in (("across_spatial: false channel_shared: false", (1,)), ("", (1, 2, 3))):
        nm = single_layer(f'name: "n" type: "Normalize" bottom: "x" top: "y" norm_param {{ {body} scale_filler {{ type: "constant" value: 20 }} }}', [x.shape])
        ref = 20 * x / np.sqrt((x * x).sum(axis=axes, keepdims=True) + 1e-10)
        np.testing.assert_allclose(forward(nm, [x])[0], ref, rtol=1e-6)
        numeric_check(nm, [x])
