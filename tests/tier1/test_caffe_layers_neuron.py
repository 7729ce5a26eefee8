"""Neuron layers against Caffe's formulas (float64 numpy), their gradients against Caffe's backward and finite differences."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("google.protobuf")

from ddl.caffe.formats import schema  # noqa: E402
from ddl.caffe.layers.base import LayerError  # noqa: E402
from ddl.caffe.layers.check import forward, gradients, numeric_check, single_layer  # noqa: E402

RNG = np.random.default_rng(7)
X = RNG.standard_normal((2, 3, 4, 5))
X[np.abs(X) < 0.05] += 0.2              # keep finite differences away from the kinks
DY = RNG.standard_normal(X.shape)


def layer(typ: str, body: str = "", shapes: tuple[tuple[int, ...], ...] = (X.shape,)) -> object:
    return single_layer(f'name: "l" type: "{typ}" bottom: "x" top: "y" {body}', list(shapes))


# type, parameters, Caffe's forward, Caffe's backward (dE/dx from x, y, dE/dy)
CASES = [
    ("ReLU", "", lambda x: np.maximum(x, 0), lambda x, y, d: d * (x > 0)),
    ("ReLU", "relu_param { negative_slope: 0.1 }", lambda x: np.maximum(x, 0) + 0.1 * np.minimum(x, 0),
     lambda x, y, d: d * ((x > 0) + 0.1 * (x <= 0))),
    ("ReLU6", "", lambda x: np.minimum(np.maximum(x, 0), 6), lambda x, y, d: d * ((x > 0) & (x < 6))),
    ("ELU", "elu_param { alpha: 0.7 }", lambda x: np.where(x > 0, x, 0.7 * (np.exp(x) - 1)),
     lambda x, y, d: d * np.where(x > 0, 1, y + 0.7)),
    ("Sigmoid", "", lambda x: 1 / (1 + np.exp(-x)), lambda x, y, d: d * y * (1 - y)),
    ("TanH", "", np.tanh, lambda x, y, d: d * (1 - y * y)),
    ("AbsVal", "", np.abs, lambda x, y, d: d * np.sign(x)),
    ("BNLL", "", lambda x: np.where(x > 0, x + np.log1p(np.exp(-x)), np.log1p(np.exp(x))),
     lambda x, y, d: d * np.exp(x) / (np.exp(x) + 1)),
    ("Exp", "exp_param { base: 2 scale: 0.5 shift: 0.3 }", lambda x: 2 ** (0.3 + 0.5 * x),
     lambda x, y, d: d * y * np.log(2) * 0.5),
    ("Exp", "", np.exp, lambda x, y, d: d * y),
    ("Log", "log_param { base: 10 scale: 0.5 shift: 3 }", lambda x: np.log10(3 + 0.5 * x),
     lambda x, y, d: d * 0.5 / ((3 + 0.5 * x) * np.log(10))),
    ("Power", "power_param { power: 2 scale: 0.5 shift: 1 }", lambda x: (1 + 0.5 * x) ** 2,
     lambda x, y, d: d * 2 * 0.5 * (1 + 0.5 * x)),
    ("Power", "power_param { power: 0.5 scale: 0.2 shift: 4 }", lambda x: np.sqrt(4 + 0.2 * x),
     lambda x, y, d: d * 0.5 * 0.2 / np.sqrt(4 + 0.2 * x)),
    ("Power", "power_param { power: 3 scale: 0 shift: 2 }", lambda x: np.full_like(x, 8.0), lambda x, y, d: 0 * d),
    ("Swish", "swish_param { beta: 1.5 }", lambda x: x / (1 + np.exp(-1.5 * x)),
     lambda x, y, d: d * (1.5 * y + (1 / (1 + np.exp(-1.5 * x))) * (1 - 1.5 * y))),
    ("Clip", "clip_param { min: -0.5 max: 0.8 }", lambda x: np.clip(x, -0.5, 0.8), lambda x, y, d: d * ((x >= -0.5) & (x <= 0.8))),
    ("Dropout", "", lambda x: x, lambda x, y, d: d),              # TEST phase: identity
]


@pytest.mark.parametrize(("typ", "body", "fwd", "bwd"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_neuron_forward_backward_match_caffes_formulas(typ: str, body: str, fwd: object, bwd: object) -> None:
    la = layer(typ, body)
    y = forward(la, [X])[0]
    ref = fwd(X)                                              # type: ignore[operator]
    # Parameters are float32 in Caffe's proto (0.1 is 0.10000000149), hence 1e-6, not 1e-12.
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-7)
    (gx,), _ = gradients(la, [X], [DY])
    np.testing.assert_allclose(gx, bwd(X, ref, DY), rtol=1e-6, atol=1e-7)   # type: ignore[operator]
    if typ not in ("Power",) or "scale: 0" not in body:
        numeric_check(la, [X])


def test_prelu_slopes_per_channel_and_shared_with_their_gradients() -> None:
    la = layer("PReLU", "prelu_param { filler { type: \"uniform\" min: 0.1 max: 0.5 } }")
    a = la.blobs[0].detach().numpy()                          # type: ignore[attr-defined]
    assert a.shape == (3,) and np.all((a >= 0.1) & (a <= 0.5))
    y = forward(la, [X])[0]
    av = a.reshape(1, 3, 1, 1)
    np.testing.assert_allclose(y, np.maximum(X, 0) + av * np.minimum(X, 0), rtol=1e-12)
    (gx,), (ga,) = gradients(la, [X], [DY])
    np.testing.assert_allclose(gx, DY * np.where(X > 0, 1, av), rtol=1e-12)
    np.testing.assert_allclose(ga, (DY * X * (X <= 0)).sum(axis=(0, 2, 3)), rtol=1e-10)   # Caffe's slope diff
    numeric_check(la, [X])
    shared = layer("PReLU", "prelu_param { channel_shared: true }")
    assert shared.blobs[0].shape == (1,) and float(shared.blobs[0].detach()) == 0.25   # type: ignore[attr-defined]
    np.testing.assert_allclose(forward(shared, [X])[0], np.where(X > 0, X, 0.25 * X))
    numeric_check(shared, [X])


def test_threshold_and_its_missing_backward() -> None:
    la = layer("Threshold", "threshold_param { threshold: 0.3 }")
    np.testing.assert_array_equal(forward(la, [X])[0], (X > 0.3).astype(np.float64))
    x = torch.tensor(X, requires_grad=True)
    assert not la.forward([x])[0].requires_grad               # type: ignore[attr-defined]


def test_dropout_train_scales_kept_units() -> None:
    la = single_layer('name: "d" type: "Dropout" bottom: "x" top: "y" dropout_param { dropout_ratio: 0.25 }', [(4000,)], phase=schema.TRAIN)
    x = np.ones(4000)
    y = forward(la, [x])[0]
    kept = y != 0
    np.testing.assert_allclose(y[kept], 1 / 0.75)
    assert 0.7 < kept.mean() < 0.8


def test_neuron_parameter_errors_are_named() -> None:
    with pytest.raises(LayerError, match="layer 'l' .*base must be strictly positive"):
        layer("Exp", "exp_param { base: -2 }")
    with pytest.raises(LayerError, match="layer 'l' .*clip_param needs both min and max"):
        layer("Clip", "clip_param { min: 1 }")
