"""The core's collectives on TF tensors, eager and inside ``tf.function`` (static shapes kept)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

import ddl
import tensorflow as tf
from ddl.base.ops import ReduceOp, as_op

from .bridge import graph_name, host_call


def _tensor(x: Any, what: str) -> tf.Tensor:
    if isinstance(x, tf.IndexedSlices):
        raise TypeError(f"ddl.tensorflow.{what} takes dense tensors, got tf.IndexedSlices; "
                        "use tf.convert_to_tensor(x) first or reduce it with DistributedGradientTape")
    try:
        return tf.convert_to_tensor(x)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"ddl.tensorflow.{what} takes a tf.Tensor or tf.Variable, got {type(x).__name__}") from exc


def _raw_allreduce(t: tf.Tensor, op: ReduceOp, name: str | None, compression: Any, algorithm: str | None) -> tf.Tensor:
    def fn(a: np.ndarray) -> list[np.ndarray]:
        return [ddl.allreduce(a, op=op, name=name, compression=compression, algorithm=algorithm)]

    if not tf.executing_eagerly():
        name = graph_name("allreduce", name, t)
    return host_call(fn, [t], [t.dtype], [t.shape], what="allreduce")[0]


def allreduce(tensor: Any, *, op: Any = ReduceOp.AVERAGE, name: str | None = None, compression: Any = None,
              algorithm: str | None = None) -> tf.Tensor:
    """Reduce ``tensor`` over all ranks; the same bits on every rank. Differentiable for Sum/Average.

    Args:
        tensor: a tf.Tensor or tf.Variable of a dtype the core reduces.
        op: ``ddl.Average`` (default), ``Sum``, ``Min``, ``Max`` or ``Product``.
        name: matches the call across ranks; inside ``tf.function`` an unnamed call gets a
            name from a trace-time counter (ranks must trace in the same order).
        compression: ``ddl.Compression.none`` (default), ``.fp16`` or ``.bf16`` on the wire.

    Example:
        >>> ddl.tensorflow.allreduce(tf.ones(3), op=ddl.Sum)  # doctest: +SKIP
    """
    t = _tensor(tensor, "allreduce")
    rop = as_op(op)
    if not tf.executing_eagerly():
        name = graph_name("allreduce", name, t)
    if not t.dtype.is_floating:
        return _raw_allreduce(t, rop, name, compression, algorithm)

    @tf.custom_gradient  # type: ignore[misc,untyped-decorator]
    def differentiable(x: tf.Tensor) -> Any:
        def grad(dy: tf.Tensor) -> tf.Tensor:
            if rop not in (ReduceOp.SUM, ReduceOp.AVERAGE):
                raise ValueError(f"ddl.tensorflow.allreduce with op={rop.name} has no gradient; use Sum or "
                                 "Average, or wrap the input in tf.stop_gradient")
            # d(sum_r x_r)/dx_r = 1: each rank's gradient is the Sum (or Average) of all dy.
            return _raw_allreduce(tf.convert_to_tensor(dy), rop, None if name is None else f"{name}.grad",
                                  compression, None)

        return _raw_allreduce(x, rop, name, compression, algorithm), grad

    return differentiable(t)


def grouped_allreduce(tensors: Sequence[Any], *, op: Any = ReduceOp.AVERAGE, name: str | None = None,
                      compression: Any = None) -> list[tf.Tensor]:
    """Allreduce several tensors in one fused collective (one host call); results in input order."""
    ts = [_tensor(t, "grouped_allreduce") for t in tensors]
    rop = as_op(op)
    if not tf.executing_eagerly():
        name = graph_name("grouped_allreduce", name, *ts)

    def fn(*arrays: np.ndarray) -> list[np.ndarray]:
        return ddl.grouped_allreduce(list(arrays), op=rop, name=name, compression=compression)

    if not ts:
        return []
    return host_call(fn, ts, [t.dtype for t in ts], [t.shape for t in ts], what="grouped_allreduce")


def allgather(tensor: Any, *, name: str | None = None) -> tf.Tensor:
    """Concatenate every rank's ``tensor`` on axis 0 (first dims may differ). Differentiable."""
    t = _tensor(tensor, "allgather")
    if t.shape.rank == 0:
        raise ValueError("ddl.tensorflow.allgather needs a tensor with at least one dimension; wrap a scalar as [x]")
    if not tf.executing_eagerly():
        name = graph_name("allgather", name, t)
    rows_name = None if name is None else f"{name}.rows"

    def fn(a: np.ndarray) -> list[np.ndarray]:
        rows = ddl.allgather(np.array([a.shape[0]], np.int64), name=rows_name)
        start = np.array(rows[: ddl.rank()].sum(), np.int64)
        return [ddl.allgather(a, name=name), start]

    out_shape = tf.TensorShape([None]).concatenate(t.shape[1:])
    if not t.dtype.is_floating:
        return host_call(fn, [t], [t.dtype, tf.int64], [out_shape, []], what="allgather")[0]

    @tf.custom_gradient  # type: ignore[misc,untyped-decorator]
    def differentiable(x: tf.Tensor) -> Any:
        out, start = host_call(fn, [x], [x.dtype, tf.int64], [out_shape, []], what="allgather")

        def grad(dy: tf.Tensor) -> tf.Tensor:
            # Each rank's rows of the output gradient, summed over the ranks that used them.
            total = _raw_allreduce(tf.convert_to_tensor(dy), ReduceOp.SUM,
                                   None if name is None else f"{name}.grad", None, None)
            return total[start : start + tf.shape(x, out_type=tf.int64)[0]]

        return out, grad

    return differentiable(t)


def broadcast(tensor: Any, root_rank: int = 0, *, name: str | None = None) -> tf.Tensor:
    """Return ``root_rank``'s ``tensor`` on every rank."""
    t = _tensor(tensor, "broadcast")
    if not tf.executing_eagerly():
        name = graph_name("broadcast", name, t)

    def fn(a: np.ndarray) -> list[np.ndarray]:
        return [ddl.broadcast(a, root_rank, name=name)]

    return host_call(fn, [t], [t.dtype], [t.shape], what="broadcast")[0]


def reducescatter(tensor: Any, *, op: Any = ReduceOp.SUM, name: str | None = None) -> tf.Tensor:
    """Reduce ``tensor`` and return this rank's rows of axis 0 (the first ranks get extra rows)."""
    t = _tensor(tensor, "reducescatter")
    rop = as_op(op)
    if not tf.executing_eagerly():
        name = graph_name("reducescatter", name, t)

    def fn(a: np.ndarray) -> list[np.ndarray]:
        return [ddl.reducescatter(a, op=rop, name=name)]

    n, p, r = t.shape[0] if t.shape.rank else None, ddl.size(), ddl.rank()
    rows = None if n is None else n // p + (1 if r < n % p else 0)
    shape = tf.TensorShape([rows]).concatenate(t.shape[1:]) if t.shape.rank else t.shape
    return host_call(fn, [t], [t.dtype], [shape], what="reducescatter")[0]
