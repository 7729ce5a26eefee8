"""ddl.caffe layers: Caffe's shape rules and formulas, checked against float64 numpy references."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("google.protobuf")

from ddl.caffe.formats import protofile, schema  # noqa: E402
from ddl.caffe.layers import fillers  # noqa: E402
from ddl.caffe.layers.base import LayerError  # noqa: E402
from ddl.caffe.net.net import Net  # noqa: E402


def build(layers: str, shape: tuple[int, ...] = (2, 3, 7, 9), phase: int = schema.TEST, extra_inputs: str = "") -> Net:
    dims = " ".join(f"dim: {d}" for d in shape)
    text = f'layer {{ name: "in" type: "Input" top: "x" {extra_inputs} input_param {{ shape {{ {dims} }} }} }}\n' + layers
    return Net(protofile.parse_text(text, schema.NetParameter()), phase, gen=torch.Generator().manual_seed(3), quiet=True)


def run(net: Net, x: np.ndarray, top: str) -> np.ndarray:
    net.feed("x", x)
    with torch.no_grad():
        _, blobs = net.forward()
    return blobs[top].double().numpy()


def caffe_pool_ref(x: np.ndarray, k: int, s: int, p: int, mode: str) -> np.ndarray:
    """Caffe's pooling loops, transcribed from its documented rules (ceil + last-window clipping)."""
    n, c, h, w = x.shape
    oh = int(math.ceil((h + 2 * p - k) / s)) + 1
    ow = int(math.ceil((w + 2 * p - k) / s)) + 1
    if p:
        oh -= (oh - 1) * s >= h + p
        ow -= (ow - 1) * s >= w + p
    out = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            hs, ws = i * s - p, j * s - p
            he, we = min(hs + k, h + p), min(ws + k, w + p)
            size = (he - hs) * (we - ws)
            hs0, ws0, he0, we0 = max(hs, 0), max(ws, 0), min(he, h), min(we, w)
            win = x[:, :, hs0:he0, ws0:we0]
            out[:, :, i, j] = win.max(axis=(2, 3)) if mode == "MAX" else win.sum(axis=(2, 3)) / size
    return out


@pytest.mark.parametrize(("h", "k", "s", "p"), [(7, 3, 2, 0), (7, 3, 2, 1), (5, 2, 2, 1), (6, 3, 3, 1), (9, 3, 2, 1), (8, 2, 2, 0)])
@pytest.mark.parametrize("mode", ["MAX", "AVE"])
def test_pooling_matches_caffes_loops(h: int, k: int, s: int, p: int, mode: str) -> None:
    net = build(f'layer {{ name: "p" type: "Pooling" bottom: "x" top: "y" pooling_param {{ pool: {mode} kernel_size: {k} stride: {s} pad: {p} }} }}', (2, 3, h, h + 2))
    x = np.random.default_rng(h * k + s + p).standard_normal((2, 3, h, h + 2)).astype(np.float32)
    ref = caffe_pool_ref(x.astype(np.float64), k, s, p, mode)
    got = run(net, x, "y")
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)


def test_pooling_last_window_rule_drops_a_window_torch_floor_would_not_need() -> None:
    net = build('layer { name: "p" type: "Pooling" bottom: "x" top: "y" pooling_param { pool: MAX kernel_size: 2 stride: 2 pad: 1 } }', (1, 1, 5, 5))
    assert net.shapes["y"] == (1, 1, 3, 3)      # ceil((5+2-2)/2)+1 = 4, clipped to 3
    net = build('layer { name: "p" type: "Pooling" bottom: "x" top: "y" pooling_param { pool: MAX kernel_size: 3 stride: 2 } }', (1, 1, 6, 6))
    assert net.shapes["y"] == (1, 1, 3, 3)      # ceil((6-3)/2)+1 = 3 (floor would give 2)
    net = build('layer { name: "p" type: "Pooling" bottom: "x" top: "y" pooling_param { pool: AVE global_pooling: true } }', (2, 5, 7, 3))
    assert net.shapes["y"] == (2, 5, 1, 1)


