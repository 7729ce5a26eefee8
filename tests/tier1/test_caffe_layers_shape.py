"""Layers that move, copy, pick or combine values, against transcriptions of Caffe's loops, with gradient checks."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("google.protobuf")

from ddl.caffe.layers.base import LayerError  # noqa: E402
from ddl.caffe.layers.check import forward, gradients, numeric_check, single_layer  # noqa: E402

RNG = np.random.default_rng(11)


def mk(body: str, shapes: list[tuple[int, ...]]) -> object:
    return single_layer(body, shapes)


def test_slice_at_points_and_in_equal_parts() -> None:
    x = RNG.standard_normal((2, 7, 3))
    la = mk('name: "s" type: "Slice" bottom: "x" top: "a" top: "b" top: "c" slice_param { axis: 1 slice_point: 2 slice_point: 5 }', [x.shape])
    a, b, c = forward(la, [x])
    np.testing.assert_array_equal(a, x[:, :2])
    np.testing.assert_array_equal(b, x[:, 2:5])
    np.testing.assert_array_equal(c, x[:, 5:])
    numeric_check(la, [x])
    eq = mk('name: "s" type: "Slice" bottom: "x" top: "a" top: "b" top: "c" slice_param { slice_dim: 2 }', [(2, 2, 6)])
    assert [t.shape for t in forward(eq, [np.zeros((2, 2, 6))])] == [(2, 2, 2)] * 3
    with pytest.raises(LayerError, match="does not split into 2 equal tops"):
        mk('name: "s" type: "Slice" bottom: "x" top: "a" top: "b"', [(2, 7)])
    with pytest.raises(LayerError, match="2 slice_point values need 3 tops"):
        mk('name: "s" type: "Slice" bottom: "x" top: "a" top: "b" slice_param { slice_point: 1 slice_point: 2 }', [(2, 7)])


def test_concat_split_silence() -> None:
    a, b = RNG.standard_normal((2, 3, 4)), RNG.standard_normal((2, 5, 4))
    cat = mk('name: "c" type: "Concat" bottom: "a" bottom: "b" top: "y"', [a.shape, b.shape])
    np.testing.assert_array_equal(forward(cat, [a, b])[0], np.concatenate([a, b], 1))
    numeric_check(cat, [a, b], wrt=(0, 1))
    split = mk('name: "s" type: "Split" bottom: "a" top: "p" top: "q" top: "r"', [a.shape])
    outs = forward(split, [a])
    assert len(outs) == 3 and all(np.array_equal(o, a) for o in outs)
    d = [RNG.standard_normal(a.shape) for _ in range(3)]
    (ga,), _ = gradients(split, [a], d)
    np.testing.assert_allclose(ga, d[0] + d[1] + d[2])       # Caffe's Split sums the top diffs
    silence = mk('name: "z" type: "Silence" bottom: "a" bottom: "b"', [a.shape, b.shape])
    assert forward(silence, [a, b]) == []


def test_flatten_and_reshape_follow_caffes_axis_rules() -> None:
    x = RNG.standard_normal((2, 3, 4, 5))
    fl = mk('name: "f" type: "Flatten" bottom: "x" top: "y" flatten_param { axis: 1 end_axis: 2 }', [x.shape])
    assert forward(fl, [x])[0].shape == (2, 12, 5)
    rs = mk('name: "r" type: "Reshape" bottom: "x" top: "y" reshape_param { shape { dim: 0 dim: -1 dim: 2 } axis: 1 num_axes: 2 }', [x.shape])
    y = forward(rs, [x])[0]
    assert y.shape == (2, 3, 2, 2, 5) and np.array_equal(y.reshape(-1), x.reshape(-1))
    rs0 = mk('name: "r" type: "Reshape" bottom: "x" top: "y" reshape_param { shape { dim: 1 } axis: 1 num_axes: 0 }', [x.shape])
    assert forward(rs0, [x])[0].shape == (2, 1, 3, 4, 5)
    numeric_check(rs, [x])


def test_crop_offsets_per_axis_or_shared() -> None:
    x, ref = RNG.standard_normal((2, 3, 9, 8)), np.zeros((2, 3, 4, 5))
    la = mk('name: "c" type: "Crop" bottom: "x" bottom: "r" top: "y" crop_param { axis: 2 offset: 3 offset: 1 }', [x.shape, ref.shape])
    np.testing.assert_array_equal(forward(la, [x, ref])[0], x[:, :, 3:7, 1:6])
    shared = mk('name: "c" type: "Crop" bottom: "x" bottom: "r" top: "y" crop_param { axis: 1 offset: 0 }', [x.shape, (2, 2, 4, 5)])
    np.testing.assert_array_equal(forward(shared, [x, np.zeros((2, 2, 4, 5))])[0], x[:, :2, :4, :5])
    numeric_check(la, [x, ref])
    with pytest.raises(LayerError, match="offset 6 \\+ size 4 exceeds"):
        mk('name: "c" type: "Crop" bottom: "x" bottom: "r" top: "y" crop_param { offset: 6 }', [x.shape, ref.shape])


def test_tile_copies_blocks_like_caffes_loop() -> None:
    x = RNG.standard_normal((2, 3, 4))
    la = mk('name: "t" type: "Tile" bottom: "x" top: "y" tile_param { axis: 1 tiles: 3 }', [x.shape])
    y = forward(la, [x])[0]
    outer, inner = 2, 3 * 4
    ref = np.empty((outer, 3 * inner))
    for i in range(outer):                                # Caffe: for each outer index, tiles copies of the inner block
        for t in range(3):
            ref[i, t * inner:(t + 1) * inner] = x[i].reshape(-1)
    np.testing.assert_array_equal(y.reshape(outer, -1), ref)
    numeric_check(la, [x])


def test_batch_reindex_and_its_scattered_gradient() -> None:
    x, idx = RNG.standard_normal((4, 3)), np.array([2.0, 0.0, 2.0, 3.0, 1.0])
    la = mk('name: "b" type: "BatchReindex" bottom: "x" bottom: "i" top: "y"', [x.shape, idx.shape])
    np.testing.assert_array_equal(forward(la, [x, idx])[0], x[[2, 0, 2, 3, 1]])
    d = RNG.standard_normal((5, 3))
    (gx,), _ = gradients(la, [x, idx], [d])
    ref = np.zeros_like(x)
    for k, i in enumerate([2, 0, 2, 3, 1]):
        ref[i] += d[k]
    np.testing.assert_allclose(gx, ref)
    with pytest.raises(LayerError, match="indices must lie in"):
        forward(la, [x, np.array([0.0, 9.0, 0, 0, 0])])


def test_filter_keeps_selected_items() -> None:
    a, b, sel = RNG.standard_normal((5, 2)), RNG.standard_normal((5, 3, 2)), np.array([1.0, 0, 0, 2, 1])
    la = mk('name: "f" type: "Filter" bottom: "a" bottom: "b" bottom: "s" top: "p" top: "q"', [a.shape, b.shape, sel.shape])
    la.update_stats = True                                    # type: ignore[attr-defined]
    p, q = forward(la, [a, b, sel])
    np.testing.assert_array_equal(p, a[[0, 3, 4]])
    np.testing.assert_array_equal(q, b[[0, 3, 4]])
    d = [np.ones((3, 2))]
    (ga,), _ = gradients(la, [a, b, sel], d)
    np.testing.assert_array_equal(ga, np.array([[1, 1], [0, 0], [0, 0], [1, 1], [1, 1]]))


def test_parameter_layer_exposes_its_learned_blob() -> None:
    la = mk('name: "p" type: "Parameter" top: "w" parameter_param { shape { dim: 2 dim: 3 } }', [])
    (w,) = forward(la, [])
    assert w.shape == (2, 3)
    _, (g,) = gradients(la, [], [np.full((2, 3), 2.0)], wrt=())
    np.testing.assert_array_equal(g, np.full((2, 3), 2.0))


def _caffe_argmax(x: np.ndarray, k: int, axis: int | None, with_values: bool) -> np.ndarray:
    """Caffe's ArgMaxLayer loop: (value, index) pairs sorted with std::greater, the first top_k kept."""
    if axis is None:
        flat = x.reshape(x.shape[0], -1)
        out = np.zeros((x.shape[0], 2 if with_values else 1, k))
        for i in range(flat.shape[0]):
            pairs = sorted(((flat[i, j], j) for j in range(flat.shape[1])), reverse=True)[:k]
            for j, (v, ix) in enumerate(pairs):
                out[i, 0, j] = ix
                if with_values:
                    out[i, 1, j] = v
        return out
    moved = np.moveaxis(x, axis, -1)
    res = np.zeros(moved.shape[:-1] + (k,))
    for idx in np.ndindex(moved.shape[:-1]):
        pairs = sorted(((moved[idx][j], j) for j in range(moved.shape[-1])), reverse=True)[:k]
        res[idx] = [v if with_values else ix for v, ix in pairs]
    return np.moveaxis(res, -1, axis)


