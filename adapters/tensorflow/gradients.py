"""One host call that reduces a whole list of gradients: dense ones fused, IndexedSlices gathered."""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

import ddl
from ddl.compression import as_compressor
from ddl.ops import ReduceOp, as_op

from .bridge import host_call

Gradient = tf.Tensor | tf.IndexedSlices | None


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


@tf.autograph.experimental.do_not_convert
def reduce_gradients(grads: Sequence[Gradient], *, name: str, op: Any = ReduceOp.AVERAGE, compression: Any = None,
                     sparse_as_dense: bool = False) -> list[Gradient]:
    """Reduce ``grads`` over all ranks in one call; None entries stay None.

    Dense gradients go into one grouped allreduce (fused by the core into as few
    buffers as their dtypes allow). ``tf.IndexedSlices`` (from ``Embedding`` or
    ``tf.gather``) are allgathered as indices and values — with Average the values are
    divided by the world size — unless ``sparse_as_dense`` densifies them first.
    At one rank nothing is reduced and nothing is copied.
    """
    rop = check_gradient_op(op)
    comp = as_compressor(compression)
    if ddl.size() == 1:
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
    nd, size = len(dense), ddl.size()

    def fn(*arrays: np.ndarray) -> list[np.ndarray]:
        outs = ddl.grouped_allreduce(list(arrays[:nd]), op=rop, name=name, compression=comp) if nd else []
        for k in range(len(sparse)):
            values, indices = arrays[nd + 2 * k], arrays[nd + 2 * k + 1]
            vals = ddl.allgather(values, name=f"{name}.s{k}.values")
            if rop is ReduceOp.AVERAGE:
                vals = np.divide(vals, size, dtype=vals.dtype)
            outs += [vals, ddl.allgather(indices, name=f"{name}.s{k}.indices")]
        return outs

    inputs: list[tf.Tensor] = [t for _, t in dense]
    dtypes: list[tf.DType] = [t.dtype for t in inputs]
    shapes: list[Any] = [t.shape for t in inputs]
    for _, s in sparse:
        inputs += [s.values, tf.cast(s.indices, tf.int64)]
        dtypes += [s.values.dtype, tf.int64]
        shapes += [tf.TensorShape([None]).concatenate(s.values.shape[1:]), tf.TensorShape([None])]
    outs = host_call(fn, inputs, dtypes, shapes, what="gradient reduction")
    result: list[Gradient] = list(grads)
    for (i, _), o in zip(dense, outs[:nd], strict=True):
        result[i] = o
    for k, (i, s) in enumerate(sparse):
        result[i] = tf.IndexedSlices(outs[nd + 2 * k], tf.cast(outs[nd + 2 * k + 1], s.indices.dtype), s.dense_shape)
    return result
