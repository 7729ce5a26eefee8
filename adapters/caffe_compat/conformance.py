"""Conformance hooks for ddl.caffe: a Caffe NetParameter from a ddl.onnx description, Caffe's solvers, its exporter.

A dense layer is an InnerProduct ((out, in) weights, as in the description), a
BatchNorm is Caffe's pair BatchNorm (statistics, ``use_global_stats: true``) + Scale
(trainable scale and bias). Caffe's SGD is v = μv + lr·g; w -= v, torch's v = μv + g;
w -= lr·v: the same at a constant lr up to one rounding per step. Caffe's Adam adds its
``delta`` to sqrt(v) before the bias correction (as Keras does), torch after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ddl.caffe.formats import schema
from ddl.caffe.net.net import Net
from ddl.onnx import ModelSpec
from ddl.tools.conformance.adapter_hooks import Recipe

NAME = "caffe"
OPTIMIZERS = ("sgd", "adam")
_SOLVERS = {"sgd": "SGD", "adam": "Adam"}


def init() -> None:
    """ddl.init() and one intra-op thread (the net runs on torch kernels)."""
    import ddl

    ddl.init()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)


def _layer(name: str, type_: str, bottom: str, top: str, body: str = "") -> str:
    return f'layer {{ name: "{name}" type: "{type_}" bottom: "{bottom}" top: "{top}" {body} }}\n'


def net_text(spec: ModelSpec, batch: int, *, train: bool) -> str:
    """The prototxt of ``spec`` with an Input of ``batch`` samples (and labels and a loss when ``train``)."""
    dims = " ".join(f"dim: {d}" for d in (batch, *spec.input_shape))
    tops = 'top: "data" top: "label"' if train else 'top: "data"'
    shapes = f"shape {{ {dims} }}" + (f" shape {{ dim: {batch} }}" if train else "")
    text = f'name: "{spec.name}"\nlayer {{ name: "input" type: "Input" {tops} input_param {{ {shapes} }} }}\n'
    cur = "data"
    for la in spec.layers:
        a, n = la.attrs, la.name
        if la.kind == "dense":
            text += _layer(n, "InnerProduct", cur, n, f"inner_product_param {{ num_output: {a['units']} }}")
        elif la.kind == "conv":
            (kh, kw), (sh, sw), (ph, pw) = a["kernel"], a["strides"], a["pads"]
            text += _layer(n, "Convolution", cur, n, f"convolution_param {{ num_output: {a['filters']} kernel_h: {kh} "
                                                     f"kernel_w: {kw} stride_h: {sh} stride_w: {sw} pad_h: {ph} pad_w: {pw} }}")
        elif la.kind in ("maxpool", "avgpool"):
            (kh, kw), (sh, sw) = a["kernel"], a["strides"]
            pool = "MAX" if la.kind == "maxpool" else "AVE"
            text += _layer(n, "Pooling", cur, n, f"pooling_param {{ pool: {pool} kernel_h: {kh} kernel_w: {kw} "
                                                 f"stride_h: {sh} stride_w: {sw} }}")
        elif la.kind == "relu":
            text += _layer(n, "ReLU", cur, n)
        elif la.kind == "flatten":
            text += _layer(n, "Flatten", cur, n)
        elif la.kind == "reshape":
            text += _layer(n, "Reshape", cur, n, "reshape_param { shape { dim: 0 "
                           + " ".join(f"dim: {d}" for d in a["shape"]) + " } }")
        elif la.kind == "batchnorm":
            frozen = "param { lr_mult: 0 } " * 3
            text += _layer(n, "BatchNorm", cur, n, f"{frozen}batch_norm_param {{ use_global_stats: true eps: {a['epsilon']!r} }}")
            text += _layer(f"{n}_scale", "Scale", n, f"{n}_scale", "scale_param { bias_term: true }")
            cur = f"{n}_scale"
            continue
        else:
            raise ValueError(f"ddl.caffe conformance: no Caffe layer for layer kind {la.kind!r}")
        cur = n
    if train:
        text += f'layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "{cur}" bottom: "label" top: "loss" }}\n'
    elif spec.output is not None:
        text += _layer("prob", "Softmax", cur, "prob")  # Caffe has no LogSoftmax: see export_onnx
    return text


def net_param(spec: ModelSpec, batch: int, *, train: bool) -> Any:
    """``net_text`` parsed into a ``caffe.NetParameter``."""
    from google.protobuf import text_format

    return text_format.Parse(net_text(spec, batch, train=train), schema.NetParameter())


def _blobs(spec: ModelSpec, net: Net) -> list[tuple[str, torch.Tensor]]:
    """(neutral weight name, the Caffe blob that holds it) for every weight."""
    out = []
    for la in spec.layers:
        n = la.name
        if la.kind in ("dense", "conv"):
            b = net.layer_by_name(n).blobs  # type: ignore[union-attr]
            out += [(f"{n}.weight", b[0]), (f"{n}.bias", b[1])]
        elif la.kind == "batchnorm":
            stats, affine = net.layer_by_name(n).blobs, net.layer_by_name(f"{n}_scale").blobs  # type: ignore[union-attr]
            out += [(f"{n}.mean", stats[0]), (f"{n}.var", stats[1]), (f"{n}.scale", affine[0]), (f"{n}.bias", affine[1])]
    return out


def set_weights(spec: ModelSpec, net: Net, w: dict[str, np.ndarray]) -> None:
    """Copy neutral weights into the net's blobs (BatchNorm's factor blob set to 1)."""
    with torch.no_grad():
        for name, blob in _blobs(spec, net):
            blob.copy_(torch.from_numpy(np.asarray(w[name], np.float32)).reshape(blob.shape))
        for la in spec.layers:
            if la.kind == "batchnorm":
                net.layer_by_name(la.name).blobs[2].fill_(1.0)  # type: ignore[union-attr]


def get_weights(spec: ModelSpec, net: Net) -> dict[str, np.ndarray]:
    """The net's weights in the neutral layout."""
    return {name: blob.detach().numpy().copy() for name, blob in _blobs(spec, net)}


