"""The neutral model description: an ordered list of layers, an input shape and weights."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

# Layer kinds and their weights (neutral layout, the one torch and ONNX's Conv use):
#   dense      weight (out, in), bias (out,)            attrs: units
#   conv       weight (out, in, kh, kw), bias (out,)    attrs: filters, kernel, strides, pads (top, left)
#   maxpool / avgpool                                   attrs: kernel, strides
#   relu, flatten
#   reshape                                             attrs: shape (without the batch dimension)
#   batchnorm  scale, bias, mean, var (C,)              attrs: epsilon
# Tensors between layers are NCHW (batch first, channels before space), as in ONNX.
KINDS = ("dense", "conv", "maxpool", "avgpool", "relu", "flatten", "reshape", "batchnorm")
PARAMS = {"dense": ("weight", "bias"), "conv": ("weight", "bias"),
          "batchnorm": ("scale", "bias", "mean", "var")}
# batchnorm's mean and var are statistics, not trained: the suite trains BatchNorm with
# its stored statistics (inference-mode normalisation, trainable scale and bias), the
# only form in which N ranks on B/N samples can equal one rank on B without a synced BN.
FROZEN = {("batchnorm", "mean"), ("batchnorm", "var")}


@dataclasses.dataclass(frozen=True)
class Layer:
    """One layer: a kind from ``KINDS``, a unique name and its attributes."""

    kind: str
    name: str
    attrs: dict[str, Any] = dataclasses.field(default_factory=dict)

    def param_names(self) -> tuple[str, ...]:
        """The weight names of this layer (``"<layer>.<role>"``), in a fixed order."""
        return tuple(f"{self.name}.{role}" for role in PARAMS.get(self.kind, ()))

    def trainable(self, role: str) -> bool:
        """Whether the optimiser updates this weight (BatchNorm statistics are not)."""
        return (self.kind, role) not in FROZEN


@dataclasses.dataclass
class ModelSpec:
    """A model of the supported subset, read from ONNX.

    Attributes:
        name: the graph's name.
        input_shape: one sample's shape (no batch dimension), e.g. ``(64,)`` or ``(1, 8, 8)``.
        layers: the layers in order; the output of the last is the logits.
        output: ``"softmax"``, ``"logsoftmax"`` or ``None``: the activation the ONNX
            graph applies to the logits (frameworks train on the logits with
            softmax cross-entropy either way).
        weights: ``"<layer>.<role>"`` -> float32 array in the neutral layout.
        num_classes: the logits' width.
        sources: weight name -> (ONNX initializer name, transposed?): where
            :func:`ddl.onnx.write_weights` puts each trained weight back.
    """

    name: str
    input_shape: tuple[int, ...]
    layers: list[Layer]
    output: str | None
    weights: dict[str, np.ndarray]
    num_classes: int
    sources: dict[str, tuple[str, bool]] = dataclasses.field(default_factory=dict)

    def param_names(self) -> list[str]:
        """Every weight name, layer by layer."""
        return [n for layer in self.layers for n in layer.param_names()]

    def trainable_names(self) -> list[str]:
        """The names of the weights an optimiser updates."""
        return [f"{la.name}.{role}" for la in self.layers for role in PARAMS.get(la.kind, ())
                if la.trainable(role)]

    def copy_weights(self) -> dict[str, np.ndarray]:
        """A deep copy of the initial weights."""
        return {k: v.copy() for k, v in self.weights.items()}