def test_every_layer_type_output_shape_for_odd_sizes() -> None:
    layers = """
layer { name: "c1" type: "Convolution" bottom: "x" top: "c1" convolution_param { num_output: 6 kernel_h: 3 kernel_w: 5 pad_h: 2 pad_w: 1 stride_h: 2 stride_w: 3 group: 3 weight_filler { type: "msra" } } }
layer { name: "c2" type: "Convolution" bottom: "x" top: "c2" convolution_param { num_output: 5 kernel_size: 3 dilation: 2 pad: 1 } }
layer { name: "r" type: "ReLU" bottom: "c1" top: "c1" relu_param { negative_slope: 0.1 } }
layer { name: "sg" type: "Sigmoid" bottom: "c2" top: "sg" }
layer { name: "th" type: "TanH" bottom: "c2" top: "th" }
layer { name: "dp" type: "Dropout" bottom: "th" top: "dp" }
layer { name: "lrn" type: "LRN" bottom: "c2" top: "lrn" lrn_param { local_size: 3 } }
layer { name: "bn" type: "BatchNorm" bottom: "c2" top: "bn" }
layer { name: "sc" type: "Scale" bottom: "bn" top: "sc" scale_param { bias_term: true } }
layer { name: "el" type: "Eltwise" bottom: "sg" bottom: "th" bottom: "sc" top: "el" eltwise_param { operation: SUM coeff: 1 coeff: -1 coeff: 0.5 } }
layer { name: "cat" type: "Concat" bottom: "c2" bottom: "el" top: "cat" }
layer { name: "fl" type: "Flatten" bottom: "cat" top: "fl" flatten_param { axis: 2 } }
layer { name: "rs" type: "Reshape" bottom: "cat" top: "rs" reshape_param { shape { dim: 0 dim: -1 dim: 5 } } }
layer { name: "ip" type: "InnerProduct" bottom: "rs" top: "ip" inner_product_param { num_output: 4 axis: 2 } }
layer { name: "sm" type: "Softmax" bottom: "ip" top: "sm" softmax_param { axis: 1 } }
"""
    net = build(layers, (2, 3, 7, 9))
    s = net.shapes
    assert s["c1"] == (2, 6, (7 + 4 - 3) // 2 + 1, (9 + 2 - 5) // 3 + 1)
    assert s["c2"] == (2, 5, 7 + 2 - 5 + 1, 9 + 2 - 5 + 1)
    assert s["lrn"] == s["bn"] == s["sc"] == s["el"] == s["dp"] == (2, 5, 5, 7)
    assert s["cat"] == (2, 10, 5, 7) and s["fl"] == (2, 10, 35) and s["rs"] == (2, 70, 5)
    assert s["ip"] == (2, 70, 4) and s["sm"] == (2, 70, 4)
    net.feed("x", np.random.default_rng(0).standard_normal((2, 3, 7, 9)))
    _, blobs = net.forward()
    assert {k: tuple(v.shape) for k, v in blobs.items()} == {k: s[k] for k in blobs}


def test_lrn_formulas() -> None:
    x = np.random.default_rng(1).standard_normal((2, 7, 5, 6)).astype(np.float32)
    xd = x.astype(np.float64)
    net = build('layer { name: "l" type: "LRN" bottom: "x" top: "y" lrn_param { local_size: 5 alpha: 0.3 beta: 0.6 k: 2 } }', x.shape)
    sq = np.pad(xd ** 2, ((0, 0), (2, 2), (0, 0), (0, 0)))
    ref = xd / (2 + 0.3 / 5 * sum(sq[:, i:i + 7] for i in range(5))) ** 0.6
    np.testing.assert_allclose(run(net, x, "y"), ref, rtol=2e-5)
    net = build('layer { name: "l" type: "LRN" bottom: "x" top: "y" lrn_param { local_size: 3 alpha: 0.3 beta: 0.6 norm_region: WITHIN_CHANNEL } }', x.shape)
    sq = np.pad(xd ** 2, ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref = xd * (1 + 0.3 * sum(sq[:, :, i:i + 5, j:j + 6] for i in range(3) for j in range(3)) / 9) ** -0.6
    np.testing.assert_allclose(run(net, x, "y"), ref, rtol=2e-5)


def test_batchnorm_three_blob_layout_and_moving_average() -> None:
    x = np.random.default_rng(2).standard_normal((4, 3, 2, 5)).astype(np.float32) * 2 + 1
    net = build('layer { name: "bn" type: "BatchNorm" bottom: "x" top: "y" batch_norm_param { moving_average_fraction: 0.9 eps: 0.001 } }', x.shape, phase=schema.TRAIN)
    bn = net.layer_by_name("bn")
    assert bn is not None and [tuple(b.shape) for b in bn.blobs] == [(3,), (3,), (1,)]
    xd = x.astype(np.float64)
    mean, var = xd.mean(axis=(0, 2, 3)), xd.var(axis=(0, 2, 3))
    ref = (xd - mean[None, :, None, None]) / np.sqrt(var[None, :, None, None] + 1e-3)
    np.testing.assert_allclose(run(net, x, "y"), ref, rtol=1e-4, atol=1e-5)
    run(net, x, "y")
    m = 4 * 2 * 5
    np.testing.assert_allclose(bn.blobs[2].numpy(), [0.9 * 1 + 1])
    np.testing.assert_allclose(bn.blobs[0].numpy(), mean * 1.9, rtol=1e-5)
    np.testing.assert_allclose(bn.blobs[1].numpy(), var * m / (m - 1) * 1.9, rtol=1e-5)
    test = build('layer { name: "bn" type: "BatchNorm" bottom: "x" top: "y" batch_norm_param { eps: 0.001 } }', x.shape)
    test.layer_by_name("bn").blobs = [b.clone() for b in bn.blobs]  # type: ignore[union-attr]
    unbiased = var * m / (m - 1)
    ref = (xd - mean[None, :, None, None]) / np.sqrt(unbiased[None, :, None, None] + 1e-3)
    np.testing.assert_allclose(run(test, x, "y"), ref, rtol=1e-4, atol=1e-5)
    assert net.params[0].lr_mult == 0


def test_softmax_loss_normalization_modes_and_gradient() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 4, 2, 2)).astype(np.float32)
    label = rng.integers(0, 4, (3, 2, 2)).astype(np.float32)
    label[0, 0, 0] = label[2, 1, 1] = 255
    xd = x.astype(np.float64)
    p = np.exp(xd) / np.exp(xd).sum(1, keepdims=True)
    valid = label != 255
    lab = np.where(valid, label, 0).astype(int)
    nll = -np.log(np.take_along_axis(p, lab[:, None], 1)[:, 0])
    total = (nll * valid).sum()
    for mode, norm in (("FULL", 12.0), ("VALID", 10.0), ("BATCH_SIZE", 3.0), ("NONE", 1.0)):
        net = build(f'layer {{ name: "l" type: "Input" top: "lab" input_param {{ shape {{ dim: 3 dim: 2 dim: 2 }} }} }}\n'
                    f'layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "x" bottom: "lab" top: "loss" loss_weight: 2 '
                    f'loss_param {{ ignore_label: 255 normalization: {mode} }} }}', x.shape, phase=schema.TRAIN)
        net.feed("lab", label)
        xt = torch.tensor(x, requires_grad=True)
        net.layers[0].values[0] = xt  # type: ignore[attr-defined]
        loss, blobs = net.forward()
        assert float(blobs["loss"].detach()) == pytest.approx(total / norm, rel=1e-5)
        loss.backward()
        onehot = np.eye(4)[lab].transpose(0, 3, 1, 2)
        ref = 2 * (p - onehot) * valid[:, None] / norm
        np.testing.assert_allclose(xt.grad.numpy(), ref, rtol=1e-4, atol=1e-6)