@pytest.mark.parametrize(("body", "axis", "k", "vals"), [("top_k: 2", None, 2, False), ("top_k: 3 out_max_val: true", None, 3, True),
                                                         ("axis: 1 top_k: 2", 1, 2, False), ("axis: -1 out_max_val: true", 2, 1, True)])
def test_argmax_matches_caffes_sort_including_ties(body: str, axis: int | None, k: int, vals: bool) -> None:
    x = RNG.integers(0, 4, (3, 4, 5)).astype(np.float64)       # many ties: Caffe puts the larger index first
    la = mk(f'name: "a" type: "ArgMax" bottom: "x" top: "y" argmax_param {{ {body} }}', [x.shape])
    np.testing.assert_array_equal(forward(la, [x])[0], _caffe_argmax(x, k, axis, vals))


@pytest.mark.parametrize(("op", "fn"), [("SUM", np.sum), ("ASUM", lambda v, axis: np.abs(v).sum(axis)),
                                        ("SUMSQ", lambda v, axis: (v * v).sum(axis)), ("MEAN", np.mean)])
def test_reduction_over_tail_axes_with_coeff(op: str, fn: object) -> None:
    x = RNG.standard_normal((2, 3, 4))
    la = mk(f'name: "r" type: "Reduction" bottom: "x" top: "y" reduction_param {{ operation: {op} axis: 1 coeff: -1.5 }}', [x.shape])
    np.testing.assert_allclose(forward(la, [x])[0], -1.5 * fn(x.reshape(2, -1), axis=1), rtol=1e-12)   # type: ignore[operator]
    numeric_check(la, [x])
    whole = mk(f'name: "r" type: "Reduction" bottom: "x" top: "y" reduction_param {{ operation: {op} }}', [x.shape])
    assert forward(whole, [x])[0].shape == ()


def test_eltwise_max_gradient_goes_to_the_first_maximum_as_in_caffe() -> None:
    a = np.array([[1.0, 2.0, 3.0]])
    b = np.array([[1.0, 5.0, 0.0]])
    la = mk('name: "m" type: "Eltwise" bottom: "a" bottom: "b" top: "y" eltwise_param { operation: MAX }', [a.shape, b.shape])
    np.testing.assert_array_equal(forward(la, [a, b])[0], [[1, 5, 3]])
    (ga, gb), _ = gradients(la, [a, b], [np.ones((1, 3))], wrt=(0, 1))
    np.testing.assert_array_equal(ga, [[1, 0, 1]])            # the tie at index 0 goes to bottom 0 only
    np.testing.assert_array_equal(gb, [[0, 1, 0]])
    x, y = RNG.standard_normal((2, 3)), RNG.standard_normal((2, 3))
    for op in ("PROD", "SUM coeff: 0.5 coeff: -2"):
        numeric_check(mk(f'name: "m" type: "Eltwise" bottom: "a" bottom: "b" top: "y" eltwise_param {{ operation: {op} }}', [x.shape, y.shape]), [x, y], wrt=(0, 1))


def test_scale_and_bias_broadcast_from_axis_with_learned_or_bottom_operands() -> None:
    x = RNG.standard_normal((2, 3, 4, 5))
    sc = mk('name: "s" type: "Scale" bottom: "x" top: "y" scale_param { axis: 1 num_axes: 2 bias_term: true '
            'filler { type: "uniform" } bias_filler { type: "uniform" } }', [x.shape])
    g, b = (t.detach().numpy() for t in sc.blobs)            # type: ignore[attr-defined]
    assert g.shape == (3, 4)
    np.testing.assert_allclose(forward(sc, [x])[0], x * g[None, :, :, None] + b[None, :, :, None], rtol=1e-12)
    numeric_check(sc, [x])
    two = mk('name: "s" type: "Scale" bottom: "x" bottom: "g" top: "y" scale_param { axis: 2 }', [x.shape, (4, 5)])
    gg = RNG.standard_normal((4, 5))
    np.testing.assert_allclose(forward(two, [x, gg])[0], x * gg)
    numeric_check(two, [x, gg], wrt=(0, 1))
    bias = mk('name: "b" type: "Bias" bottom: "x" top: "y" bias_param { axis: -1 filler { type: "uniform" } }', [x.shape])
    bb = bias.blobs[0].detach().numpy()                        # type: ignore[attr-defined]
    np.testing.assert_allclose(forward(bias, [x])[0], x + bb)
    numeric_check(bias, [x])
    scalar = mk('name: "b" type: "Bias" bottom: "x" bottom: "c" top: "y"', [x.shape, ()])
    np.testing.assert_allclose(forward(scalar, [x, np.float64(2.5)])[0], x + 2.5)


