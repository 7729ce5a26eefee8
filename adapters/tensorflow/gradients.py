"""One host call that reduces a whole list of gradients: dense ones fused, IndexedSlices gathered."""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

import ddl
import tensorflow as tf
from ddl.base.ops import ReduceOp, as_op
from ddl.engine.compression import as_compressor
from ddl.runtime import api

from .bridge import host_call
from .hook_reducer import HookedReducer

Gradient = Any  # a tf.Tensor, a tf.IndexedSlices or None


def check_gradient_op(op: Any) -> ReduceOp:
    """``op`` as a ReduceOp if it is Average or Sum (the only ones that make sense for gradients)."""
    rop = as_op(op)
    if rop not in (ReduceOp.AVERAGE, ReduceOp.SUM):
        raise ValueError(f"gradients are reduced with ddl.Average or ddl.Sum, got ddl.{rop.name.title()}")
    return rop


def name_for(variables: Sequence[Any], prefix: str) -> str:
    """A name for one grouped reduction, the same on every rank that has the same variables.

    Built from shapes and dtypes only: Keras makes layer and variable names unique per
    process, so a rank that built an extra model would otherwise disagree.
    """
    parts = [f"{tuple(v.shape)}:{getattr(v.dtype, 'name', v.dtype)}" for v in variables]
    return f"{prefix}.{zlib.crc32('|'.join(parts).encode()):08x}"


_ALIGN = 64  # TensorFlow adopts a returned numpy array without a copy when its data is 64-byte aligned


def fused_allreduce(arrays: Sequence[np.ndarray], *, op: ReduceOp, name: str, compression: Any,
                    process_set: Any = None) -> list[np.ndarray]:
    """Allreduce ``arrays`` packed into one 64-byte-aligned buffer per dtype; views of it come back.

    The packing is the copy the core's fusion would make anyway; because every view
    starts on a 64-byte boundary, ``tf.numpy_function`` hands the results to TensorFlow
    without copying them out again.
    """
    outs: list[np.ndarray] = [np.empty(0)] * len(arrays)
    groups: dict[np.dtype, list[int]] = {}
    for i, a in enumerate(arrays):
        groups.setdefault(a.dtype, []).append(i)
    for dtype, idx in groups.items():
        starts, total = [], 0
        for i in idx:
            starts.append(total // dtype.itemsize)
            total += -(-arrays[i].nbytes // _ALIGN) * _ALIGN
        raw = np.empty(total + _ALIGN, np.uint8)
        skip = (-raw.ctypes.data) % _ALIGN
        buf = raw[skip : skip + total].view(dtype)
        for i, start, end in zip(idx, starts, [*starts[1:], buf.size], strict=True):
            buf[start : start + arrays[i].size] = arrays[i].reshape(-1)
            buf[start + arrays[i].size : end] = 0  # padding, reduced along with the data
        if buf.size:
            api.allreduce_(buf, op=op, name=f"{name}.{dtype.name}", compression=compression, process_set=process_set)
        for i, start in zip(idx, starts, strict=True):
            outs[i] = buf[start : start + arrays[i].size].reshape(arrays[i].shape)
    return outs


@tf.autograph.experimental.do_not_convert  # type: ignore[misc,untyped-decorator]
def reduce_gradients(grads: Sequence[Gradient], *, name: str, op: Any = ReduceOp.AVERAGE, compression: Any = None,
                     sparse_as_dense: bool = False, process_set: Any = None, loss_scale: Any = None) -> list[Gradient]:
    """Reduce ``grads`` over all ranks in one call; None entries stay None.

    Dense gradients are packed into one buffer per dtype and reduced in place
    (:func:`fused_allreduce`). ``tf.IndexedSlices`` (from ``Embedding`` or
    ``tf.gather``) are allgathered as indices and values — with Average the values are
    divided by the world size — unless ``sparse_as_dense`` densifies them first.
    At one rank nothing is reduced and nothing is copied — unless ``compression`` is a
    :class:`~ddl.tensorflow.hook_reducer.HookedReducer` (a stateful hook such as PowerSGD), which
    changes the values at any size: the dense gradients then go through its hook, told the
    ``loss_scale`` they carry (a loss scaler's current scale, a scalar tensor) if given.
    """
    rop = check_gradient_op(op)
    hooked = compression if isinstance(compression, HookedReducer) else None
    comp = as_compressor(None if hooked is not None else compression)
    size = ddl.size() if process_set is None else int(process_set.size() or 1)
    if size == 1 and hooked is None:
        return [tf.convert_to_tensor(g) if sparse_as_dense and isinstance(g, tf.IndexedSlices) else g for g in grads]
    dense: list[tuple[int, tf.Tensor]] = []
    sparse: list[tuple[int, tf.IndexedSlices]] = []
    for i, g in enumerate(grads):
        if g is None:
            continue
        if isinstance(g, tf.IndexedSlices):
            if sparse_as_dense:
                dense.append((i, tf.convert_to_tensor(g)))
            else:
                sparse.append((i, g))
        else:
            dense.append((i, tf.convert_to_tensor(g)))
    nd = len(dense)
    scaled = hooked is not None and loss_scale is not None

    def fn(*arrays: np.ndarray) -> list[np.ndarray]:
        if hooked is not None:
            scale = float(arrays[-1]) if scaled else None
            outs = hooked.reduce(arrays[:nd], name=name, op=rop, process_set=process_set, loss_scale=scale) if nd else []
        else:
            outs = fused_allreduce(arrays[:nd], op=rop, name=name, compression=comp, process_set=process_set)
        for k in range(len(sparse)):
            values, indices = arrays[nd + 2 * k], arrays[nd + 2 * k + 1]
            vals = api.allgather(values, name=f"{name}.s{k}.values", process_set=process_set)
            if rop is ReduceOp.AVERAGE:
                vals = np.divide(vals, size, dtype=vals.dtype)
            outs += [vals, api.allgather(indices, name=f"{name}.s{k}.indices", process_set=process_set)]
        return outs

    inputs: list[tf.Tensor] = [t for _, t in dense]
    dtypes: list[tf.DType] = [t.dtype for t in inputs]
    shapes: list[Any] = [t.shape for t in inputs]
    for _, s in sparse:
        inputs += [s.values, tf.cast(s.indices, tf.int64)]
        dtypes += [s.values.dtype, tf.int64]
        shapes += [tf.TensorShape([None]).concatenate(s.values.shape[1:]), tf.TensorShape([None])]
    if scaled:
        inputs.append(tf.cast(tf.convert_to_tensor(loss_scale), tf.float64))
    outs = host_call(fn, inputs, dtypes, shapes, what="gradient reduction")
    result: list[Gradient] = list(grads)
    for (i, _), o in zip(dense, outs[:nd], strict=True):
        result[i] = o
    for k, (i, s) in enumerate(sparse):
        result[i] = tf.IndexedSlices(outs[nd + 2 * k], tf.cast(outs[nd + 2 * k + 1], s.indices.dtype), s.dense_shape)
    return result
