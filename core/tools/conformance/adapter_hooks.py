"""The conformance hooks an adapter provides, the training recipes and the adapter registry."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from ddl.onnx import ModelSpec

# One entry per adapter: its name in the table -> (the module that holds its hooks, the
# packages it needs installed). A new adapter joins the suite by adding one line here.
ADAPTERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "torch": ("ddl.torch.conformance", ("torch",)),
    "tensorflow": ("ddl.tensorflow.conformance", ("tensorflow", "keras")),
    "caffe": ("ddl.caffe.conformance", ("torch", "google.protobuf", "onnx")),
}
REFERENCE = "torch"  # the framework the others are compared with at one rank


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How to train: optimiser and its settings, steps and the global batch.

    Adam's epsilon is tiny on purpose: torch adds it to sqrt(v̂), Keras and Caffe to
    sqrt(v)·sqrt(1-β2^t) ("epsilon hat"); at 1e-8 that alone separates the frameworks by
    ~1e-4 of a step. At 1e-12 the placement no longer matters.
    """

    optimizer: str
    lr: float
    momentum: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-12
    steps: int = 20
    batch: int = 48  # the global batch; divides by 1, 2, 3, 4, 6, 8


RECIPES: dict[str, Recipe] = {
    "sgd": Recipe("sgd", lr=0.05, momentum=0.9),
    "adam": Recipe("adam", lr=0.005),
}


class AdapterHooks(Protocol):
    """What an adapter's ``conformance`` module provides (see docs/adapter-contract.md).

    Weights travel in the neutral layout of :class:`ddl.onnx.ModelSpec`
    (``"<layer>.<role>"`` -> float32 array; dense (out, in), conv (out, in, kh, kw)).
    """

    NAME: str
    OPTIMIZERS: tuple[str, ...]  # the keys of RECIPES this framework has

    def init(self) -> None:
        """Initialise the adapter (``ddl.<adapter>.init()``) and make the framework deterministic."""

    def train(self, spec: ModelSpec, recipe: Recipe, shards: Sequence[tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
        """Build the native model from ``spec`` (its initial weights), broadcast it from rank 0,
        wrap the optimiser with the adapter's distributed optimiser or gradient hook, take
        one step per shard (this rank's slice of each global batch, x shaped (n, *spec.input_shape); mean softmax
        cross-entropy of the logits) and return the trained weights."""

    def predict(self, spec: ModelSpec, weights: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
        """The native model's output (with the spec's final softmax, if any) for ``x`` (batch, *spec.input_shape)."""

    def export_onnx(self, spec: ModelSpec, weights: dict[str, np.ndarray], path: Path) -> None:
        """Export the native model holding ``weights`` to ONNX with the framework's own exporter."""


def load(name: str) -> AdapterHooks:
    """The hooks of adapter ``name`` (a key of :data:`ADAPTERS`)."""
    if name not in ADAPTERS:
        raise ValueError(f"no conformance hooks for {name!r}; known adapters: {sorted(ADAPTERS)}")
    module: AdapterHooks = importlib.import_module(ADAPTERS[name][0])  # type: ignore[assignment]
    return module


def available() -> list[str]:
    """The adapters whose frameworks are installed here (found without importing them)."""
    import importlib.util

    def found(pkg: str) -> bool:
        try:
            return importlib.util.find_spec(pkg) is not None
        except ModuleNotFoundError:  # a dotted name whose parent is missing
            return False

    return [name for name, (_, needs) in ADAPTERS.items() if all(found(p) for p in needs)]


def weights_digest(spec: ModelSpec, weights: dict[str, np.ndarray]) -> str:
    """A hash of the weights' bytes in a fixed order: equal digests mean bit-identical weights."""
    import hashlib

    h = hashlib.sha256()
    for n in spec.param_names():
        h.update(np.ascontiguousarray(weights[n], dtype=np.float32).tobytes())
    return h.hexdigest()
