"""Loss layers against Caffe's Forward/Backward loops, including where Caffe's gradient is not the exact one."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("google.protobuf")

from pathlib import Path  # noqa: E402

from ddl.caffe.formats import blobs, protofile, schema  # noqa: E402
from ddl.caffe.layers.check import forward, gradients, numeric_check, single_layer  # noqa: E402

RNG = np.random.default_rng(3)


def test_contrastive_loss_and_caffes_1e4_gradient() -> None:
    a, b = RNG.standard_normal((6, 4)) * 0.4, RNG.standard_normal((6, 4)) * 0.4
    y = np.array([1.0, 0, 0, 1, 0, 0])
    for legacy in (False, True):
        la = single_layer(f'name: "c" type: "ContrastiveLoss" bottom: "a" bottom: "b" bottom: "y" top: "l" '
                          f'contrastive_loss_param {{ margin: 1.5 legacy_version: {str(legacy).lower()} }}', [a.shape, b.shape, y.shape])
        d2 = ((a - b) ** 2).sum(1)
        far = np.maximum(1.5 - d2, 0) if legacy else np.maximum(1.5 - np.sqrt(d2), 0) ** 2
        ref = np.where(y != 0, d2, far).sum() / 6 / 2
        assert forward(la, [a, b, y])[0] == pytest.approx(ref, rel=1e-12)
        (ga, gb), _ = gradients(la, [a, b, y], [np.float64(2.0)], wrt=(0, 1))
        # Caffe's Backward: alpha = sign * top_diff / N; similar: alpha * diff; dissimilar (new): -alpha (m - d) / (d + 1e-4) diff
        alpha, diff = 2.0 / 6, a - b
        dist = np.sqrt(d2)
        mdist = 1.5 - d2 if legacy else 1.5 - dist
        beta = -alpha if legacy else -alpha * mdist / (dist + 1e-4)
        ref_a = np.where((y != 0)[:, None], alpha * diff, np.where((mdist > 0)[:, None], beta[:, None] * diff if not legacy else beta * diff, 0))
        np.testing.assert_allclose(ga, ref_a, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(gb, -ref_a, rtol=1e-10, atol=1e-12)
        numeric_check(la, [a, b, y], wrt=(0, 1), rtol=2e-3)    # the 1e-4 is Caffe's, not calculus


@pytest.mark.parametrize(("norm", "divisor"), [("", 3.0), ("loss_param { normalization: FULL }", 12.0),
                                               ("loss_param { normalization: VALID ignore_label: -1 }", 10.0),
                                               ("loss_param { normalization: NONE }", 1.0)])
def test_sigmoid_cross_entropy_normalizations(norm: str, divisor: float) -> None:
    x = RNG.standard_normal((3, 4)) * 3
    t = RNG.integers(0, 2, (3, 4)).astype(np.float64)
    if "ignore" in norm:
        t[0, 1] = t[2, 3] = -1
    la = single_layer(f'name: "s" type: "SigmoidCrossEntropyLoss" bottom: "x" bottom: "t" top: "l" {norm}', [x.shape, t.shape])
    keep = t != -1
    # Caffe's stable form: -[x (t - (x >= 0)) - log(1 + exp(x - 2 x (x >= 0)))]
    per = -(x * (t - (x >= 0)) - np.log1p(np.exp(x - 2 * x * (x >= 0))))
    assert forward(la, [x, t])[0] == pytest.approx((per * keep).sum() / divisor, rel=1e-12)
    (g,), _ = gradients(la, [x, t], [np.float64(1.0)])
    np.testing.assert_allclose(g, (1 / (1 + np.exp(-x)) - t) * keep / divisor, rtol=1e-10, atol=1e-14)
    numeric_check(la, [x, t])


@pytest.mark.parametrize("norm", ["L1", "L2"])
def test_hinge_loss(norm: str) -> None:
    x, lab = RNG.standard_normal((4, 5)), np.array([0.0, 3, 1, 4])
    la = single_layer(f'name: "h" type: "HingeLoss" bottom: "x" bottom: "l" top: "o" hinge_loss_param {{ norm: {norm} }}', [x.shape, lab.shape])
    sign = np.ones_like(x)
    sign[np.arange(4), lab.astype(int)] = -1
    m = np.maximum(0, 1 + x * sign)
    assert forward(la, [x, lab])[0] == pytest.approx((m if norm == "L1" else m * m).sum() / 4, rel=1e-12)
    (g,), _ = gradients(la, [x, lab], [np.float64(1.0)])
    ref = (np.sign(m) if norm == "L1" else 2 * m) * sign / 4
    np.testing.assert_allclose(g, ref, rtol=1e-12)
    numeric_check(la, [x, lab])


def test_infogain_loss_with_internal_softmax_from_file_and_bottom(tmp_path: Path) -> None:
    x, lab = RNG.standard_normal((4, 3)), np.array([0.0, 2, 1, 2])
    h = np.abs(RNG.standard_normal((3, 3)))
    src = tmp_path / "H.binaryproto"
    protofile.write_binary(src, blobs.from_array(h.reshape(1, 1, 3, 3).astype(np.float32)))
    la = single_layer(f'name: "i" type: "InfogainLoss" bottom: "x" bottom: "l" top: "o" infogain_loss_param {{ source: "{src}" }}', [x.shape, lab.shape])
    p = np.exp(x) / np.exp(x).sum(1, keepdims=True)
    hf = h.astype(np.float32).astype(np.float64)
    ref = -(hf[lab.astype(int)] * np.log(p)).sum() / 4
    assert forward(la, [x, lab])[0] == pytest.approx(ref, rel=1e-6)
    (g,), _ = gradients(la, [x, lab], [np.float64(1.0)])
    rows = hf[lab.astype(int)]
    np.testing.assert_allclose(g, (p * rows.sum(1, keepdims=True) - rows) / 4, rtol=1e-6)   # Caffe's Backward
    numeric_check(la, [x, lab])
    three = single_layer('name: "i" type: "InfogainLoss" bottom: "x" bottom: "l" bottom: "h" top: "o"', [x.shape, lab.shape, h.shape])
    assert forward(three, [x, lab, h])[0] == pytest.approx(-(h[lab.astype(int)] * np.log(p)).sum() / 4, rel=1e-10)


def test_multinomial_logistic_loss_and_its_threshold_gradient() -> None:
    p = np.array([[0.2, 0.5, 0.3], [1e-30, 0.5, 0.5]])
    lab = np.array([1.0, 0.0])
    la = single_layer('name: "m" type: "MultinomialLogisticLoss" bottom: "p" bottom: "l" top: "o"', [p.shape, lab.shape])
    assert forward(la, [p, lab])[0] == pytest.approx(-(np.log(0.5) + np.log(1e-20)) / 2, rel=1e-12)
    (g,), _ = gradients(la, [p, lab], [np.float64(1.0)])
    np.testing.assert_allclose(g, [[0, -1 / 0.5 / 2, 0], [-1 / 1e-20 / 2, 0, 0]], rtol=1e-12)   # Caffe: 1 / max(p, 1e-20)


def test_euclidean_and_softmax_loss_gradients_check_numerically() -> None:
    a, b = RNG.standard_normal((3, 4)), RNG.standard_normal((3, 4))
    eu = single_layer('name: "e" type: "EuclideanLoss" bottom: "a" bottom: "b" top: "l"', [a.shape, b.shape])
    assert forward(eu, [a, b])[0] == pytest.approx(((a - b) ** 2).sum() / 3 / 2)
    numeric_check(eu, [a, b], wrt=(0, 1))
    x, lab = RNG.standard_normal((3, 5, 2)), RNG.integers(0, 5, (3, 2)).astype(np.float64)
    sm = single_layer('name: "s" type: "SoftmaxWithLoss" bottom: "x" bottom: "l" top: "o" top: "p"', [x.shape, lab.shape])
    loss, prob = forward(sm, [x, lab])
    np.testing.assert_allclose(prob, np.exp(x) / np.exp(x).sum(1, keepdims=True), rtol=1e-12)
    numeric_check(sm, [x, lab])


def test_accuracy_per_class_top() -> None:
    x = np.array([[0.9, 0.1, 0.0], [0.1, 0.8, 0.1], [0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
    lab = np.array([0.0, 1, 1, 2])
    la = single_layer('name: "a" type: "Accuracy" bottom: "x" bottom: "l" top: "acc" top: "per"', [x.shape, lab.shape])
    acc, per = forward(la, [x, lab])
    assert acc == pytest.approx(0.75)
    np.testing.assert_allclose(per, [1.0, 0.5, 1.0])
    assert single_layer('name: "a" type: "Accuracy" bottom: "x" bottom: "l" top: "acc"', [x.shape, lab.shape], phase=schema.TEST).allow_force_backward(0) is False
