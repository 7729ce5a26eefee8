"""Conformance hooks for ddl.torch: build a torch.nn.Module from a ddl.onnx description, train, export."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

import torch
from ddl.onnx import ModelSpec
from ddl.tools.conformance.adapter_hooks import Recipe
from torch import nn

from .broadcast import broadcast_parameters
from .optimizer import DistributedOptimizer

NAME = "torch"
OPTIMIZERS = ("sgd", "adam")
# neutral role -> the torch module's state_dict key (BatchNorm keeps its statistics as buffers)
_KEYS = {"scale": "weight", "bias": "bias", "weight": "weight", "mean": "running_mean", "var": "running_var"}


def init() -> None:
    """ddl.torch.init(), one intra-op thread (ranks share the cores) and deterministic kernels."""
    import ddl

    ddl.init()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)


class _Reshape(nn.Module):
    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.shape = shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], *self.shape)


def build(spec: ModelSpec, weights: dict[str, np.ndarray] | None = None) -> nn.Sequential:
    """The logits model of ``spec`` as an ``nn.Sequential`` whose children are named after the layers."""
    mods: OrderedDict[str, nn.Module] = OrderedDict()
    w = spec.weights if weights is None else weights
    for la in spec.layers:
        a = la.attrs
        if la.kind == "dense":
            n_out, n_in = w[f"{la.name}.weight"].shape
            mods[la.name] = nn.Linear(n_in, n_out)
        elif la.kind == "conv":
            c_out, c_in = w[f"{la.name}.weight"].shape[:2]
            mods[la.name] = nn.Conv2d(c_in, c_out, a["kernel"], stride=a["strides"], padding=a["pads"])
        elif la.kind == "maxpool":
            mods[la.name] = nn.MaxPool2d(a["kernel"], stride=a["strides"])
        elif la.kind == "avgpool":
            mods[la.name] = nn.AvgPool2d(a["kernel"], stride=a["strides"])
        elif la.kind == "relu":
            mods[la.name] = nn.ReLU()
        elif la.kind == "flatten":
            mods[la.name] = nn.Flatten()
        elif la.kind == "reshape":
            mods[la.name] = _Reshape(tuple(a["shape"]))
        elif la.kind == "batchnorm":
            mods[la.name] = nn.BatchNorm2d(w[f"{la.name}.scale"].shape[0], eps=a["epsilon"])
        else:
            raise ValueError(f"ddl.torch conformance: no torch module for layer kind {la.kind!r}")
    model = nn.Sequential(mods)
    set_weights(model, spec, w)
    # BatchNorm normalises with its stored statistics (see ddl.onnx.spec.FROZEN): eval mode
    # throughout; no other layer here behaves differently in training.
    model.eval()
    return model


def set_weights(model: nn.Module, spec: ModelSpec, weights: dict[str, np.ndarray]) -> None:
    """Copy neutral-layout ``weights`` into ``model`` (built by :func:`build`)."""
    state = model.state_dict()
    with torch.no_grad():
        for name in spec.param_names():
            layer, role = name.split(".")
            state[f"{layer}.{_KEYS[role]}"].copy_(torch.from_numpy(np.asarray(weights[name], np.float32)))


def get_weights(model: nn.Module, spec: ModelSpec) -> dict[str, np.ndarray]:
    """The model's weights in the neutral layout."""
    state = model.state_dict()
    out = {}
    for name in spec.param_names():
        layer, role = name.split(".")
        out[name] = state[f"{layer}.{_KEYS[role]}"].detach().numpy().copy()
    return out


def _optimizer(recipe: Recipe, params: Any) -> torch.optim.Optimizer:
    if recipe.optimizer == "sgd":
        return torch.optim.SGD(params, lr=recipe.lr, momentum=recipe.momentum)
    if recipe.optimizer == "adam":
        return torch.optim.Adam(params, lr=recipe.lr, betas=(recipe.beta1, recipe.beta2), eps=recipe.eps)
    raise ValueError(f"ddl.torch conformance: unknown optimizer {recipe.optimizer!r}; known: {OPTIMIZERS}")


def train(spec: ModelSpec, recipe: Recipe, shards: Sequence[tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
    """One DistributedOptimizer step per shard from the spec's initial weights; the trained weights."""
    model = build(spec)
    broadcast_parameters(model.state_dict(), root_rank=0)
    opt = DistributedOptimizer(_optimizer(recipe, model.parameters()), named_parameters=model.named_parameters())
    for x, y in shards:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
    return get_weights(model, spec)


def _with_output(spec: ModelSpec, model: nn.Module) -> nn.Module:
    if spec.output == "softmax":
        return nn.Sequential(model, nn.Softmax(dim=1))
    if spec.output == "logsoftmax":
        return nn.Sequential(model, nn.LogSoftmax(dim=1))
    return model


def predict(spec: ModelSpec, weights: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """The model's outputs (with the spec's final softmax) for ``x``."""
    model = _with_output(spec, build(spec, weights))
    with torch.no_grad():
        out: np.ndarray = model(torch.from_numpy(x)).numpy()
    return out


def export_onnx(spec: ModelSpec, weights: dict[str, np.ndarray], path: Path) -> None:
    """``torch.onnx.export`` (the TorchScript exporter, ``dynamo=False``) with a dynamic batch."""
    model = _with_output(spec, build(spec, weights))
    dummy = torch.zeros(2, *spec.input_shape)
    torch.onnx.export(model, (dummy,), str(path), dynamo=False, input_names=["input"], output_names=["output"],
                      dynamic_axes={"input": {0: "N"}, "output": {0: "N"}}, opset_version=17)
