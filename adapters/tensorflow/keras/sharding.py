"""The exchanges of a sharded Keras optimizer: gradients reduced to their owners, variables gathered back.

Each exchange is one host call (:func:`ddl.tensorflow.bridge.host_call`: direct when
eager, a ``tf.numpy_function`` in ``model.fit``'s graph) over one flat buffer per dtype,
laid out by owner (rank 0's variables, then rank 1's, ...). The gradients go through the
core's reduce-scatter over those segments, the owners' updated values through its
allgather (:mod:`ddl.reduction.segments`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

import tensorflow as tf
from ddl.base.ops import ReduceOp
from ddl.reduction.partition import by_owner, segment_bounds
from ddl.runtime import api

from ..bridge import host_call


@dataclasses.dataclass(frozen=True)
class DtypeLayout:
    """The variables of one dtype in one buffer: their order, offsets and the owners' segments."""

    dtype: np.dtype
    order: tuple[int, ...]
    offsets: dict[int, int]
    bounds: tuple[int, ...]


class Layout:
    """Where each variable's values sit in the exchange buffers (one per dtype, by owner).

    Args:
        sizes: element counts, by variable index.
        dtypes: numpy dtypes, by variable index.
        owners: owning ranks, by variable index.
        world_size: the ranks.

    Example:
        >>> lay = Layout([2, 3, 1], [np.dtype("float32")] * 3, [1, 0, 1], 2)
        >>> lay.by_dtype[0].order, lay.by_dtype[0].bounds
        ((1, 0, 2), (0, 3, 6))
    """

    def __init__(self, sizes: Sequence[int], dtypes: Sequence[np.dtype], owners: Sequence[int], world_size: int) -> None:
        self.sizes = list(sizes)
        by_dtype = []
        for dtype in dict.fromkeys(dtypes):
            order = by_owner([i for i, d in enumerate(dtypes) if d == dtype], owners)
            offsets, at, counts = {}, 0, [0] * world_size
            for i in order:
                offsets[i] = at
                at += sizes[i]
                counts[owners[i]] += sizes[i]
            by_dtype.append(DtypeLayout(dtype, tuple(order), offsets, segment_bounds(counts)))
        self.by_dtype = by_dtype
        self.by_variable = {i: dtype_layout for dtype_layout in by_dtype for i in dtype_layout.order}

    def buffers(self) -> list[np.ndarray]:
        return [np.empty(dtype_layout.bounds[-1], dtype_layout.dtype) for dtype_layout in self.by_dtype]

    def view(self, buffers: list[np.ndarray], i: int) -> np.ndarray:
        """Variable ``i``'s slice of its buffer (flat)."""
        dtype_layout = self.by_variable[i]
        start = dtype_layout.offsets[i]
        return buffers[self.by_dtype.index(dtype_layout)][start : start + self.sizes[i]]


def reduce_to_owners(grads: Sequence[tf.Tensor], owners: Sequence[int], rank: int, world_size: int, *, name: str,
                     op: ReduceOp) -> list[tf.Tensor]:
    """Reduce every rank's ``grads`` (dense, one per variable) so each owner gets its
    variables' sums (``op``: Average or Sum); returns this rank's, in variable order."""
    layout = _layout(grads, owners, world_size)
    mine = [i for i in range(len(grads)) if owners[i] == rank]

    def fn(*arrays: np.ndarray) -> list[np.ndarray]:
        buffers = layout.buffers()
        for i, a in enumerate(arrays):
            layout.view(buffers, i)[...] = a.reshape(-1)
        handles = [api.reduce_segments_async(buf, dtype_layout.bounds, op=op, name=f"{name}.{dtype_layout.dtype.name}")
                   for buf, dtype_layout in zip(buffers, layout.by_dtype, strict=True)]
        for h in handles:
            h.wait()
        return [layout.view(buffers, i).reshape(arrays[i].shape) for i in mine]

    return host_call(fn, list(grads), [grads[i].dtype for i in mine], [grads[i].shape for i in mine],
                     what="sharded gradient reduction")


def gather_from_owners(values: Sequence[tf.Tensor], owners: Sequence[int], rank: int, world_size: int, *,
                       name: str) -> list[tf.Tensor]:
    """Hand every rank its owners' ``values`` (all of the variables, this rank's filled in);
    returns the other ranks' variables' values, in variable order."""
    layout = _layout(values, owners, world_size)
    mine = [i for i in range(len(values)) if owners[i] == rank]
    theirs = [i for i in range(len(values)) if owners[i] != rank]

    def fn(*arrays: np.ndarray) -> list[np.ndarray]:
        buffers = layout.buffers()
        for i, a in zip(mine, arrays, strict=True):
            layout.view(buffers, i)[...] = a.reshape(-1)
        handles = [api.allgather_segments_async(buf, dtype_layout.bounds, name=f"{name}.{dtype_layout.dtype.name}")
                   for buf, dtype_layout in zip(buffers, layout.by_dtype, strict=True)]
        for h in handles:
            h.wait()
        return [layout.view(buffers, i).reshape(tuple(values[i].shape)) for i in theirs]

    return host_call(fn, [values[i] for i in mine], [values[i].dtype for i in theirs],
                     [values[i].shape for i in theirs], what="sharded parameter gather")


def _layout(tensors: Sequence[Any], owners: Sequence[int], world_size: int) -> Layout:
    sizes = [int(np.prod(t.shape, dtype=np.int64)) for t in tensors]
    return Layout(sizes, [np.dtype(t.dtype.as_numpy_dtype) for t in tensors], owners, world_size)


def agree_finite(grads: Sequence[Any], *, name: str) -> list[Any]:
    """``grads``, made non-finite on every rank if any rank's are not finite (one flag per rank,
    reduced): a loss scaler that checks them then skips the step on every rank alike."""
    dense = [tf.convert_to_tensor(g) for g in grads if g is not None]
    finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in dense]) if dense else tf.constant(True)

    def fn(flag: np.ndarray) -> list[np.ndarray]:
        everywhere = api.allreduce(np.asarray([0.0 if flag else 1.0], np.float64), op=ReduceOp.MAX, name=name)
        return [np.asarray(everywhere[0] == 0.0)]

    agreed = host_call(fn, [finite], [tf.bool], [()], what="loss scale agreement")[0]
    nan = tf.cond(agreed, lambda: tf.constant(0.0), lambda: tf.constant(float("nan")))
    return [None if g is None else (tf.convert_to_tensor(g) + tf.cast(nan, tf.convert_to_tensor(g).dtype))
            for g in grads]
