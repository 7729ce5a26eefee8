"""ddl.tools.conformance: the cross-framework conformance suite (reference ONNX models, hooks, runner, table)."""

from __future__ import annotations

from .adapter_hooks import (
    ADAPTERS,
    RECIPES,
    REFERENCE,
    AdapterHooks,
    Recipe,
    available,
    load,
    weights_digest,
)
from .metrics import max_rel_diff, rel_diff

__all__ = ["ADAPTERS", "RECIPES", "REFERENCE", "AdapterHooks", "Recipe", "available", "load", "max_rel_diff", "rel_diff",
           "weights_digest"]
