"""Torch tensors to and from the core's numpy buffers, without copies where torch allows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import torch
from ddl.base.dtypes import bfloat16

# torch dtypes the core reduces; anything else can still be broadcast as raw bytes.
_NUMPY_OF: dict[torch.dtype, np.dtype] = {
    torch.float16: np.dtype(np.float16),
    torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64),
    torch.int32: np.dtype(np.int32),
    torch.int64: np.dtype(np.int64),
    torch.uint8: np.dtype(np.uint8),
    torch.int8: np.dtype(np.int8),
    torch.int16: np.dtype(np.int16),
    torch.bool: np.dtype(np.bool_),  # moved (broadcast, allgather, alltoall), never reduced
}


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype the core uses for ``dtype``.

    Raises:
        TypeError: a dtype the core cannot move (complex, ...).
    """
    found = _NUMPY_OF.get(dtype)
    if found is not None:
        return found
    bf16 = bfloat16() if dtype == torch.bfloat16 else None
    if bf16 is not None:
        return bf16
    supported = ", ".join(str(d).replace("torch.", "") for d in [*_NUMPY_OF, torch.bfloat16])
    raise TypeError(f"ddl.torch cannot reduce tensors of {dtype}; supported: {supported} "
                    "(bfloat16 needs ml_dtypes); cast the tensor first")


def host_view(t: torch.Tensor) -> np.ndarray:
    """A numpy array sharing memory with the CPU, contiguous tensor ``t``."""
    if t.dtype == torch.bfloat16:
        bf16 = numpy_dtype(t.dtype)  # raises without ml_dtypes
        return t.detach().view(torch.int16).numpy().view(bf16)
    numpy_dtype(t.dtype)
    out: np.ndarray = t.detach().numpy()
    return out


def from_numpy(a: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """``a`` as a tensor of ``like``'s dtype and device (no copy on CPU)."""
    if like.dtype == torch.bfloat16:
        t = torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(np.ascontiguousarray(a))
    return t if like.device.type == "cpu" else t.to(like.device)


def result_like(a: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """``a`` as a tensor of ``like``'s dtype, device and shape (no copy on CPU). The results
    come back in their input's shape already; a reshape is a dispatcher round trip that
    cost a small allreduce a quarter of its time, so it runs only where shapes differ."""
    t = from_numpy(a, like)
    return t if t.shape == like.shape else t.reshape(like.shape)


def staged(t: torch.Tensor) -> tuple[np.ndarray, Callable[[np.ndarray], None]]:
    """A host array holding ``t``'s values and a function that writes a result back into ``t``.

    CPU contiguous tensors are used in place (the write-back is a no-op when the result
    is that same memory). Other tensors — CUDA ones or non-contiguous views — go through
    one host copy, pinned for CUDA so the copy can use DMA.
    """
    if t.device.type == "cpu" and t.is_contiguous():
        view = host_view(t)

        def back(result: np.ndarray) -> None:
            if result is not view and not np.shares_memory(result, view):  # (an in-place call returns ``view``)
                view[...] = result

        return view, back
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=t.device.type == "cuda")
    host.copy_(t.detach())
    view = host_view(host)

    def back_copy(result: np.ndarray) -> None:
        if not np.shares_memory(result, view):
            view[...] = result
        with torch.no_grad():
            t.copy_(host)

    return view, back_copy


def check_tensor(t: object, what: str) -> torch.Tensor:
    """``t`` if it is a dense tensor; a clear TypeError otherwise."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"ddl.torch.{what} takes a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise TypeError(f"ddl.torch.{what} takes dense tensors, got layout {t.layout}; "
                        "call .to_dense() first")
    return t


def to_cpu(obj: Any) -> Any:
    """``obj`` with every tensor in it (through dicts, lists and tuples) detached and on the CPU,
    as collectives of Python objects and checkpoints send them.

    Example:
        >>> to_cpu({"a": [torch.ones(1)]})
        {'a': [tensor([1.])]}
    """
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj
