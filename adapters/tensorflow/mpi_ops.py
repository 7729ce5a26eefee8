"""Horovod's ``horovod.tensorflow`` collectives with Horovod's signatures, eager and in ``tf.function``.

``device_dense``, ``device_sparse`` and ``ignore_name_scope`` are accepted for the
signatures (ddl's collectives run on the host); everything else is Horovod's meaning.
Sum and Average allreduces, allgathers, broadcasts, alltoalls and reducescatters of
float tensors are differentiable, with Horovod's gradients.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

import ddl
import tensorflow as tf
from ddl.base.ops import ReduceOp, as_op, op_from_average
from ddl.runtime import api
from ddl.runtime.process_sets import ProcessSet, global_process_set

from .bridge import graph_name, host_call, nothing_records


def _ps(process_set: ProcessSet | None) -> ProcessSet | None:
    return None if process_set is None or process_set.process_set_id == 0 else process_set


def _size(process_set: ProcessSet | None) -> int:
    return ddl.size() if process_set is None else int(process_set.size() or 0)


def _rank(process_set: ProcessSet | None) -> int:
    return ddl.rank() if process_set is None else int(process_set.rank() or 0)


def _tensor(x: Any, what: str) -> tf.Tensor:
    try:
        return tf.convert_to_tensor(x)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"ddl.tensorflow.{what} takes a tf.Tensor or tf.Variable, got {type(x).__name__}") from exc


def _name(kind: str, name: str | None, *ts: Any) -> str | None:
    return name if tf.executing_eagerly() else graph_name(kind, name, *ts)


def _grad_name(name: str | None) -> str | None:
    # A gradient traced into a graph needs a name as its forward does; eager ones match by order.
    return None if name is None else f"{name}.grad"


def _raw_allreduce(t: tf.Tensor, op: ReduceOp, name: str | None, compression: Any, pre: float, post: float,
                   ps: ProcessSet | None) -> tf.Tensor:
    def fn(a: np.ndarray) -> list[np.ndarray]:
        return [api.allreduce(a, op=op, name=name, compression=compression, prescale_factor=pre,
                              postscale_factor=post, process_set=ps)]

    return host_call(fn, [t], [t.dtype], [t.shape], what="allreduce")[0]


def allreduce(tensor: Any, average: bool | None = None, device_dense: str = "", device_sparse: str = "",
              compression: Any = None, op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              name: str | None = None, process_set: ProcessSet = global_process_set,
              ignore_name_scope: bool = False) -> Any:
    """Reduce ``tensor`` over all ranks (of ``process_set``); the same bits on every rank.

    ``tf.IndexedSlices`` are allgathered (values and indices; an Average divides the
    values), as Horovod does. Differentiable for Sum and Average.

    Example:
        >>> hvd.allreduce(tf.ones(3), op=hvd.Sum)  # doctest: +SKIP
    """
    rop = as_op(op_from_average(op, average))
    ps = _ps(process_set)
    if isinstance(tensor, tf.IndexedSlices):
        _check_indexed_slices(rop, prescale_factor, postscale_factor)
        values = allgather(tensor.values, name=None if name is None else f"{name}.values", process_set=process_set)
        indices = allgather(tensor.indices, name=None if name is None else f"{name}.indices", process_set=process_set)
        if rop is ReduceOp.AVERAGE:
            values = values / tf.cast(_size(ps), values.dtype)
        return tf.IndexedSlices(values, indices, tensor.dense_shape)
    t = _tensor(tensor, "allreduce")
    name = _name("allreduce", name, t)
    if not t.dtype.is_floating or nothing_records():
        return _raw_allreduce(t, rop, name, compression, prescale_factor, postscale_factor, ps)

    @tf.custom_gradient  # type: ignore[misc,untyped-decorator]
    def differentiable(x: tf.Tensor) -> Any:
        def grad(dy: tf.Tensor) -> tf.Tensor:
            if rop not in (ReduceOp.SUM, ReduceOp.AVERAGE):
                raise ValueError(f"ddl.tensorflow.allreduce with op={rop.name} has no gradient; use Sum or "
                                 "Average, or wrap the input in tf.stop_gradient")
            return _raw_allreduce(tf.convert_to_tensor(dy), rop, _grad_name(name), compression, prescale_factor,
                                  postscale_factor, ps)

        return _raw_allreduce(x, rop, name, compression, prescale_factor, postscale_factor, ps), grad

    return differentiable(t)


def _check_indexed_slices(rop: ReduceOp, prescale_factor: float, postscale_factor: float) -> None:
    """Refuse what an allgather of rows cannot do, with Horovod's class (NotImplementedError)."""
    if rop is ReduceOp.ADASUM:
        raise NotImplementedError("ddl.Adasum cannot reduce tf.IndexedSlices; pass sparse_as_dense=True to the "
                                  "optimizer or tape, or convert them with tf.convert_to_tensor first")
    if rop not in (ReduceOp.SUM, ReduceOp.AVERAGE):
        raise NotImplementedError(f"tf.IndexedSlices reduce with ddl.Sum or ddl.Average only, got ddl.{rop.name.title()}; "
                                  "convert them with tf.convert_to_tensor to reduce them densely")
    if prescale_factor != 1.0 or postscale_factor != 1.0:
        raise NotImplementedError(f"prescale_factor and postscale_factor must be 1 for tf.IndexedSlices, got "
                                  f"{prescale_factor} and {postscale_factor}; scale the values yourself")


