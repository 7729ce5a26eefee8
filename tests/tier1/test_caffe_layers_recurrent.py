"""LSTMUnit, LSTM and RNN against the nets Caffe unrolls them into (blob order, gates i f o g, cont flags, carried state)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("google.protobuf")

from ddl.caffe.layers.base import LayerError  # noqa: E402
from ddl.caffe.layers.check import forward, gradients, numeric_check, single_layer  # noqa: E402

RNG = np.random.default_rng(9)
T, N, D, H = 4, 3, 5, 2
X = RNG.standard_normal((T, N, D))
CONT = np.array([[0, 0, 0], [1, 1, 0], [1, 0, 1], [1, 1, 1]], np.float64)   # a new sequence where cont is 0


def sig(v: np.ndarray) -> np.ndarray:
    return np.asarray(1 / (1 + np.exp(-v)))


def lstm_ref(w_xc: np.ndarray, b_c: np.ndarray, w_hc: np.ndarray, h0: np.ndarray, c0: np.ndarray,
             static: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Caffe's unrolled LSTM: gate_input_t = W_hc (cont_t h_{t-1}) + W_xc x_t + b_c [+ W_xc_static x_static];
    c_t = cont_t f c_{t-1} + i g; h_t = o tanh(c_t)."""
    h, c, hs = h0, c0, []
    for t in range(T):
        ct = CONT[t][:, None]
        g_in = (ct * h) @ w_hc.T + X[t] @ w_xc.T + b_c + (0 if static is None else static)
        i, f, o, g = sig(g_in[:, :H]), sig(g_in[:, H:2 * H]), sig(g_in[:, 2 * H:3 * H]), np.tanh(g_in[:, 3 * H:])
        c = ct * f * c + i * g
        h = o * np.tanh(c)
        hs.append(h)
    return np.stack(hs), h, c


def test_lstm_blob_layout_and_forward_match_the_unrolled_net() -> None:
    la = single_layer(f'name: "l" type: "LSTM" bottom: "x" bottom: "c" top: "h" recurrent_param {{ num_output: {H} '
                      'weight_filler { type: "uniform" min: -0.5 max: 0.5 } bias_filler { type: "uniform" } }', [X.shape, CONT.shape])
    shapes = [tuple(b.shape) for b in la.blobs]              # type: ignore[attr-defined]
    assert shapes == [(4 * H, D), (4 * H,), (4 * H, H)]       # W_xc, b_c, W_hc
    w_xc, b_c, w_hc = (b.detach().numpy() for b in la.blobs)  # type: ignore[attr-defined]
    zeros = np.zeros((N, H))
    ref, h_t, c_t = lstm_ref(w_xc, b_c, w_hc, zeros, zeros)
    np.testing.assert_allclose(forward(la, [X, CONT])[0], ref, rtol=1e-10)
    # Without expose_hidden, Caffe starts the next pass from this pass's final state.
    ref2, _, _ = lstm_ref(w_xc, b_c, w_hc, h_t, c_t)
    la.update_stats = True                                   # type: ignore[attr-defined]
    np.testing.assert_allclose(forward(la, [X, CONT])[0], ref2, rtol=1e-10)
    numeric_check(la, [X, CONT])


def test_lstm_static_input_and_exposed_hidden_state() -> None:
    xs = RNG.standard_normal((N, 3))
    h0, c0 = RNG.standard_normal((1, N, H)), RNG.standard_normal((1, N, H))
    la = single_layer(f'name: "l" type: "LSTM" bottom: "x" bottom: "c" bottom: "s" bottom: "h0" bottom: "c0" top: "h" top: "hT" top: "cT" '
                      f'recurrent_param {{ num_output: {H} expose_hidden: true weight_filler {{ type: "gaussian" std: 0.3 }} }}',
                      [X.shape, CONT.shape, xs.shape, h0.shape, c0.shape])
    assert [tuple(b.shape) for b in la.blobs] == [(4 * H, D), (4 * H,), (4 * H, 3), (4 * H, H)]   # type: ignore[attr-defined]
    w_xc, b_c, w_s, w_hc = (b.detach().numpy() for b in la.blobs)  # type: ignore[attr-defined]
    ref, h_t, c_t = lstm_ref(w_xc, b_c, w_hc, h0[0], c0[0], static=xs @ w_s.T)
    h, ht, ct = forward(la, [X, CONT, xs, h0, c0])
    np.testing.assert_allclose(h, ref, rtol=1e-10)
    np.testing.assert_allclose(ht[0], h_t, rtol=1e-10)
    np.testing.assert_allclose(ct[0], c_t, rtol=1e-10)
    numeric_check(la, [X, CONT, xs, h0, c0], wrt=(0, 2, 3, 4))


def test_rnn_matches_the_unrolled_net() -> None:
    la = single_layer(f'name: "r" type: "RNN" bottom: "x" bottom: "c" top: "o" recurrent_param {{ num_output: {H} '
                      'weight_filler { type: "uniform" min: -0.5 max: 0.5 } bias_filler { type: "uniform" } }', [X.shape, CONT.shape])
    assert [tuple(b.shape) for b in la.blobs] == [(H, D), (H,), (H, H), (H, H), (H,)]   # type: ignore[attr-defined]
    w_xh, b_h, w_hh, w_ho, b_o = (b.detach().numpy() for b in la.blobs)  # type: ignore[attr-defined]
    h, outs = np.zeros((N, H)), []
    for t in range(T):
        h = np.tanh((CONT[t][:, None] * h) @ w_hh.T + X[t] @ w_xh.T + b_h)
        outs.append(np.tanh(h @ w_ho.T + b_o))
    np.testing.assert_allclose(forward(la, [X, CONT])[0], np.stack(outs), rtol=1e-10)
    numeric_check(la, [X, CONT])


def test_lstm_unit_and_its_gradients() -> None:
    c, g, cont = RNG.standard_normal((1, N, H)), RNG.standard_normal((1, N, 4 * H)), np.array([[1.0, 0.0, 1.0]])
    la = single_layer('name: "u" type: "LSTMUnit" bottom: "c" bottom: "g" bottom: "k" top: "c1" top: "h1"', [c.shape, g.shape, cont.shape])
    c1, h1 = forward(la, [c, g, cont])
    i, f, o, gg = sig(g[..., :H]), sig(g[..., H:2 * H]), sig(g[..., 2 * H:3 * H]), np.tanh(g[..., 3 * H:])
    ref_c = cont[..., None] * f * c + i * gg
    np.testing.assert_allclose(c1, ref_c, rtol=1e-12)
    np.testing.assert_allclose(h1, o * np.tanh(ref_c), rtol=1e-12)
    (gc, _), _ = gradients(la, [c, g, cont], [np.zeros_like(c1), np.ones_like(h1)], wrt=(0, 1))
    np.testing.assert_allclose(gc, cont[..., None] * f * o * (1 - np.tanh(ref_c) ** 2), rtol=1e-10)   # no diff where cont is 0
    numeric_check(la, [c, g, cont], wrt=(0, 1))
    with pytest.raises(LayerError, match="needs c \\(1, N, H\\), gates \\(1, N, 4H\\)"):
        single_layer('name: "u" type: "LSTMUnit" bottom: "c" bottom: "g" bottom: "k" top: "c1" top: "h1"', [c.shape, (1, N, H), cont.shape])
