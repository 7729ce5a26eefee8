"""Gradient compression as hook objects: what travels, how a bucket is packed into it and unpacked.

Every allreduce bucket goes through one :class:`Compressor` (``Compression.none``
included) in one place, :mod:`ddl.engine.fusion`, whichever algorithm then moves it:
:meth:`Compressor.compress` packs the bucket's tensors into one buffer of the wire dtype
(divided by the world size first for an Average, so a float16 sum of p gradients cannot overflow where the
float32 one would not), the algorithm reduces that buffer, and
:meth:`Compressor.decompress` gives each tensor back in its own dtype. The shape follows
PyTorch DDP's communication hooks; :meth:`Compressor.wire_dtype` is the real wire size,
which the cost model prices.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from ddl.base import kernels
from ddl.base.dtypes import accumulator, bfloat16, is_floating

#: Tensors of at least this many elements (on average) are cast one call each by the kernels.
_KERNEL_ELEMENTS = 4096
_WIRES = {"none": lambda: None, "fp16": lambda: np.dtype(np.float16), "bf16": bfloat16}


@dataclasses.dataclass(frozen=True)
class Compressor:
    """Sends floating-point data as its ``wire`` dtype (None: uncompressed). Integers pass as they are."""

    name: str

    @property
    def wire(self) -> np.dtype | None:
        """The compressed dtype (bf16's comes from ml_dtypes, loaded on first use); None for ``none``."""
        return _WIRES[self.name]()

    def wire_dtype(self, dtype: np.dtype) -> np.dtype:
        """The dtype a bucket of ``dtype`` is sent and reduced in.

        Uncompressed, the engine's one numeric rule: half types accumulate in float32
        (:func:`~ddl.base.dtypes.accumulator`). Compressed, floats wider than the wire
        type travel as it (partial sums rounded to it at each hop, each addition done in
        float32 by numpy); narrower floats and integers travel as they are.
        """
        wire = self.wire
        if wire is None:
            return accumulator(dtype)
        if not is_floating(dtype) or dtype.itemsize <= wire.itemsize:
            return dtype
        return wire

    def compresses(self, dtype: np.dtype) -> bool:
        """Whether ``dtype`` travels narrower than it would uncompressed."""
        return self.wire is not None and self.wire_dtype(dtype).itemsize < accumulator(dtype).itemsize

    def compress(self, arrays: Sequence[np.ndarray], out: np.ndarray, *, divisor: int | None = None) -> None:
        """Pack ``arrays`` (flattened, in order) into ``out`` (of the wire dtype), each
        divided by ``divisor`` first where given (in its own precision, before the cast).

        Large tensors are cast one by one by the installed kernels (:mod:`ddl.base.kernels`:
        torch's under ``ddl.torch``, a memory pass); many small ones, and tensors copied
        without a cast, in one numpy call.
        """
        if divisor is None and (arrays[0].dtype == out.dtype and all(a.dtype == out.dtype for a in arrays)
                                or sum(a.size for a in arrays) < _KERNEL_ELEMENTS * len(arrays)):
            # A plain copy (no cast), or many small tensors: one C loop over every tensor
            # instead of a Python call per tensor (256 tensors cost ~0.25 ms of calls).
            np.concatenate(arrays, axis=None, out=out, casting="unsafe")
            return
        offset = 0
        for a in arrays:
            n = a.size
            src = a.reshape(-1)
            if divisor is None:
                kernels.cast_into(out[offset : offset + n], src)
            else:
                kernels.divide_into(out[offset : offset + n], src, divisor)
            offset += n

    def decompress(self, part: np.ndarray, dtype: np.dtype, *, into: np.ndarray | None = None) -> np.ndarray:
        """One tensor's reduced values back in its own ``dtype`` (a view when they match),
        written into ``into`` (of that dtype and shape) where given."""
        if into is not None:
            kernels.cast_into(into, part)
            return into
        if part.dtype == dtype:
            return part
        out = np.empty(part.shape, dtype)
        kernels.cast_into(out, part)
        return out

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
    """Accept a :class:`Compressor`, None, a name such as ``"fp16"``, or an adapter's
    compressor (Horovod's ``compress``/``decompress`` objects) naming one in ``wire_compression``.

    Raises:
        ValueError: unknown compression, or bf16 without ml_dtypes.
    """
    if value is None:
        return Compression.none
    value = getattr(value, "wire_compression", value)
    if isinstance(value, str) and value in ("none", "fp16", "bf16"):
        value = getattr(Compression, value)
    if isinstance(value, Compressor):
        if value.name == "bf16" and bfloat16() is None:
            raise ValueError("bf16 compression needs the ml_dtypes package: pip install ml_dtypes")
        return value
    raise ValueError(f"unknown compression {value!r}; use ddl.Compression.none, .fp16 or .bf16")
