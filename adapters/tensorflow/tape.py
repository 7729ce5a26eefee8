"""DistributedGradientTape and broadcast_variables."""

from __future__ import annotations

from typing import Any

import numpy as np

import ddl
import tensorflow as tf
from ddl.base.ops import ReduceOp
from ddl.runtime import api

from .bridge import host_call
from .gradients import check_gradient_op, name_for, reduce_gradients
from .hook_reducer import as_reduction


class DistributedGradientTape:
    """Wraps a ``tf.GradientTape`` so ``gradient()`` returns gradients reduced over all ranks.

    All gradients of one ``gradient()`` call are reduced together, in one fused call
    (eager, or one ``tf.numpy_function`` op in a ``tf.function``). Everything else is
    the wrapped tape's.

    Args:
        tape: the ``tf.GradientTape`` that recorded the forward pass.
        op: ``ddl.Average`` (default) or ``ddl.Sum``.
        compression: ``ddl.Compression.none`` (default), ``.fp16`` or ``.bf16`` on the wire.
        sparse_as_dense: reduce ``tf.IndexedSlices`` as dense tensors instead of gathering them.

    Example:
        >>> with tf.GradientTape() as tape:                       # doctest: +SKIP
        ...     loss = loss_fn(y, model(x))
        >>> tape = ddl.tensorflow.DistributedGradientTape(tape)   # doctest: +SKIP
        >>> grads = tape.gradient(loss, model.trainable_variables)  # doctest: +SKIP
    """

    def __init__(self, gradtape: tf.GradientTape, device_dense: str = "", device_sparse: str = "",
                 compression: Any = None, sparse_as_dense: bool = False, op: Any = ReduceOp.AVERAGE,
                 gradient_predivide_factor: float = 1.0, num_groups: int = 0, groups: Any = None,
                 process_set: Any = None, scale_local_gradients: bool = True) -> None:
        if not isinstance(gradtape, tf.GradientTape):
            raise TypeError(f"DistributedGradientTape wraps a tf.GradientTape, got {type(gradtape).__name__}")
        self._tape = gradtape
        self._op = check_gradient_op(op)
        self._compression = as_reduction(compression)  # a stateful hook keeps its state with the tape
        self._sparse_as_dense = bool(sparse_as_dense)
        self._process_set = None if process_set is None or process_set.process_set_id == 0 else process_set
        self._local: set[Any] = set()
        self._scale_local = scale_local_gradients

    @tf.autograph.experimental.do_not_convert  # type: ignore[misc,untyped-decorator]
    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 unconnected_gradients: Any = tf.UnconnectedGradients.NONE) -> Any:
        """The wrapped tape's gradients, reduced over all ranks (same structure as ``sources``)."""
        grads = self._tape.gradient(target, sources, output_gradients=output_gradients,
                                    unconnected_gradients=unconnected_gradients)
        flat_sources = tf.nest.flatten(sources)
        flat = tf.nest.flatten(grads)
        local = [i for i, v in enumerate(flat_sources) if _ref(v) in self._local]
        shared = [i for i in range(len(flat)) if i not in local]
        reduced = list(flat)
        if shared:
            outs = reduce_gradients([flat[i] for i in shared], name=name_for([flat_sources[i] for i in shared],
                                                                             "ddl.tape"),
                                    op=self._op, compression=self._compression, sparse_as_dense=self._sparse_as_dense,
                                    process_set=self._process_set)
            for i, g in zip(shared, outs, strict=True):
                reduced[i] = g
        size = ddl.size() if self._process_set is None else int(self._process_set.size() or 1)
        for i in local:  # Horovod's scale_local_gradients: local layers' gradients / size
            if reduced[i] is not None and self._scale_local and self._op is ReduceOp.AVERAGE:
                reduced[i] = _divided(reduced[i], size)
        return tf.nest.pack_sequence_as(grads, reduced)

    def register_local_source(self, source: Any) -> None:
        """Keep ``source``'s gradient on this rank (a model-parallel part that only this rank
        has): not reduced, and divided by the number of ranks when ``scale_local_gradients``
        and the op is Average, so it matches the averaged loss of the others."""
        self._local.add(_ref(source))

    def get_local_and_global_gradients(self, target: Any, sources: Any, output_gradients: Any = None,
                                       use_generic_names: bool = False) -> tuple[list[Any], list[Any]]:
        """:meth:`gradient`, split into (local source, gradient) and (reduced source, gradient) pairs."""
        flat_sources = list(tf.nest.flatten(sources))
        grads = tf.nest.flatten(self.gradient(target, flat_sources, output_gradients=output_gradients))
        local = [(s, g) for s, g in zip(flat_sources, grads, strict=True) if _ref(s) in self._local]
        shared = [(s, g) for s, g in zip(flat_sources, grads, strict=True) if _ref(s) not in self._local]
        return local, shared

    def __enter__(self) -> DistributedGradientTape:
        self._tape.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._tape.__exit__(*exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tape, name)


class PartialDistributedGradientTape(DistributedGradientTape):
    """A :class:`DistributedGradientTape` whose ``local_layers``' variables are not reduced
    (their gradients are divided by the number of ranks when ``scale_local_gradients``), Horovod's."""

    def __init__(self, gradtape: tf.GradientTape, device_dense: str = "", device_sparse: str = "",
                 compression: Any = None, sparse_as_dense: bool = False, op: Any = ReduceOp.AVERAGE,
                 gradient_predivide_factor: float = 1.0, num_groups: int = 0, groups: Any = None,
                 process_set: Any = None, local_layers: Any = None, scale_local_gradients: bool = True) -> None:
        super().__init__(gradtape, device_dense, device_sparse, compression, sparse_as_dense, op,
                         gradient_predivide_factor, num_groups, groups, process_set, scale_local_gradients)
        layers = [] if local_layers is None else (local_layers if isinstance(local_layers, list) else [local_layers])
        self._local = {_ref(v) for layer in layers for v in layer.trainable_weights}


def _ref(v: Any) -> Any:
    return v.ref() if hasattr(v, "ref") else id(v)


def _divided(grad: Any, size: int) -> Any:
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values / size, grad.indices, grad.dense_shape)
    return grad / size


def broadcast_variables(variables: Any, root_rank: int = 0, process_set: Any = None, inplace: bool = False, *,
                        name: str | None = None) -> Any:
    """Overwrite every variable with ``root_rank``'s value, in one broadcast of their bytes.

    Works on ``tf.Variable`` and Keras 3 variables of any dtype, eagerly or in a
    ``tf.function``. In a TF 1 graph (run by a Session) it returns the op to run, as
    Horovod's does; eagerly it returns None.

    Example:
        >>> ddl.tensorflow.broadcast_variables(model.variables, root_rank=0)  # doctest: +SKIP
    """
    assigned = broadcast_into(list(tf.nest.flatten(variables)), root_rank, process_set=process_set, name=name)
    return None if tf.executing_eagerly() else tf.group(*assigned)


def broadcast_into(vs: list[Any], root_rank: int, *, process_set: Any = None, name: str | None = None) -> list[Any]:
    """Assign ``root_rank``'s values to ``vs``; return the new values (in a graph: tensors that
    run the assignments when evaluated)."""
    if not vs:
        return []
    ps = None if process_set is None or process_set.process_set_id == 0 else process_set
    eager = tf.executing_eagerly()
    # A graph may be built before ddl.init(): the core checks root_rank when the op runs.
    if eager and (not isinstance(root_rank, int) or not 0 <= root_rank < ddl.size()):
        raise ValueError(f"root_rank must be a rank in 0..{ddl.size() - 1}, got {root_rank!r}")
    if eager and (ddl.size() == 1 or (ps is not None and ps.size() == 1)):
        return [v.read_value() if hasattr(v, "read_value") else tf.convert_to_tensor(v) for v in vs]
    name = name or name_for(vs, "ddl.broadcast_variables")
    values = [tf.convert_to_tensor(v) for v in vs]

    def fn(*arrays: np.ndarray) -> list[np.ndarray]:
        flat = [np.ascontiguousarray(a).reshape(-1).view(np.uint8) for a in arrays]
        packed = api.broadcast(np.concatenate(flat) if flat else np.zeros(0, np.uint8), root_rank, name=name,
                               process_set=ps)
        outs, start = [], 0
        for a, f in zip(arrays, flat, strict=True):
            outs.append(packed[start : start + f.size].view(a.dtype).reshape(a.shape))
            start += f.size
        return outs

    outs = host_call(fn, values, [t.dtype for t in values], [t.shape for t in values], what="broadcast_variables")
    if eager:
        for v, o in zip(vs, outs, strict=True):
            v.assign(o)
        return [v.read_value() if hasattr(v, "read_value") else tf.convert_to_tensor(v) for v in vs]
    # In a graph an assignment happens only when something that needs it runs. Each value
    # returned needs all of them, as with Horovod's one in-place op for all the variables.
    assigned = [v.assign(o) for v, o in zip(vs, outs, strict=True)]
    with tf.control_dependencies(assigned):
        return [tf.identity(a) for a in assigned]