def solver_param(spec: ModelSpec, recipe: Recipe, batch: int) -> Any:
    """A SolverParameter of Caffe's SGD or Adam with a fixed lr for ``recipe``."""
    if recipe.optimizer not in _SOLVERS:
        raise ValueError(f"ddl.caffe conformance: unknown optimizer {recipe.optimizer!r}; known: {OPTIMIZERS}")
    sp = schema.SolverParameter(type=_SOLVERS[recipe.optimizer], base_lr=recipe.lr, lr_policy="fixed",
                                max_iter=recipe.steps, display=0, random_seed=1, snapshot=0)
    sp.net_param.CopyFrom(net_param(spec, batch, train=True))
    if recipe.optimizer == "sgd":
        sp.momentum = recipe.momentum
    else:
        sp.momentum, sp.momentum2, sp.delta = recipe.beta1, recipe.beta2, recipe.eps
    return sp


def train(spec: ModelSpec, recipe: Recipe, shards: Sequence[tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
    """Caffe's Solver, one iteration per shard (fed through the Input layer), gradients averaged by ddl."""
    import ddl
    from ddl.caffe.solver.solver import Solver

    solver = Solver(solver_param(spec, recipe, len(shards[0][0])), rank=ddl.rank(), size=ddl.size())
    set_weights(spec, solver.net, spec.weights)
    solver.sync_params()
    for x, y in shards:
        solver.net.feed("data", x)
        solver.net.feed("label", y.astype(np.float32))
        solver.step(1)
    return get_weights(spec, solver.net)


def _deploy(spec: ModelSpec, weights: dict[str, np.ndarray], batch: int) -> Net:
    net = Net(net_param(spec, batch, train=False), schema.TEST, quiet=True)
    set_weights(spec, net, weights)
    return net


def predict(spec: ModelSpec, weights: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """The deploy net's output for ``x`` (log of Caffe's Softmax for a LogSoftmax model)."""
    net = _deploy(spec, weights, len(x))
    net.feed("data", x)
    with torch.no_grad():
        _, blobs = net.forward()
    out = blobs[net.outputs[-1]]
    if spec.output == "logsoftmax":
        out = torch.log(out)
    return out.numpy()


def export_onnx(spec: ModelSpec, weights: dict[str, np.ndarray], path: Path, *, batch: int = 64) -> None:
    """ddl.caffe's exporter on the deploy net (a fixed batch of ``batch``); a Log node is appended
    for a LogSoftmax model, Caffe having no such layer."""
    import onnx
    from onnx import helper

    from ddl.caffe.export.onnx_export import to_onnx

    model = to_onnx(_deploy(spec, weights, batch))
    if spec.output == "logsoftmax":
        g = model.graph
        out = g.output[0]
        g.node.append(helper.make_node("Log", [out.name], [out.name + "_log"], name="log"))
        out.name = out.name + "_log"
    onnx.save(model, str(path))
