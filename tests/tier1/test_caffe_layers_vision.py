"""Convolution, Deconvolution, Im2col, Pooling (all methods, mask top, any padding), SPP, LRN, MVN, BatchNorm, Upsample, Interp:
against loops transcribed from Caffe's, with gradient checks."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("google.protobuf")

from ddl.caffe.formats import schema  # noqa: E402
from ddl.caffe.layers.check import forward, gradients, numeric_check, single_layer  # noqa: E402

RNG = np.random.default_rng(5)


def conv_loop(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: tuple[int, int], pad: tuple[int, int],
              dil: tuple[int, int], group: int) -> np.ndarray:
    """Caffe's convolution as a direct loop (im2col then GEMM per group, written out)."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    oh = (h + 2 * pad[0] - (dil[0] * (kh - 1) + 1)) // stride[0] + 1
    ow = (wd + 2 * pad[1] - (dil[1] * (kw - 1) + 1)) // stride[1] + 1
    xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    y = np.zeros((n, o, oh, ow))
    og = o // group
    for f in range(o):
        g = f // og
        for i in range(oh):
            for j in range(ow):
                for ki in range(kh):
                    for kj in range(kw):
                        patch = xp[:, g * cg:(g + 1) * cg, i * stride[0] + ki * dil[0], j * stride[1] + kj * dil[1]]
                        y[:, f, i, j] += patch @ w[f, :, ki, kj]
        y[:, f] += b[f]
    return y


def deconv_loop(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int, pad: int, group: int) -> np.ndarray:
    """Caffe's deconvolution: each input pixel scatters weight x value into the (cropped) output (col2im)."""
    n, c, h, wd = x.shape
    _, og, kh, kw = w.shape
    full = np.zeros((n, og * group, (h - 1) * stride + kh, (wd - 1) * stride + kw))
    cg = c // group
    for ch in range(c):
        g = ch // cg
        for i in range(h):
            for j in range(wd):
                full[:, g * og:(g + 1) * og, i * stride:i * stride + kh, j * stride:j * stride + kw] += x[:, ch, i, j][:, None, None, None] * w[ch]
    oh, ow = full.shape[2] - 2 * pad, full.shape[3] - 2 * pad
    return full[:, :, pad:pad + oh, pad:pad + ow] + b[None, :, None, None]


def test_convolution_matches_the_loop_and_checks_numerically() -> None:
    x = RNG.standard_normal((2, 4, 7, 6))
    la = single_layer('name: "c" type: "Convolution" bottom: "x" top: "y" convolution_param { num_output: 6 kernel_h: 3 kernel_w: 2 '
                      'stride_h: 2 stride_w: 1 pad_h: 1 pad_w: 2 dilation: 2 group: 2 weight_filler { type: "gaussian" } bias_filler { type: "uniform" } }',
                      [x.shape])
    w, b = (t.detach().numpy() for t in la.blobs)             # type: ignore[attr-defined]
    assert w.shape == (6, 2, 3, 2)
    np.testing.assert_allclose(forward(la, [x])[0], conv_loop(x, w, b, (2, 1), (1, 2), (2, 2), 2), rtol=1e-10, atol=1e-12)
    numeric_check(la, [x])


def test_convolution_1d_and_3d() -> None:
    x = RNG.standard_normal((2, 3, 5, 4, 6))
    la = single_layer('name: "c" type: "Convolution" bottom: "x" top: "y" convolution_param { num_output: 2 kernel_size: 3 kernel_size: 2 kernel_size: 3 '
                      'pad: 1 stride: 2 weight_filler { type: "gaussian" } }', [x.shape])
    y = forward(la, [x])[0]
    assert y.shape == (2, 2, 3, 3, 3)
    w, b = (t.detach().numpy() for t in la.blobs)             # type: ignore[attr-defined]
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1), (1, 1)))
    ref = np.einsum("ncdhw,ocdhw->no", xp[:, :, 2:5, 0:2, 4:7], w) + b
    np.testing.assert_allclose(y[:, :, 1, 0, 2], ref, rtol=1e-10)
    one = single_layer('name: "c" type: "Convolution" bottom: "x" top: "y" convolution_param { num_output: 2 kernel_size: 3 }', [(2, 3, 9)])
    assert forward(one, [np.zeros((2, 3, 9))])[0].shape == (2, 2, 7)


