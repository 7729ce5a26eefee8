"""Horovod's TensorFlow ``Compression``: compressors with ``compress(tensor) -> (tensor, ctx)``
and ``decompress(tensor, ctx)``, which the collectives also take as ``compression=``.

Passed to a collective (or ``DistributedGradientTape``, ``DistributedOptimizer``), a
compressor names the core's wire compression (:mod:`ddl.engine.compression`, via
``wire_compression``): partial sums travel in half precision on every algorithm. Its
``compress``/``decompress`` methods are Horovod's, for code that calls them itself; the
classes are built from TensorFlow's casts by :mod:`ddl.base.horovod_compressors`, as
``ddl.torch``'s are from torch's.
"""

from __future__ import annotations

import tensorflow as tf
from ddl.base.horovod_compressors import Compressor, HalfCasts, NoneCompressor, half_compressors

__all__ = ["BF16Compressor", "Compression", "Compressor", "FP16Compressor", "NoneCompressor"]

CASTS = HalfCasts(cast=tf.cast, is_floating=lambda dtype: dtype.is_floating, float16=tf.float16,
                  bfloat16=tf.bfloat16)
FP16Compressor, BF16Compressor, Compression = half_compressors(__name__, CASTS)
