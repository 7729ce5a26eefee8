"""Horovod's ``horovod.tensorflow.util`` helper that scripts import (``_executing_eagerly``)."""

from __future__ import annotations

from .bridge import executing_eagerly as _executing_eagerly

__all__ = ["_executing_eagerly"]