def grouped_allreduce(tensors: Sequence[Any], average: bool | None = None, device_dense: str = "",
                      device_sparse: str = "", compression: Any = None, op: Any = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, process_set: ProcessSet = global_process_set,
                      ignore_name_scope: bool = False, name: str | None = None) -> list[Any]:
    """Allreduce several tensors in one fused collective (one host call); results in input order."""
    rop = as_op(op_from_average(op, average))
    ps = _ps(process_set)
    if any(isinstance(t, tf.IndexedSlices) for t in tensors):
        _check_indexed_slices(rop, prescale_factor, postscale_factor)  # before any dense tensor is reduced
        return [allreduce(t, None, "", "", compression, rop, prescale_factor, postscale_factor,
                          None if name is None else f"{name}.{i}", process_set) for i, t in enumerate(tensors)]
    ts = [_tensor(t, "grouped_allreduce") for t in tensors]
    if not ts:
        return []
    name = _name("grouped_allreduce", name, *ts)

    def raw(xs: Sequence[tf.Tensor], nm: str | None) -> list[tf.Tensor]:
        def fn(*arrays: np.ndarray) -> list[np.ndarray]:
            return api.grouped_allreduce(list(arrays), op=rop, name=nm, compression=compression,
                                         prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                         process_set=ps)

        return host_call(fn, xs, [x.dtype for x in xs], [x.shape for x in xs], what="grouped_allreduce")

    if not all(t.dtype.is_floating for t in ts) or rop not in (ReduceOp.SUM, ReduceOp.AVERAGE) or nothing_records():
        return raw(ts, name)

    @tf.custom_gradient  # type: ignore[misc,untyped-decorator]
    def differentiable(*xs: tf.Tensor) -> Any:
        def grad(*dys: tf.Tensor) -> list[tf.Tensor]:
            return raw([tf.convert_to_tensor(d) for d in dys], _grad_name(name))

        return raw(list(xs), name), grad

    return list(differentiable(*ts))


def _raw_allgather(t: tf.Tensor, name: str | None, ps: ProcessSet | None) -> tuple[tf.Tensor, tf.Tensor]:
    rows_name = None if name is None else f"{name}.rows"
    me = _rank(ps)

    def fn(a: np.ndarray) -> list[np.ndarray]:
        rows = api.allgather(np.array([a.shape[0]], np.int64), name=rows_name, process_set=ps)
        return [api.allgather(a, name=name, process_set=ps), np.array(rows[:me].sum(), np.int64)]

    out_shape = tf.TensorShape([None]).concatenate(t.shape[1:])
    out, start = host_call(fn, [t], [t.dtype, tf.int64], [out_shape, []], what="allgather")
    return out, start


