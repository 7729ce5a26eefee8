"""Horovod's torch ``Compression``: compressor objects with ``compress(tensor) -> (tensor, ctx)``
and ``decompress(tensor, ctx)``, which the collectives also take as ``compression=``.

Passed to a collective, a compressor names the core's wire compression
(:mod:`ddl.engine.compression`): partial sums travel, and round, in half precision on
every algorithm, Average dividing first. Its ``compress``/``decompress`` methods are
Horovod's, for code that calls them itself; the classes are built from torch's casts by
:mod:`ddl.base.horovod_compressors`, as ``ddl.tensorflow``'s are from TensorFlow's.
"""

from __future__ import annotations

import torch
from ddl.base.horovod_compressors import Compressor, HalfCasts, NoneCompressor, half_compressors

__all__ = ["BF16Compressor", "Compression", "Compressor", "FP16Compressor", "NoneCompressor"]

CASTS = HalfCasts(cast=lambda tensor, dtype: tensor.type(dtype), is_floating=lambda dtype: dtype.is_floating_point,
                  float16=torch.float16, bfloat16=torch.bfloat16)
FP16Compressor, BF16Compressor, Compression = half_compressors(__name__, CASTS)