def test_deconvolution_matches_the_scatter_loop() -> None:
    x = RNG.standard_normal((2, 4, 3, 5))
    la = single_layer('name: "d" type: "Deconvolution" bottom: "x" top: "y" convolution_param { num_output: 6 kernel_size: 4 stride: 2 pad: 1 group: 2 '
                      'weight_filler { type: "gaussian" } bias_filler { type: "uniform" } }', [x.shape])
    w, b = (t.detach().numpy() for t in la.blobs)             # type: ignore[attr-defined]
    assert w.shape == (4, 3, 4, 4)                            # Caffe: (C_in, num_output / group, k, k)
    y = forward(la, [x])[0]
    assert y.shape == (2, 6, 6, 10)                           # stride (in - 1) + k - 2 pad
    np.testing.assert_allclose(y, deconv_loop(x, w, b, 2, 1, 2), rtol=1e-10, atol=1e-12)
    numeric_check(la, [x])


def test_im2col_layout_is_caffes() -> None:
    x = RNG.standard_normal((1, 2, 4, 5))
    la = single_layer('name: "i" type: "Im2col" bottom: "x" top: "y" convolution_param { kernel_size: 3 pad: 1 stride: 2 }', [x.shape])
    y = forward(la, [x])[0]
    assert y.shape == (1, 18, 2, 3)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    for c in range(2):
        for ki in range(3):
            for kj in range(3):
                row = (c * 3 + ki) * 3 + kj                     # Caffe's column order: channel, kernel row, kernel column
                np.testing.assert_array_equal(y[0, row], xp[0, c, ki:ki + 3:2, kj:kj + 5:2])
    numeric_check(la, [x])