def allgather(tensor: Any, name: str | None = None, ignore_name_scope: bool = False,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Concatenate every rank's ``tensor`` on axis 0 (first dims may differ). Differentiable."""
    t = _tensor(tensor, "allgather")
    if t.shape.rank == 0:
        raise ValueError("ddl.tensorflow.allgather needs a tensor with at least one dimension; wrap a scalar as [x]")
    name, ps = _name("allgather", name, t), _ps(process_set)
    if not t.dtype.is_floating or nothing_records():
        return _raw_allgather(t, name, ps)[0]

    @tf.custom_gradient  # type: ignore[misc,untyped-decorator]
    def differentiable(x: tf.Tensor) -> Any:
        out, start = _raw_allgather(x, name, ps)

        def grad(dy: tf.Tensor) -> tf.Tensor:
            # Horovod's convention: the ranks' output gradients are averaged, then sliced.
            mean = _raw_allreduce(tf.convert_to_tensor(dy), ReduceOp.AVERAGE, _grad_name(name), None, 1.0, 1.0, ps)
            return mean[start : start + tf.shape(x, out_type=tf.int64)[0]]

        return out, grad

    return differentiable(t)


def grouped_allgather(tensors: Sequence[Any], name: str | None = None, ignore_name_scope: bool = False,
                      process_set: ProcessSet = global_process_set) -> list[tf.Tensor]:
    """Allgather each tensor; results in input order."""
    return [allgather(t, None if name is None else f"{name}.{i}", process_set=process_set)
            for i, t in enumerate(tensors)]


def broadcast(tensor: Any, root_rank: int = 0, name: str | None = None, ignore_name_scope: bool = False,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Return ``root_rank``'s ``tensor`` on every rank (a world rank, also with a process set).
    Differentiable: the root gets the averaged gradient, the others zeros."""
    t = _tensor(tensor, "broadcast")
    name, ps = _name("broadcast", name, t), _ps(process_set)

    def raw(x: tf.Tensor) -> tf.Tensor:
        def fn(a: np.ndarray) -> list[np.ndarray]:
            return [api.broadcast(a, root_rank, name=name, process_set=ps)]

        return host_call(fn, [x], [x.dtype], [x.shape], what="broadcast")[0]

    if not t.dtype.is_floating or nothing_records():
        return raw(t)

    @tf.custom_gradient  # type: ignore[misc,untyped-decorator]
    def differentiable(x: tf.Tensor) -> Any:
        def grad(dy: tf.Tensor) -> tf.Tensor:
            g = _raw_allreduce(tf.convert_to_tensor(dy), ReduceOp.AVERAGE, _grad_name(name), None, 1.0, 1.0, ps)
            return g if ddl.rank() == root_rank else g * 0

        return raw(x), grad

    return differentiable(t)


def broadcast_(variables: Any, root_rank: int = 0, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> list[tf.Tensor]:
    """Overwrite each variable with ``root_rank``'s value in place; return their new values
    (in a TF 1 graph: tensors whose evaluation runs the broadcast and the assignments)."""
    from .tape import broadcast_into

    return broadcast_into(list(tf.nest.flatten(variables)), root_rank, process_set=process_set, name=name)


def alltoall(tensor: Any, splits: Any = None, name: str | None = None, ignore_name_scope: bool = False,
             process_set: ProcessSet = global_process_set) -> Any:
    """Send rows ``splits[r]`` of ``tensor`` (axis 0; equal parts when None) to rank r.

    Returns the rows received in rank order; with ``splits`` given, also the rows received
    from each rank (Horovod's convention). Differentiable for float tensors.
    """
    t = _tensor(tensor, "alltoall")
    name, ps = _name("alltoall", name, t), _ps(process_set)
    sp = None if splits is None else tf.cast(tf.convert_to_tensor(splits), tf.int32)
    out_shape = tf.TensorShape([None]).concatenate(t.shape[1:])

    def raw(x: tf.Tensor, s: tf.Tensor | None, nm: str | None) -> tuple[tf.Tensor, tf.Tensor]:
        def fn(a: np.ndarray, *rest: np.ndarray) -> list[np.ndarray]:
            parts = [int(n) for n in rest[0]] if rest else None
            out, received = api.alltoall(a, parts, name=nm, process_set=ps)
            return [out, np.array(received, np.int32)]

        inputs = [x] if s is None else [x, s]
        out, received = host_call(fn, inputs, [x.dtype, tf.int32], [out_shape, [None]], what="alltoall")
        return out, received

    if t.dtype.is_floating and not nothing_records():
        @tf.custom_gradient  # type: ignore[misc,untyped-decorator]
        def differentiable(x: tf.Tensor) -> Any:
            out, received = raw(x, sp, name)

            def grad(dy: tf.Tensor, *_: Any) -> tf.Tensor:
                return raw(tf.convert_to_tensor(dy), received, _grad_name(name))[0]

            return (out, received), grad

        out, received = differentiable(t)
    else:
        out, received = raw(t, sp, name)
    return (out, received) if splits is not None else out


def _raw_reducescatter(t: tf.Tensor, rop: ReduceOp, name: str | None, ps: ProcessSet | None, pre: float,
                       post: float) -> tf.Tensor:
    def fn(a: np.ndarray) -> list[np.ndarray]:
        return [api.reducescatter(a, op=rop, name=name, prescale_factor=pre, postscale_factor=post, process_set=ps)]

    n, p, r = t.shape[0] if t.shape.rank else None, _size(ps), _rank(ps)
    rows = None if n is None else n // p + (1 if r < n % p else 0)
    shape = tf.TensorShape([rows]).concatenate(t.shape[1:]) if t.shape.rank else t.shape
    return host_call(fn, [t], [t.dtype], [shape], what="reducescatter")[0]


def reducescatter(tensor: Any, device_dense: str = "", compression: Any = None, op: Any = ReduceOp.AVERAGE,
                  name: str | None = None, process_set: ProcessSet = global_process_set,
                  ignore_name_scope: bool = False, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> tf.Tensor:
    """Reduce ``tensor`` (Average by default, as Horovod) and return this rank's rows of axis 0
    (the first ranks get extra rows). Differentiable for Sum and Average."""
    t = _tensor(tensor, "reducescatter")
    rop, ps = as_op(op), _ps(process_set)
    name = _name("reducescatter", name, t)
    if not t.dtype.is_floating or rop not in (ReduceOp.SUM, ReduceOp.AVERAGE) or nothing_records():
        return _raw_reducescatter(t, rop, name, ps, prescale_factor, postscale_factor)

    @tf.custom_gradient  # type: ignore[misc,untyped-decorator]
    def differentiable(x: tf.Tensor) -> Any:
        def grad(dy: tf.Tensor) -> tf.Tensor:
            # Horovod's convention: the gathered gradient times the scale factors, times the
            # number of ranks for a Sum (and not divided by it for an Average).
            full = _raw_allgather(tf.convert_to_tensor(dy), _grad_name(name), ps)[0]
            scale = prescale_factor * postscale_factor * (_size(ps) if rop is ReduceOp.SUM else 1)
            return full if scale == 1.0 else full * tf.cast(scale, full.dtype)

        return _raw_reducescatter(x, rop, name, ps, prescale_factor, postscale_factor), grad

    return differentiable(t)


def grouped_reducescatter(tensors: Sequence[Any], device_dense: str = "", compression: Any = None,
                          op: Any = ReduceOp.AVERAGE, process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> list[tf.Tensor]:
    """Reduce-scatter each tensor; results in input order."""
    return [reducescatter(t, op=op, process_set=process_set, prescale_factor=prescale_factor,
                          postscale_factor=postscale_factor) for t in tensors]


def join() -> tf.Tensor:
    """This rank has run out of data: the others' allreduces go on with zeros from here
    until every rank joins. Returns the last rank to join (an int32 scalar tensor)."""
    def fn() -> list[np.ndarray]:
        return [np.array(api.join(), np.int32)]

    return host_call(fn, [], [tf.int32], [[]], what="join")[0]


def size_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    """The number of ranks (of the process set), as an int32 tensor."""
    return tf.constant(ddl.size() if process_set_id == 0 else _set_size(process_set_id), tf.int32)


def local_size_op(name: str | None = None) -> tf.Tensor:
    """The number of ranks on this host, as an int32 tensor."""
    return tf.constant(ddl.local_size(), tf.int32)


def rank_op(name: str | None = None) -> tf.Tensor:
    """This rank, as an int32 tensor."""
    return tf.constant(ddl.rank(), tf.int32)


def local_rank_op(name: str | None = None) -> tf.Tensor:
    """This rank on its host, as an int32 tensor."""
    return tf.constant(ddl.local_rank(), tf.int32)


def process_set_included_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    """1 if this rank is in the process set, else 0 (int32 tensor)."""
    from ddl.runtime import process_sets

    ranks = process_sets._ranks.get(process_set_id, tuple(range(ddl.size())) if process_set_id == 0 else ())
    return tf.constant(int(ddl.rank() in ranks), tf.int32)


def _set_size(process_set_id: int) -> int:
    from ddl.runtime import process_sets

    return len(process_sets._ranks.get(process_set_id, ()))


def check_num_rank_power_of_2(num_rank: int) -> bool:
    """Whether ``num_rank`` is a power of two (Horovod's helper for Adasum)."""
    return num_rank > 0 and num_rank & (num_rank - 1) == 0


def handle_average_backwards_compatibility(op: Any, average: bool | None) -> Any:
    """Horovod's rule for ``average=`` beside ``op=`` (see :func:`ddl.base.ops.op_from_average`)."""
    return op_from_average(op, average)


def vars_to_refs(vars: Any) -> Any:
    """Variables as hashable references (nested lists become tuples)."""
    if isinstance(vars, list):
        return tuple(vars_to_refs(v) for v in vars)
    return vars.ref()


def refs_to_vars(refs: Any) -> Any:
    """The inverse of :func:`vars_to_refs`."""
    if isinstance(refs, tuple):
        return [refs_to_vars(r) for r in refs]
    return refs.deref()