def test_embed_rows_by_index_and_bias() -> None:
    idx = np.array([[0.0, 3.0], [2.0, 3.0]])
    la = mk('name: "e" type: "Embed" bottom: "i" top: "y" embed_param { num_output: 4 input_dim: 5 '
            'weight_filler { type: "uniform" } bias_filler { type: "uniform" } }', [idx.shape])
    w, b = (t.detach().numpy() for t in la.blobs)             # type: ignore[attr-defined]
    assert w.shape == (5, 4)
    np.testing.assert_allclose(forward(la, [idx])[0], w[idx.astype(int)] + b)
    _, (gw, gb) = gradients(la, [idx], [np.ones((2, 2, 4))], wrt=())
    np.testing.assert_allclose(gw.sum(1), [4, 0, 4, 8, 0])
    np.testing.assert_allclose(gb, [4, 4, 4, 4])
    with pytest.raises(LayerError, match=r"indices must be integers in \[0, 5\)"):
        forward(la, [np.array([[0.5, 1.0], [1.0, 1.0]])])


def test_inner_product_axis_transpose_and_softmax_axis() -> None:
    x = RNG.standard_normal((2, 3, 4))
    ip = mk('name: "i" type: "InnerProduct" bottom: "x" top: "y" inner_product_param { num_output: 5 axis: 2 transpose: true '
            'weight_filler { type: "gaussian" } bias_filler { type: "uniform" } }', [x.shape])
    w, b = (t.detach().numpy() for t in ip.blobs)             # type: ignore[attr-defined]
    assert w.shape == (4, 5)
    np.testing.assert_allclose(forward(ip, [x])[0], x @ w + b, rtol=1e-12)
    numeric_check(ip, [x])
    sm = mk('name: "s" type: "Softmax" bottom: "x" top: "y" softmax_param { axis: -1 }', [x.shape])
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(forward(sm, [x])[0], e / e.sum(-1, keepdims=True), rtol=1e-12)
    numeric_check(sm, [x])