def test_accuracy_top_k_counts_a_tie_with_the_true_class_as_a_miss() -> None:
    # Caffe (master, accuracy_layer.cpp): a hit when fewer than top_k other classes score >= the true class.
    x = np.array([[0.1, 0.5, 0.5, 0.2], [0.9, 0.1, 0.0, 0.0], [0.3, 0.3, 0.3, 0.3], [0.1, 0.7, 0.2, 0.0]], np.float32)
    label = np.array([2, 2, 3, 1], np.float32)
    for k, want in ((1, 1 / 4), (2, 2 / 4), (3, 2 / 4), (4, 1.0)):
        net = build(f'layer {{ name: "l" type: "Input" top: "lab" input_param {{ shape {{ dim: 4 }} }} }}\n'
                    f'layer {{ name: "a" type: "Accuracy" bottom: "x" bottom: "lab" top: "acc" accuracy_param {{ top_k: {k} }} }}', (4, 4))
        net.feed("lab", label)
        assert run(net, x, "acc") == pytest.approx(want)


def test_eltwise_scale_and_euclidean() -> None:
    x = np.random.default_rng(4).standard_normal((2, 3, 4)).astype(np.float32)
    net = build('layer { name: "s" type: "Scale" bottom: "x" top: "s" scale_param { bias_term: true filler { type: "constant" value: 3 } bias_filler { type: "constant" value: -1 } } }\n'
                'layer { name: "m" type: "Eltwise" bottom: "x" bottom: "s" top: "m" eltwise_param { operation: MAX } }\n'
                'layer { name: "p" type: "Eltwise" bottom: "x" bottom: "s" top: "p" eltwise_param { operation: PROD } }\n'
                'layer { name: "e" type: "EuclideanLoss" bottom: "x" bottom: "s" top: "e" }', x.shape)
    s = 3 * x.astype(np.float64) - 1
    assert np.allclose(run(net, x, "s"), s, atol=1e-6)
    assert np.allclose(run(net, x, "m"), np.maximum(x, s), atol=1e-6)
    assert np.allclose(run(net, x, "p"), x * s, atol=1e-5)
    assert run(net, x, "e") == pytest.approx(((x - s) ** 2).sum() / 2 / 2, rel=1e-5)
    assert net.loss_weights["e"] == 1.0 and net.loss_weights["s"] == 0.0


