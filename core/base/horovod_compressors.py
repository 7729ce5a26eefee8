"""Horovod's compressor classes (``Compression.none``, ``.fp16``, ``.bf16``), built once for any framework from its casts.

Horovod's ``hvd.Compression`` is a namespace of classes whose static ``compress(tensor)
-> (tensor, ctx)`` and ``decompress(tensor, ctx)`` cast floating tensors down to a half
type and back. Only the cast, the floating test and the two half dtypes differ between
frameworks: an adapter gives them as :class:`HalfCasts`, and :func:`half_compressors`
returns its ``FP16Compressor``, ``BF16Compressor`` and ``Compression``, named as the
adapter's own (so they pickle by reference). Passed to a collective, a compressor names
the core's wire compression through ``wire_compression`` (:func:`ddl.engine.compression.as_compressor`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar


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


@dataclasses.dataclass(frozen=True)
class HalfCasts:
    """What a framework lends the half compressors.

    Example:
        >>> HalfCasts(cast=tf.cast, is_floating=lambda d: d.is_floating, float16=tf.float16,
        ...           bfloat16=tf.bfloat16)  # doctest: +SKIP
    """

    #: ``(tensor, dtype) -> tensor`` in that dtype.
    cast: Callable[[Any, Any], Any]
    #: Whether a tensor's ``dtype`` is a floating-point one (only those are cast).
    is_floating: Callable[[Any], bool]
    float16: Any
    bfloat16: Any


class HalfCompressor(Compressor):
    """Floating tensors travel as :attr:`half` (cast with the framework's :attr:`casts`); others as they are."""

    casts: ClassVar[HalfCasts]
    half: ClassVar[Any]

    @classmethod
    def compress(cls, tensor: Any) -> tuple[Any, Any]:  # type: ignore[override]
        """Floating tensors cast down to the half type; others unchanged. The context is the original dtype."""
        dtype = tensor.dtype
        return (cls.casts.cast(tensor, cls.half) if cls.casts.is_floating(dtype) else tensor), dtype

    @classmethod
    def decompress(cls, tensor: Any, ctx: Any) -> Any:  # type: ignore[override]
        """Cast back to the original dtype."""
        return cls.casts.cast(tensor, ctx) if ctx is not None and cls.casts.is_floating(ctx) else tensor


class Compression:
    """``Compression.none``, ``Compression.fp16`` (Horovod's) and ``Compression.bf16`` (ddl's addition)."""

    none: ClassVar[type[Compressor]] = NoneCompressor
    fp16: ClassVar[type[HalfCompressor]]
    bf16: ClassVar[type[HalfCompressor]]


_DOCS = {"fp16": "float16 on the wire.", "bf16": "bfloat16 on the wire (ddl's addition; the core needs ml_dtypes)."}


def half_compressors(module: str, casts: HalfCasts) -> tuple[type[HalfCompressor], type[HalfCompressor],
                                                             type[Compression]]:
    """One framework's ``FP16Compressor``, ``BF16Compressor`` and ``Compression`` namespace.

    Args:
        module: the adapter module that exposes the three under these names (``__name__``),
            so they print and pickle as its own.
        casts: the framework's cast, floating test and half dtypes.

    Example:
        >>> FP16Compressor, BF16Compressor, Compression = half_compressors(__name__, CASTS)  # doctest: +SKIP
        >>> Compression.fp16.compress(t)  # doctest: +SKIP
    """
    made: dict[str, Any] = {}
    for name, wire, half in (("FP16Compressor", "fp16", casts.float16), ("BF16Compressor", "bf16", casts.bfloat16)):
        made[wire] = type(name, (HalfCompressor,), {"wire_compression": wire, "casts": casts, "half": half,
                                                    "__doc__": _DOCS[wire], "__module__": module})
    namespace = type("Compression", (Compression,), {**made, "__doc__": Compression.__doc__, "__module__": module})
    return made["fp16"], made["bf16"], namespace