def caffe_pool(x: np.ndarray, k: tuple[int, int], s: tuple[int, int], p: tuple[int, int], mode: str, ceil: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Caffe's pooling loops (Forward_cpu), with its mask for MAX."""
    n, c, h, w = x.shape
    rnd = math.ceil if ceil else math.floor
    oh, ow = (int(rnd((h + 2 * p[0] - k[0]) / s[0])) + 1, int(rnd((w + 2 * p[1] - k[1]) / s[1])) + 1)
    if p[0] or p[1]:
        oh -= (oh - 1) * s[0] >= h + p[0]
        ow -= (ow - 1) * s[1] >= w + p[1]
    out, mask = np.zeros((n, c, oh, ow)), np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            hs, ws = i * s[0] - p[0], j * s[1] - p[1]
            he, we = min(hs + k[0], h + p[0]), min(ws + k[1], w + p[1])
            size = (he - hs) * (we - ws)
            hs, ws, he, we = max(hs, 0), max(ws, 0), min(he, h), min(we, w)
            win = x[:, :, hs:he, ws:we].reshape(n, c, -1)
            if mode == "MAX":
                arg = win.argmax(-1)
                out[:, :, i, j] = win.max(-1)
                mask[:, :, i, j] = (hs + arg // (we - ws)) * w + ws + arg % (we - ws)
            else:
                out[:, :, i, j] = win.sum(-1) / size
    return out, mask


@pytest.mark.parametrize(("k", "s", "p", "ceil"), [((3, 3), (2, 2), (2, 2), True), ((2, 3), (2, 1), (1, 2), True),
                                                    ((5, 4), (3, 3), (3, 2), True), ((3, 3), (2, 2), (1, 1), False)])
@pytest.mark.parametrize("mode", ["MAX", "AVE"])
def test_pooling_any_padding_below_the_kernel_and_rounding(k: tuple[int, int], s: tuple[int, int], p: tuple[int, int], ceil: bool, mode: str) -> None:
    x = RNG.standard_normal((2, 2, 9, 8))
    rnd = "" if ceil else "ceil_mode: false"
    la = single_layer(f'name: "p" type: "Pooling" bottom: "x" top: "y" pooling_param {{ pool: {mode} kernel_h: {k[0]} kernel_w: {k[1]} '
                      f'stride_h: {s[0]} stride_w: {s[1]} pad_h: {p[0]} pad_w: {p[1]} {rnd} }}', [x.shape])
    ref, _ = caffe_pool(x, k, s, p, mode, ceil)
    np.testing.assert_allclose(forward(la, [x])[0], ref, rtol=1e-12)
    numeric_check(la, [x])


def test_pooling_round_mode_floor_and_max_mask_top() -> None:
    x = RNG.standard_normal((1, 2, 7, 7))
    fl = single_layer('name: "p" type: "Pooling" bottom: "x" top: "y" pooling_param { kernel_size: 2 stride: 2 round_mode: FLOOR }', [x.shape])
    assert forward(fl, [x])[0].shape == (1, 2, 3, 3)
    la = single_layer('name: "p" type: "Pooling" bottom: "x" top: "y" top: "m" pooling_param { pool: MAX kernel_size: 3 stride: 2 pad: 1 }', [x.shape])
    y, m = forward(la, [x])
    ref, mask = caffe_pool(x, (3, 3), (2, 2), (1, 1), "MAX")
    np.testing.assert_allclose(y, ref)
    np.testing.assert_array_equal(m, mask)
    big = single_layer('name: "p" type: "Pooling" bottom: "x" top: "y" top: "m" pooling_param { pool: MAX kernel_size: 3 stride: 2 pad: 2 }', [x.shape])
    _, m2 = forward(big, [x])
    np.testing.assert_array_equal(m2, caffe_pool(x, (3, 3), (2, 2), (2, 2), "MAX")[1])


def test_stochastic_pooling_test_weighting_and_train_sampling() -> None:
    x = np.abs(RNG.standard_normal((2, 3, 5, 5))) + 0.1
    te = single_layer('name: "p" type: "Pooling" bottom: "x" top: "y" pooling_param { pool: STOCHASTIC kernel_size: 3 stride: 2 }', [x.shape])
    y = forward(te, [x])[0]
    ref = np.zeros((2, 3, 2, 2))
    for i in range(2):
        for j in range(2):
            win = x[:, :, 2 * i:2 * i + 3, 2 * j:2 * j + 3].reshape(2, 3, -1)
            ref[:, :, i, j] = (win * win).sum(-1) / (win.sum(-1) + 1.1754943508222875e-38)
    np.testing.assert_allclose(y, ref, rtol=1e-12)
    tr = single_layer('name: "p" type: "Pooling" bottom: "x" top: "y" pooling_param { pool: STOCHASTIC kernel_size: 3 stride: 2 }',
                      [x.shape], phase=schema.TRAIN)
    ys = forward(tr, [x])[0]
    for i in range(2):
        for j in range(2):
            win = x[:, :, 2 * i:2 * i + 3, 2 * j:2 * j + 3].reshape(2, 3, -1)
            assert all(ys[a, b, i, j] in win[a, b] for a in range(2) for b in range(3))   # a sampled activation
    (g,), _ = gradients(tr, [x], [np.ones((2, 3, 2, 2))])
    assert ((g != 0).sum(axis=(2, 3)) <= 4).all() and g.sum() == pytest.approx(24)    # one position per window


def test_spp_levels_are_caffes_pooling_layers() -> None:
    x = RNG.standard_normal((2, 3, 7, 6))
    la = single_layer('name: "s" type: "SPP" bottom: "x" top: "y" spp_param { pyramid_height: 3 pool: MAX }', [x.shape])
    y = forward(la, [x])[0]
    assert y.shape == (2, 3 * (1 + 4 + 16))
    parts = []
    for level in range(3):
        bins = 2 ** level
        kh, kw = math.ceil(7 / bins), math.ceil(6 / bins)
        ph, pw = (kh * bins - 7 + 1) // 2, (kw * bins - 6 + 1) // 2
        parts.append(caffe_pool(x, (kh, kw), (kh, kw), (ph, pw), "MAX")[0].reshape(2, -1))
    np.testing.assert_allclose(y, np.concatenate(parts, 1))
    numeric_check(la, [x])


def test_lrn_across_channels_gradient_is_caffes() -> None:
    x = RNG.standard_normal((2, 6, 3, 4))
    la = single_layer('name: "n" type: "LRN" bottom: "x" top: "y" lrn_param { local_size: 5 alpha: 0.3 beta: 0.75 k: 2 }', [x.shape])
    y = forward(la, [x])[0]
    sq = np.pad(x * x, ((0, 0), (2, 2), (0, 0), (0, 0)))
    scale = 2 + 0.3 / 5 * sum(sq[:, i:i + 6] for i in range(5))
    np.testing.assert_allclose(y, x * scale ** -0.75, rtol=1e-6)
    dy = RNG.standard_normal(x.shape)
    (g,), _ = gradients(la, [x], [dy])
    # Caffe's CrossChannelBackward: dy * scale^-beta - 2 alpha beta / n * x * sum_window(dy * y / scale)
    t = np.pad(dy * y / scale, ((0, 0), (2, 2), (0, 0), (0, 0)))
    ref = dy * scale ** -0.75 - 2 * 0.3 * 0.75 / 5 * x * sum(t[:, i:i + 6] for i in range(5))
    np.testing.assert_allclose(g, ref, rtol=1e-5, atol=1e-8)
    numeric_check(la, [x])
    within = single_layer('name: "n" type: "LRN" bottom: "x" top: "y" lrn_param { local_size: 3 norm_region: WITHIN_CHANNEL }', [x.shape])
    numeric_check(within, [x])


def test_mvn_forward_and_caffes_backward() -> None:
    x = RNG.standard_normal((2, 3, 4, 5)) * 2 + 1
    for body, axes in (("", (2, 3)), ("across_channels: true", (1, 2, 3))):
        la = single_layer(f'name: "m" type: "MVN" bottom: "x" top: "y" mvn_param {{ {body} eps: 1e-3 }}', [x.shape])
        mu = x.mean(axis=axes, keepdims=True)
        sd = np.sqrt(((x - mu) ** 2).mean(axis=axes, keepdims=True))
        y = forward(la, [x])[0]
        np.testing.assert_allclose(y, (x - mu) / (sd + 1e-3), rtol=1e-6)
        dy = RNG.standard_normal(x.shape)
        (g,), _ = gradients(la, [x], [dy])
        ref = (dy - dy.mean(axis=axes, keepdims=True) - y * (y * dy).mean(axis=axes, keepdims=True)) / (sd + 1e-3)
        np.testing.assert_allclose(g, ref, rtol=1e-6, atol=1e-9)
        tiny = single_layer(f'name: "m" type: "MVN" bottom: "x" top: "y" mvn_param {{ {body} }}', [x.shape])
        numeric_check(tiny, [x])         # Caffe's backward drops an O(eps) term: exact for its default eps 1e-9
    mean_only = single_layer('name: "m" type: "MVN" bottom: "x" top: "y" mvn_param { normalize_variance: false }', [x.shape])
    np.testing.assert_allclose(forward(mean_only, [x])[0], x - x.mean(axis=(2, 3), keepdims=True), atol=1e-12)
    flat = np.ones((1, 2, 3, 3))
    (g,), _ = gradients(single_layer('name: "m" type: "MVN" bottom: "x" top: "y"', [flat.shape]), [flat], [np.ones(flat.shape)])
    assert np.isfinite(g).all()                               # constant rows: finite, as in Caffe


def test_batchnorm_train_gradient_checks_numerically() -> None:
    x = RNG.standard_normal((4, 3, 2, 2))
    la = single_layer('name: "b" type: "BatchNorm" bottom: "x" top: "y"', [x.shape], phase=schema.TRAIN)
    la.update_stats = False                                   # type: ignore[attr-defined]
    numeric_check(la, [x], params=False)



def test_batchnorm_train_with_one_value_per_channel_is_caffes_zero() -> None:
    # MobileNet-SSD's deploy net under `time` (TRAIN): batch 1 and 1x1 maps. Caffe normalizes by the batch
    # statistics of one value: top (x - x) / sqrt(0 + eps) = 0, and the bottom diff is 0 too.
    x = RNG.standard_normal((1, 3, 1, 1))
    la = single_layer('name: "b" type: "BatchNorm" bottom: "x" top: "y"', [x.shape], phase=schema.TRAIN)
    np.testing.assert_array_equal(forward(la, [x])[0], np.zeros_like(x))
    (g,), _ = gradients(la, [x], [RNG.standard_normal(x.shape)])
    np.testing.assert_array_equal(g, np.zeros_like(x))
    # Two forwards ran (moving_average_fraction 0.999): factor 1 + 0.999, sums of the means, variances 0.
    factor = 1 + 0.999
    np.testing.assert_allclose(la.blobs[2].detach().numpy(), [factor], rtol=1e-6)
    np.testing.assert_allclose(la.blobs[0].detach().numpy(), factor * x.reshape(-1), rtol=1e-6)
    np.testing.assert_array_equal(la.blobs[1].detach().numpy(), np.zeros(3))

def test_upsample_nearest_and_segnet_unpooling() -> None:
    x = RNG.standard_normal((1, 2, 3, 4))
    up = single_layer('name: "u" type: "Upsample" bottom: "x" top: "y" upsample_param { scale: 2 }', [x.shape])
    np.testing.assert_array_equal(forward(up, [x])[0], x.repeat(2, axis=2).repeat(2, axis=3))
    numeric_check(up, [x])
    big = RNG.standard_normal((1, 2, 6, 8))
    pool = single_layer('name: "p" type: "Pooling" bottom: "x" top: "y" top: "m" pooling_param { kernel_size: 2 stride: 2 }', [big.shape])
    y, m = forward(pool, [big])
    unpool = single_layer('name: "u" type: "Upsample" bottom: "y" bottom: "m" top: "z" upsample_param { scale: 2 }', [y.shape, m.shape])
    z = forward(unpool, [y, m])[0]
    ref = np.zeros_like(big)
    for c in range(2):
        for i, idx in enumerate(m[0, c].reshape(-1).astype(int)):
            ref[0, c].reshape(-1)[idx] = y[0, c].reshape(-1)[i]
    np.testing.assert_array_equal(z, ref)
    numeric_check(unpool, [y, m])


def test_interp_is_bilinear_with_aligned_corners() -> None:
    x = RNG.standard_normal((1, 2, 3, 4))
    la = single_layer('name: "i" type: "Interp" bottom: "x" top: "y" interp_param { zoom_factor: 3 }', [x.shape])
    y = forward(la, [x])[0]
    assert y.shape == (1, 2, 7, 10)
    np.testing.assert_allclose(y[:, :, ::3, ::3], x, rtol=1e-12)     # aligned corners hit the input pixels
    np.testing.assert_allclose(y[:, :, 1, 0], x[:, :, 0, 0] * 2 / 3 + x[:, :, 1, 0] / 3, rtol=1e-12)
    shrink = single_layer('name: "i" type: "Interp" bottom: "x" top: "y" interp_param { shrink_factor: 2 }', [(1, 2, 9, 7)])
    assert forward(shrink, [np.zeros((1, 2, 9, 7))])[0].shape == (1, 2, 5, 4)
    numeric_check(la, [x])
