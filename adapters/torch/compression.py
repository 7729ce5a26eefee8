"""Horovod's torch ``Compression``: compressor objects with ``compress(tensor) -> (tensor, ctx)``
and ``decompress(tensor, ctx)``, which the collectives also take as ``compression=``.

Passed to a collective, a compressor names the core's wire compression
(:mod:`ddl.engine.compression`): partial sums travel, and round, in half precision on
every algorithm, Average dividing first. Its ``compress``/``decompress`` methods are
Horovod's, for code that calls them itself.
"""

from __future__ import annotations

from typing import Any

import torch


class Compressor:
    """Horovod's compressor interface (the identity)."""

    wire_compression = "none"

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """The tensor to send, and what :meth:`decompress` needs."""
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """The received tensor, as the original."""
        return tensor


class NoneCompressor(Compressor):
    """No compression."""


class _HalfCompressor(Compressor):
    half: torch.dtype = torch.float16

    @classmethod
    def compress(cls, tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:  # type: ignore[override]
        """Floating tensors cast down to the half type; others unchanged."""
        dtype = tensor.dtype
        return (tensor.type(cls.half) if dtype.is_floating_point else tensor), dtype

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """Cast back to the original dtype."""
        return tensor.type(ctx) if ctx is not None and ctx.is_floating_point else tensor


class FP16Compressor(_HalfCompressor):
    """float16 on the wire."""

    wire_compression = "fp16"


class BF16Compressor(_HalfCompressor):
    """bfloat16 on the wire (ddl's addition; the core needs ml_dtypes)."""

    wire_compression = "bf16"
    half = torch.bfloat16


class Compression:
    """``Compression.none``, ``Compression.fp16`` (Horovod's) and ``Compression.bf16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