def test_fillers() -> None:
    g = torch.Generator().manual_seed(0)
    fp = schema.FillerParameter
    w = fillers.fill((400, 50, 3, 3), fp(type="xavier"), g)
    lim = math.sqrt(3 / (50 * 9))
    assert float(w.abs().max()) <= lim and float(w.abs().max()) > 0.99 * lim
    w = fillers.fill((400, 50, 3, 3), fp(type="msra", variance_norm=1), g)
    assert float(w.std()) == pytest.approx(math.sqrt(2 / (400 * 9)), rel=0.02)
    w = fillers.fill((1, 1, 4, 4), fp(type="bilinear"), g)
    assert np.allclose(w[0, 0, 0].numpy(), [0.0625, 0.1875, 0.1875, 0.0625])
    w = fillers.fill((100, 100), fp(type="gaussian", std=1, sparse=10), g)
    assert 0.05 < float((w != 0).float().mean()) < 0.15
    w = fillers.fill((6, 3, 2), fp(type="positive_unitball"), g)
    assert float(w.min()) >= 0 and np.allclose(w.reshape(6, -1).sum(1).numpy(), 1.0)
    with pytest.raises(ValueError, match="filler type 'uniformish' is not supported"):
        fillers.fill((2, 2), fp(type="uniformish"), g)


def test_bad_layer_parameters_are_named() -> None:
    with pytest.raises(LayerError, match="layer 'p' .*STOCHASTIC takes no padding"):
        build('layer { name: "p" type: "Pooling" bottom: "x" top: "y" pooling_param { pool: STOCHASTIC kernel_size: 2 pad: 1 } }')
    with pytest.raises(LayerError, match="layer 'c' .*group 2 must divide"):
        build('layer { name: "c" type: "Convolution" bottom: "x" top: "y" convolution_param { num_output: 4 kernel_size: 1 group: 2 } }')
    with pytest.raises(LayerError, match="layer 'r' .*cannot reshape"):
        build('layer { name: "r" type: "Reshape" bottom: "x" top: "y" reshape_param { shape { dim: 5 dim: 5 } } }')


def test_several_losses_with_loss_weight_like_googlenet_heads() -> None:
    x = np.random.default_rng(6).standard_normal((4, 5)).astype(np.float32)
    net = build('layer { name: "l" type: "Input" top: "lab" input_param { shape { dim: 4 } } }\n'
                'layer { name: "ip" type: "InnerProduct" bottom: "x" top: "ip" inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }\n'
                'layer { name: "aux" type: "InnerProduct" bottom: "x" top: "aux" inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }\n'
                'layer { name: "main" type: "SoftmaxWithLoss" bottom: "ip" bottom: "lab" top: "main" }\n'
                'layer { name: "head" type: "SoftmaxWithLoss" bottom: "aux" bottom: "lab" top: "head" loss_weight: 0.3 }', (4, 5), phase=schema.TRAIN)
    net.feed("x", x)
    net.feed("lab", np.array([0, 1, 2, 1], np.float32))
    loss, blobs = net.forward()
    assert net.outputs == ["head", "main"] and net.loss_weights  # Caffe: a std::set of names["head"] == pytest.approx(0.3)
    assert float(loss.detach()) == pytest.approx(float(blobs["main"].detach()) + 0.3 * float(blobs["head"].detach()), rel=1e-6)
    loss.backward()
    assert all(p.tensor.grad is not None and float(p.tensor.grad.abs().sum()) > 0 for p in net.params)
