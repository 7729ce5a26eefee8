"""Tier 1: ddl.onnx reads the reference models, rejects what it cannot read, writes weights back."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import ddl.onnx as donnx  # noqa: E402
from ddl.tools.conformance.models import MODELS  # noqa: E402


def _run(model: object, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])  # type: ignore[attr-defined]
    return np.asarray(sess.run(None, {"input": x})[0])


def _numpy_forward(spec: donnx.ModelSpec, w: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """A float64 reading of the neutral description, independent of any framework."""
    h = x.astype(np.float64)
    for la in spec.layers:
        a = la.attrs
        if la.kind == "dense":
            h = h @ w[f"{la.name}.weight"].T + w[f"{la.name}.bias"]
        elif la.kind == "relu":
            h = np.maximum(h, 0)
        elif la.kind in ("flatten", "reshape"):
            h = h.reshape(len(h), *(a["shape"] if la.kind == "reshape" else (-1,)))
        elif la.kind == "conv":
            (kh, kw), (ph, pw) = a["kernel"], a["pads"]
            hp = np.pad(h, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
            n, _, hh, ww = hp.shape
            oh, ow = hh - kh + 1, ww - kw + 1
            cols = np.stack([hp[:, :, i:i + oh, j:j + ow] for i in range(kh) for j in range(kw)], axis=2)
            wt = w[f"{la.name}.weight"].reshape(a["filters"], -1, kh * kw)
            h = np.einsum("nckhw,ock->nohw", cols, wt) + w[f"{la.name}.bias"][None, :, None, None]
        elif la.kind in ("maxpool", "avgpool"):
            (kh, kw), n, c = a["kernel"], len(h), h.shape[1]
            blocks = h.reshape(n, c, h.shape[2] // kh, kh, h.shape[3] // kw, kw)
            h = blocks.max(axis=(3, 5)) if la.kind == "maxpool" else blocks.mean(axis=(3, 5))
        elif la.kind == "batchnorm":
            s = [w[f"{la.name}.{r}"][None, :, None, None] for r in ("scale", "bias", "mean", "var")]
            h = (h - s[2]) / np.sqrt(s[3] + a["epsilon"]) * s[0] + s[1]
    if spec.output:
        e = np.exp(h - h.max(axis=1, keepdims=True))
        p = e / e.sum(axis=1, keepdims=True)
        h = p if spec.output == "softmax" else np.log(p)
    return h


@pytest.mark.parametrize("name", sorted(MODELS))
def test_reference_models_read_and_agree_with_onnxruntime(name: str) -> None:
    proto = MODELS[name]()
    spec = donnx.read_model(proto)
    x = np.random.default_rng(0).random((5, *spec.input_shape), dtype=np.float32)
    np.testing.assert_allclose(_run(proto, x), _numpy_forward(spec, spec.weights, x), rtol=1e-5, atol=1e-5)
    assert spec.num_classes == 10
    assert spec.param_names() and set(spec.param_names()) == set(spec.weights)


def test_kinds_and_layouts() -> None:
    mlp = donnx.read_model(MODELS["mlp"]())
    assert [la.kind for la in mlp.layers] == ["dense", "relu", "dense"] and mlp.output == "softmax"
    # Gemm(transB=1) keeps (out, in); MatMul's (in, out) initializer is transposed into (out, in)
    assert mlp.weights["fc1.weight"].shape == (32, 64) and mlp.weights["fc2.weight"].shape == (10, 32)
    assert mlp.sources["fc2.weight"] == ("fc2.W", True)
    cnn = donnx.read_model(MODELS["cnn"]())
    assert [la.kind for la in cnn.layers][:3] == ["conv", "relu", "maxpool"] and cnn.output == "logsoftmax"
    assert cnn.layers[0].attrs["pads"] == (1, 1) and cnn.input_shape == (1, 8, 8)
    bn = donnx.read_model(MODELS["bn"]())
    assert bn.layers[0].kind == "reshape" and bn.layers[0].attrs["shape"] == (1, 8, 8) and bn.output is None
    assert "bn1.mean" in bn.param_names() and "bn1.mean" not in bn.trainable_names()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_write_weights_round_trip(name: str, tmp_path) -> None:
    proto = MODELS[name]()
    spec = donnx.read_model(proto)
    rng = np.random.default_rng(1)
    new = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in spec.weights.items()}
    new = {k: (np.abs(v) + 0.5 if k.endswith(".var") else v) for k, v in new.items()}
    out = donnx.write_weights(proto, new, tmp_path / "m.onnx")
    back = donnx.read_model(str(tmp_path / "m.onnx"))
    for k in new:
        np.testing.assert_array_equal(back.weights[k], new[k])
    x = rng.random((4, *spec.input_shape), dtype=np.float32)
    np.testing.assert_allclose(_run(out, x), _numpy_forward(spec, new, x), rtol=1e-4, atol=1e-5)
    with pytest.raises(KeyError, match="no trained value"):
        donnx.write_weights(proto, {k: v for k, v in new.items() if k != spec.param_names()[0]})
    bad = dict(new)
    bad[spec.param_names()[0]] = np.zeros((3, 3), np.float32)
    with pytest.raises(ValueError, match="has shape"):
        donnx.write_weights(proto, bad)


def _chain(op: str, **attrs: object) -> object:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    node = helper.make_node(op, ["x"], ["y"], name="the_node", **attrs)
    return helper.make_model(helper.make_graph([node], "g", [x], [y]))


def test_unsupported_op_names_node_and_op() -> None:
    with pytest.raises(donnx.UnsupportedModelError, match=r"'the_node' \(op Tanh\).*not supported"):
        donnx.read_model(_chain("Tanh"))
    with pytest.raises(donnx.UnsupportedModelError, match=r"'the_node' \(op Flatten\).*axis=1"):
        donnx.read_model(_chain("Flatten", axis=2))


def test_unsupported_attributes_and_shapes() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])
    w = numpy_helper.from_array(np.zeros((4, 3), np.float32), "w")
    b = numpy_helper.from_array(np.zeros(3, np.float32), "b")
    scaled = helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="g1", alpha=2.0)
    with pytest.raises(donnx.UnsupportedModelError, match="'g1' .*alpha=1"):
        donnx.read_model(helper.make_model(helper.make_graph([scaled], "g", [x], [y], initializer=[w, b])))
    lone = helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")
    with pytest.raises(donnx.UnsupportedModelError, match="'mm' .*followed by an Add"):
        donnx.read_model(helper.make_model(helper.make_graph([lone], "g", [x], [y], initializer=[w])))
    wrong = helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="g2", transB=1)  # (4,3) read as (out=4, in=3)
    with pytest.raises(donnx.UnsupportedModelError, match="does not take an input"):
        donnx.read_model(helper.make_model(helper.make_graph([wrong], "g", [x], [y], initializer=[w, b])))


def test_import_ddl_loads_no_onnx() -> None:
    code = "import sys, ddl, ddl.onnx, ddl.tools.conformance; assert 'onnx' not in sys.modules, 'onnx loaded'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
