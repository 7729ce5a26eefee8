"""Write trained weights (neutral layout) back into an ONNX model's initializers."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .reader import read_model


def write_weights(model: Any, weights: Mapping[str, np.ndarray], path: str | Path | None = None) -> Any:
    """Return a copy of ``model`` whose initializers hold ``weights``; save it to ``path`` if given.

    Args:
        model: the ONNX model the weights were read from (``ModelProto`` or path).
        weights: ``"<layer>.<role>"`` -> array in the neutral layout (as in
            :attr:`ModelSpec.weights`); every weight of the model must be present.
        path: where to save the new model (optional).

    Returns:
        The new ``onnx.ModelProto`` (checked with ``onnx.checker``).

    Raises:
        KeyError: a weight is missing; ValueError: a weight has the wrong shape.

    Example:
        >>> ddl.onnx.write_weights("mlp.onnx", trained, "mlp-trained.onnx")  # doctest: +SKIP
    """
    import onnx
    from onnx import numpy_helper

    proto = onnx.ModelProto()
    if isinstance(model, onnx.ModelProto):
        proto.CopyFrom(model)
    else:
        proto = onnx.load(str(model))
    spec = read_model(proto)
    missing = [n for n in spec.weights if n not in weights]
    if missing:
        raise KeyError(f"write_weights: no trained value for {missing}; pass every weight of the model "
                       f"({sorted(spec.weights)})")
    replace: dict[str, np.ndarray] = {}
    for name, (init, transposed) in spec.sources.items():
        arr = np.asarray(weights[name], dtype=np.float32)
        if arr.shape != spec.weights[name].shape:
            raise ValueError(f"write_weights: {name!r} has shape {arr.shape}, the model expects "
                             f"{spec.weights[name].shape} (neutral layout)")
        replace[init] = np.ascontiguousarray(arr.T if transposed else arr)
    for t in proto.graph.initializer:
        if t.name in replace:
            t.CopyFrom(numpy_helper.from_array(replace[t.name], t.name))
    onnx.checker.check_model(proto)
    if path is not None:
        onnx.save(proto, str(path))
    return proto
