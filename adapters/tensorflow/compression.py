"""Horovod's TensorFlow ``Compression``: compressors with ``compress(tensor) -> (tensor, ctx)``
and ``decompress(tensor, ctx)``, which the collectives also take as ``compression=``.

Passed to a collective (or ``DistributedGradientTape``, ``DistributedOptimizer``), a
compressor names the core's wire compression (:mod:`ddl.engine.compression`, via
``wire_compression``): partial sums travel in half precision on every algorithm. Its
``compress``/``decompress`` methods are Horovod's, for code that calls them itself.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf


class Compressor:
    """Horovod's compressor interface (the identity)."""

    wire_compression = "none"

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        """The tensor to send, and what :meth:`decompress` needs."""
        return tensor, None

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        """The received tensor, as the original."""
        return tensor


class NoneCompressor(Compressor):
    """No compression."""


class _HalfCompressor(Compressor):
    half: tf.DType = tf.float16

    @classmethod
    def compress(cls, tensor: Any) -> tuple[Any, Any]:  # type: ignore[override]
        """Floating tensors cast down to the half type; others unchanged."""
        dtype = tensor.dtype
        return (tf.cast(tensor, cls.half) if dtype.is_floating else tensor), dtype

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        """Cast back to the original dtype."""
        return tf.cast(tensor, ctx) if ctx is not None and ctx.is_floating else tensor


class FP16Compressor(_HalfCompressor):
    """float16 on the wire."""

    wire_compression = "fp16"


class BF16Compressor(_HalfCompressor):
    """bfloat16 on the wire (ddl's addition; the core needs ml_dtypes)."""

    wire_compression = "bf16"
    half = tf.bfloat16


class Compression:
    """``Compression.none``, ``Compression.fp16`` (Horovod's) and ``Compression.bf16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
