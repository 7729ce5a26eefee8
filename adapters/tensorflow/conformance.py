"""Conformance hooks for ddl.tensorflow: a Keras 3 model from a ddl.onnx description, trained and exported.

Keras convolutions are NHWC with HWIO kernels and Dense kernels are (in, out); the
description is NCHW with OIHW and (out, in) weights. The model keeps NCHW semantics at
its boundaries: an image input is permuted to NHWC before the first convolution and back
to NCHW before Flatten, so the Dense weights after it need no reordering.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import keras
import numpy as np

import tensorflow as tf
from ddl.onnx import ModelSpec
from ddl.tools.conformance.adapter_hooks import Recipe

from .keras.optimizer import DistributedOptimizer
from .tape import broadcast_variables

NAME = "tensorflow"
OPTIMIZERS = ("sgd", "adam")


def init() -> None:
    """ddl.tensorflow.init(), one intra-op thread (ranks share the cores) and deterministic kernels."""
    import ddl

    ddl.init()
    try:
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError:  # already initialised by an earlier use in this process
        pass
    tf.config.experimental.enable_op_determinism()


def _layers(spec: ModelSpec) -> tuple[keras.Model, dict[str, Any]]:
    inp = keras.Input(shape=spec.input_shape, dtype="float32", name="input")
    h, nhwc = inp, False
    named: dict[str, Any] = {}
    if len(spec.input_shape) == 3:
        h, nhwc = keras.layers.Permute((2, 3, 1))(h), True
    for la in spec.layers:
        a = la.attrs
        if la.kind == "dense":
            layer = named[la.name] = keras.layers.Dense(a["units"], name=la.name)
            h = layer(h)
        elif la.kind == "conv":
            if any(a["pads"]):
                h = keras.layers.ZeroPadding2D(tuple(a["pads"]))(h)
            layer = named[la.name] = keras.layers.Conv2D(a["filters"], a["kernel"], strides=a["strides"],
                                                         padding="valid", name=la.name)
            h = layer(h)
        elif la.kind in ("maxpool", "avgpool"):
            cls = keras.layers.MaxPooling2D if la.kind == "maxpool" else keras.layers.AveragePooling2D
            h = cls(a["kernel"], strides=a["strides"], padding="valid", name=la.name)(h)
        elif la.kind == "relu":
            h = keras.layers.ReLU(name=la.name)(h)
        elif la.kind in ("flatten", "reshape"):
            if nhwc:
                h, nhwc = keras.layers.Permute((3, 1, 2))(h), False
            shape = tuple(a["shape"]) if la.kind == "reshape" else (-1,)
            h = keras.layers.Reshape(shape, name=la.name)(h)
            if len(shape) == 3:
                h, nhwc = keras.layers.Permute((2, 3, 1))(h), True
        elif la.kind == "batchnorm":
            layer = named[la.name] = keras.layers.BatchNormalization(axis=-1, epsilon=a["epsilon"], name=la.name)
            h = layer(h)
        else:
            raise ValueError(f"ddl.tensorflow conformance: no Keras layer for layer kind {la.kind!r}")
    if spec.output == "softmax":
        h = keras.layers.Softmax(axis=-1, name="output")(h)
    elif spec.output == "logsoftmax":
        h = keras.layers.Activation(tf.nn.log_softmax, name="output")(h)
    return keras.Model(inp, h, name=spec.name), named


def build(spec: ModelSpec, weights: dict[str, np.ndarray] | None = None) -> tuple[keras.Model, keras.Model]:
    """(logits model, model with the spec's final softmax) sharing their layers, holding ``weights``."""
    full, named = _layers(spec)
    logits_layer = next(la for la in reversed(spec.layers) if la.kind == "dense")
    logits = keras.Model(full.inputs[0], named[logits_layer.name].output)
    set_weights(named, spec, spec.weights if weights is None else weights)
    return logits, full


def set_weights(named: dict[str, Any], spec: ModelSpec, w: dict[str, np.ndarray]) -> None:
    """Copy neutral-layout weights into the Keras layers (kernels transposed to Keras's layouts)."""
    for la in spec.layers:
        n = la.name
        if la.kind == "dense":
            named[n].set_weights([w[f"{n}.weight"].T, w[f"{n}.bias"]])
        elif la.kind == "conv":
            named[n].set_weights([w[f"{n}.weight"].transpose(2, 3, 1, 0), w[f"{n}.bias"]])
        elif la.kind == "batchnorm":
            named[n].set_weights([w[f"{n}.scale"], w[f"{n}.bias"], w[f"{n}.mean"], w[f"{n}.var"]])


def get_weights(model: keras.Model, spec: ModelSpec) -> dict[str, np.ndarray]:
    """The model's weights in the neutral layout."""
    out: dict[str, np.ndarray] = {}
    for la in spec.layers:
        n = la.name
        if la.kind not in ("dense", "conv", "batchnorm"):
            continue
        vals = [np.asarray(v) for v in model.get_layer(n).get_weights()]
        if la.kind == "dense":
            out[f"{n}.weight"], out[f"{n}.bias"] = np.ascontiguousarray(vals[0].T), vals[1]
        elif la.kind == "conv":
            out[f"{n}.weight"], out[f"{n}.bias"] = np.ascontiguousarray(vals[0].transpose(3, 2, 0, 1)), vals[1]
        else:
            out[f"{n}.scale"], out[f"{n}.bias"], out[f"{n}.mean"], out[f"{n}.var"] = vals
    return out


def _optimizer(recipe: Recipe) -> keras.optimizers.Optimizer:
    if recipe.optimizer == "sgd":
        return keras.optimizers.SGD(learning_rate=recipe.lr, momentum=recipe.momentum)
    if recipe.optimizer == "adam":
        return keras.optimizers.Adam(learning_rate=recipe.lr, beta_1=recipe.beta1, beta_2=recipe.beta2,
                                     epsilon=recipe.eps)
    raise ValueError(f"ddl.tensorflow conformance: unknown optimizer {recipe.optimizer!r}; known: {OPTIMIZERS}")


def train(spec: ModelSpec, recipe: Recipe, shards: Sequence[tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
    """One ddl DistributedOptimizer step per shard (a GradientTape loop); the trained weights."""
    logits, _ = build(spec)
    broadcast_variables(logits.variables, root_rank=0)
    opt = DistributedOptimizer(_optimizer(recipe))
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    tvs = logits.trainable_variables

    def step(x: tf.Tensor, y: tf.Tensor) -> None:
        with tf.GradientTape() as tape:
            # training=False: BatchNorm normalises with its stored statistics (see ddl.onnx.spec.FROZEN)
            loss = loss_fn(y, logits(x, training=False))
        opt.apply(tape.gradient(loss, tvs), tvs)

    for x, y in shards:
        step(tf.constant(x), tf.constant(y))
    return get_weights(logits, spec)


def predict(spec: ModelSpec, weights: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """The model's outputs (with the spec's final softmax) for ``x``."""
    _, full = build(spec, weights)
    return np.asarray(full(tf.constant(x), training=False))


def export_onnx(spec: ModelSpec, weights: dict[str, np.ndarray], path: Path) -> None:
    """Keras 3's own ONNX export (``model.export(format="onnx")``, tf2onnx underneath)."""
    _, full = build(spec, weights)
    full(np.zeros((1, *spec.input_shape), np.float32))  # Keras exports only a model that has run
    full.export(str(path), format="onnx", verbose=False)
