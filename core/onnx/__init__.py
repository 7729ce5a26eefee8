"""ddl.onnx: read ONNX models of a small op subset into a neutral description; write weights back.

numpy and onnx only; onnx is imported when a function runs, so ``import ddl.onnx`` is cheap.

Example:
    >>> spec = ddl.onnx.read_model("mlp.onnx")                         # doctest: +SKIP
    >>> ddl.onnx.write_weights("mlp.onnx", trained, "trained.onnx")    # doctest: +SKIP
"""

from __future__ import annotations

from .reader import SUPPORTED, UnsupportedModelError, read_model
from .spec import KINDS, PARAMS, Layer, ModelSpec
from .writer import write_weights

__all__ = ["KINDS", "PARAMS", "SUPPORTED", "Layer", "ModelSpec", "UnsupportedModelError", "read_model",
           "write_weights"]
