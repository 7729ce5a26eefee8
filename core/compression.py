"""Gradient compression on the wire: cast before the allreduce, cast back after."""

from __future__ import annotations

import dataclasses

import numpy as np

from ddl.dtypes import bfloat16, is_floating

_WIRES = {"none": lambda: None, "fp16": lambda: np.dtype(np.float16), "bf16": bfloat16}


@dataclasses.dataclass(frozen=True)
class Compressor:
    """Sends floating-point data as its ``wire`` dtype (None: unchanged). Integers pass as they are."""

    name: str

    @property
    def wire(self) -> np.dtype | None:
        """The dtype on the wire (bf16's comes from ml_dtypes, loaded on first use)."""
        return _WIRES[self.name]()

    def wire_dtype(self, dtype: np.dtype) -> np.dtype:
        """The dtype ``dtype`` travels as."""
        if self.wire is None or not is_floating(dtype) or dtype.itemsize <= self.wire.itemsize:
            return dtype
        return self.wire

    def __repr__(self) -> str:
        return f"ddl.Compression.{self.name}"

    def __reduce__(self) -> tuple[object, tuple[str]]:
        # Unpickle to the shared instance, so `is ddl.Compression.fp16` still holds.
        return as_compressor, (self.name,)


class Compression:
    """The compressors: ``none``, ``fp16`` and (with ml_dtypes) ``bf16``.

    With ``op=ddl.Average`` each rank divides by the world size *before* casting down,
    so a float16 sum of p realistic gradients cannot overflow where the float32 one
    would not.
    """

    none = Compressor("none")
    fp16 = Compressor("fp16")
    bf16 = Compressor("bf16")


def as_compressor(value: object) -> Compressor:
    """Accept a :class:`Compressor`, None, or a name such as ``"fp16"``.

    Raises:
        ValueError: unknown compression, or bf16 without ml_dtypes.
    """
    if value is None:
        return Compression.none
    if isinstance(value, str) and value in ("none", "fp16", "bf16"):
        value = getattr(Compression, value)
    if isinstance(value, Compressor):
        if value.name == "bf16" and bfloat16() is None:
            raise ValueError("bf16 compression needs the ml_dtypes package: pip install ml_dtypes")
        return value
    raise ValueError(f"unknown compression {value!r}; use ddl.Compression.none, .fp16 or .bf16")
