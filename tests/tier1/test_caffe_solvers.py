"""ddl.caffe solvers: lr policies, every update rule vs a float64 reference, clip order, snapshot/resume."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("lmdb")

from ddl.caffe.data import convert  # noqa: E402
from ddl.caffe.formats import protofile, schema  # noqa: E402
from ddl.caffe.solver import lr_policy  # noqa: E402
from ddl.caffe.solver.solver import Solver  # noqa: E402

NET = """
name: "tiny"
layer { name: "in" type: "Input" top: "x" top: "y" input_param { shape { dim: 4 dim: 3 } shape { dim: 4 dim: 2 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "p" param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0 }
        inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "uniform" min: -0.5 max: 0.5 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "p" bottom: "y" top: "loss" }
"""
RNG = np.random.default_rng(5)
X = RNG.standard_normal((4, 3))
Y = RNG.standard_normal((4, 2))


def solver_param(extra: str) -> object:
    extra = extra if "base_lr" in extra else "base_lr: 0.1 " + extra
    sp = protofile.parse_text(f"lr_policy: \"step\" gamma: 0.5 stepsize: 2 display: 0 random_seed: 3 snapshot_after_train: false {extra}", schema.SolverParameter())
    sp.net_param.CopyFrom(protofile.parse_text(NET, schema.NetParameter()))
    return sp


def reference(kind: str, sp: object, w: np.ndarray, b: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Caffe's update rules in float64, transcribed from its documented formulas."""
    params = [w.copy(), b.copy()]
    lr_mults, decay_mults = [1.0, 2.0], [1.0, 0.0]
    hist = [np.zeros_like(p) for p in params + params]
    mu, mu2, delta, rms = sp.momentum, sp.momentum2, sp.delta, sp.rms_decay  # type: ignore[attr-defined]
    for it in range(steps):
        rate = sp.base_lr * 0.5 ** (it // 2)  # type: ignore[attr-defined]
        d = X @ params[0].T + params[1] - Y
        grads = [d.T @ X / 4, d.sum(0) / 4]
        diffs = [g * sp.iter_size for g in grads]  # type: ignore[attr-defined]
        if sp.clip_gradients >= 0:  # type: ignore[attr-defined]
            norm = math.sqrt(sum((g ** 2).sum() for g in diffs))
            if norm > sp.clip_gradients:  # type: ignore[attr-defined]
                diffs = [g * sp.clip_gradients / norm for g in diffs]  # type: ignore[attr-defined]
        for i in range(2):
            g = diffs[i] / sp.iter_size  # type: ignore[attr-defined]
            decay = sp.weight_decay * decay_mults[i]  # type: ignore[attr-defined]
            g = g + decay * (params[i] if sp.regularization_type == "L2" else np.sign(params[i]))  # type: ignore[attr-defined]
            lr = rate * lr_mults[i]
            h, h2 = hist[i], hist[i + 2]
            if kind == "SGD":
                h[...] = mu * h + lr * g
                step = h.copy()
            elif kind == "Nesterov":
                old = h.copy()
                h[...] = mu * h + lr * g
                step = (1 + mu) * h - mu * old
            elif kind == "AdaGrad":
                h += g * g
                step = lr * g / (np.sqrt(h) + delta)
            elif kind == "RMSProp":
                h[...] = rms * h + (1 - rms) * g * g
                step = lr * g / (np.sqrt(h) + delta)
            elif kind == "AdaDelta":
                h[...] = mu * h + (1 - mu) * g * g
                u = g * np.sqrt((h2 + delta) / (h + delta))
                h2[...] = mu * h2 + (1 - mu) * u * u
                step = lr * u
            else:  # Adam
                t = it + 1
                h[...] = mu * h + (1 - mu) * g
                h2[...] = mu2 * h2 + (1 - mu2) * g * g
                step = lr * math.sqrt(1 - mu2 ** t) / (1 - mu ** t) * h / (np.sqrt(h2) + delta)
            params[i] = params[i] - step
    return params[0], params[1]


CASES = [
    ("SGD", "momentum: 0.9 weight_decay: 0.01"),
    ("SGD", "momentum: 0.9 weight_decay: 0.05 regularization_type: \"L1\" iter_size: 2 clip_gradients: 0.3"),
    ("Nesterov", "momentum: 0.8 weight_decay: 0.01"),
    ("AdaGrad", "weight_decay: 0.01 delta: 1e-6"),
    ("RMSProp", "weight_decay: 0.01 rms_decay: 0.9 delta: 1e-6"),
    ("AdaDelta", "momentum: 0.95 delta: 1e-6 weight_decay: 0.01 base_lr: 1.0"),
    ("Adam", "momentum: 0.9 momentum2: 0.999 delta: 1e-8 weight_decay: 0.01"),
]


@pytest.mark.parametrize(("kind", "extra"), CASES)
def test_solver_steps_match_float64_reference(kind: str, extra: str) -> None:
    sp = solver_param(f'type: "{kind}" max_iter: 5 {extra}')
    s = Solver(sp)
    s.net.feed("x", X)
    s.net.feed("y", Y)
    w0, b0 = (p.tensor.detach().double().numpy().copy() for p in s.params)
    s.solve()
    rw, rb = reference(kind, s.sp, w0, b0, 5)
    assert not np.allclose(rw, w0, atol=1e-3)              # the reference moved: the test can fail
    np.testing.assert_allclose(s.params[0].tensor.detach().numpy(), rw, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(s.params[1].tensor.detach().numpy(), rb, rtol=2e-5, atol=2e-6)
    assert len(s.history) == (4 if kind in ("AdaDelta", "Adam") else 2)


def test_clip_happens_before_iter_size_normalization() -> None:
    # With iter_size 2 the accumulated diff is twice the gradient; Caffe clips that sum.
    sp = solver_param('type: "SGD" max_iter: 1 iter_size: 2 clip_gradients: 0.05')
    s = Solver(sp)
    s.net.feed("x", X)
    s.net.feed("y", Y)
    w0, b0 = (p.tensor.detach().double().numpy().copy() for p in s.params)
    s.solve()
    rw, _ = reference("SGD", s.sp, w0, b0, 1)
    np.testing.assert_allclose(s.params[0].tensor.detach().numpy(), rw, rtol=2e-5, atol=2e-6)
    d = X @ w0.T + b0 - Y
    g = [d.T @ X / 4, d.sum(0) / 4]
    norm2 = 2 * math.sqrt(sum((x ** 2).sum() for x in g))
    assert norm2 > 0.05
    wrong = w0 - 0.1 * g[0] * min(1, 0.05 / (norm2 / 2))       # clipping after normalization
    assert not np.allclose(rw, wrong, rtol=1e-4)


def test_lr_policies_over_iterations() -> None:
    base = "base_lr: 0.1 max_iter: 100 "

    def f(x: float) -> float:            # the solver's fields are float32, in Caffe as here
        return float(np.float32(x))

    cases = {
        'lr_policy: "fixed"': lambda it: 0.1,
        'lr_policy: "step" gamma: 0.3 stepsize: 7': lambda it: f(0.1) * f(0.3) ** (it // 7),
        'lr_policy: "exp" gamma: 0.97': lambda it: f(0.1) * f(0.97) ** it,
        'lr_policy: "inv" gamma: 0.001 power: 0.75': lambda it: f(0.1) * (1 + f(0.001) * it) ** -0.75,
        'lr_policy: "poly" power: 2.5': lambda it: f(0.1) * (1 - it / 100) ** 2.5,
        'lr_policy: "sigmoid" gamma: -0.2 stepsize: 40': lambda it: f(0.1) / (1 + math.exp(-f(-0.2) * (it - 40))),
        'lr_policy: "multistep" gamma: 0.5 stepvalue: 10 stepvalue: 25 stepvalue: 26': lambda it: 0.1 * 0.5 ** sum(it >= v for v in (10, 25, 26)),
    }
    for text, ref in cases.items():
        sp = protofile.parse_text(base + text, schema.SolverParameter())
        lr_policy.check(sp)
        step = 0
        for it in range(100):
            rate, step = lr_policy.learning_rate(sp, it, step)
            assert rate == pytest.approx(ref(it), rel=1e-6), (text, it)
    with pytest.raises(lr_policy.LrPolicyError, match="needs gamma, stepsize"):
        lr_policy.check(protofile.parse_text('lr_policy: "step"', schema.SolverParameter()))
    with pytest.raises(lr_policy.LrPolicyError, match="'cosine' is unknown"):
        lr_policy.check(protofile.parse_text('lr_policy: "cosine"', schema.SolverParameter()))


DATA_NET = """
name: "lmdbnet"
layer { name: "d" type: "Data" top: "data" top: "label" transform_param { scale: 0.1 mirror: true crop_size: 4 }
        data_param { source: "SRC" batch_size: 4 backend: LMDB } }
layer { name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param { num_output: 3 kernel_size: 3 weight_filler { type: "xavier" } } }
layer { name: "bn" type: "BatchNorm" bottom: "c" top: "c" }
layer { name: "drop" type: "Dropout" bottom: "c" top: "c" dropout_param { dropout_ratio: 0.3 } }
layer { name: "ip" type: "InnerProduct" bottom: "c" top: "ip" inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


def test_snapshot_then_resume_is_bit_identical(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    convert.from_arrays(tmp_path / "db", rng.integers(0, 255, (10, 1, 5, 5)).astype(np.uint8), rng.integers(0, 3, 10))
    net = protofile.parse_text(DATA_NET.replace("SRC", str(tmp_path / "db")), schema.NetParameter())

    def make(prefix: str, max_iter: int) -> Solver:
        sp = protofile.parse_text(f'base_lr: 0.05 momentum: 0.9 weight_decay: 0.001 lr_policy: "step" gamma: 0.5 stepsize: 3 '
                               f'max_iter: {max_iter} snapshot: 3 random_seed: 42 type: "Adam" '
                               f'snapshot_prefix: "{tmp_path / prefix}"', schema.SolverParameter())
        sp.net_param.CopyFrom(net)
        return Solver(sp)

    whole = make("whole", 7)
    whole.solve()
    first = make("part", 3)
    first.solve()
    second = make("part", 7)
    second.solve(str(tmp_path / "part_iter_3.solverstate"))
    assert second.iter == 7
    for a, b in zip(whole.params, second.params, strict=True):
        assert np.array_equal(a.tensor.detach().numpy(), b.tensor.detach().numpy()), a.layer
    assert not np.array_equal(whole.params[0].tensor.detach().numpy(), first.params[0].tensor.detach().numpy())
    state = protofile.read_binary(tmp_path / "part_iter_3.solverstate", schema.SolverState())
    assert state.iter == 3 and len(state.history) == 2 * len(first.params)
    assert state.learned_net.endswith("part_iter_3.caffemodel")


@pytest.mark.parametrize("extra, words", [
    ('type: "RMSProp" momentum: 0.9', "momentum cannot be used with RMSProp"),
    ("solver_type: RMSPROP momentum: 0.5", "momentum cannot be used with RMSProp"),     # the legacy enum, as old files write it
    ('type: "AdaGrad" momentum: 0.9', "momentum cannot be used with AdaGrad"),
    ('type: "RMSProp" rms_decay: 1.0', "rms_decay must lie in [0, 1)"),
])
def test_adaptive_solvers_refuse_what_caffe_refuses(extra: str, words: str) -> None:
    from ddl.caffe.formats.errors import CaffeFormatError
    with pytest.raises(CaffeFormatError, match=words.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        Solver(solver_param(f"max_iter: 1 {extra}"))


def test_rmsprop_without_momentum_is_accepted() -> None:
    Solver(solver_param('max_iter: 1 type: "RMSProp" rms_decay: 0.95')).solve()
