"""DistributedGradientTape and broadcast_variables."""

from __future__ import annotations

from typing import Any

import numpy as np

import ddl
import tensorflow as tf
from ddl.base.ops import ReduceOp

from .bridge import host_call
from .gradients import check_gradient_op, name_for, reduce_gradients


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

    def __init__(self, tape: tf.GradientTape, *, op: Any = ReduceOp.AVERAGE, compression: Any = None,
                 sparse_as_dense: bool = False) -> None:
        if not isinstance(tape, tf.GradientTape):
            raise TypeError(f"DistributedGradientTape wraps a tf.GradientTape, got {type(tape).__name__}")
        self._tape = tape
        self._op = check_gradient_op(op)
        self._compression = compression
        self._sparse_as_dense = bool(sparse_as_dense)

    @tf.autograph.experimental.do_not_convert  # type: ignore[misc,untyped-decorator]
    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 unconnected_gradients: Any = tf.UnconnectedGradients.NONE) -> Any:
        """The wrapped tape's gradients, reduced over all ranks (same structure as ``sources``)."""
        grads = self._tape.gradient(target, sources, output_gradients=output_gradients,
                                    unconnected_gradients=unconnected_gradients)
        flat_sources = tf.nest.flatten(sources)
        flat = tf.nest.flatten(grads)
        reduced = reduce_gradients(flat, name=name_for(flat_sources, "ddl.tape"), op=self._op,
                                   compression=self._compression, sparse_as_dense=self._sparse_as_dense)
        return tf.nest.pack_sequence_as(grads, reduced)

    def __enter__(self) -> DistributedGradientTape:
        self._tape.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._tape.__exit__(*exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tape, name)


def broadcast_variables(variables: Any, root_rank: int = 0, *, name: str | None = None) -> None:
    """Overwrite every variable with ``root_rank``'s value, in one broadcast of their bytes.

    Works on ``tf.Variable`` and Keras 3 variables of any dtype, eagerly or in a
    ``tf.function``.

    Example:
        >>> ddl.tensorflow.broadcast_variables(model.variables, root_rank=0)  # doctest: +SKIP
    """
    vs = list(tf.nest.flatten(variables))
    if not isinstance(root_rank, int) or not 0 <= root_rank < ddl.size():
        raise ValueError(f"root_rank must be a rank in 0..{ddl.size() - 1}, got {root_rank!r}")
    if not vs or ddl.size() == 1:
        return
    name = name or name_for(vs, "ddl.broadcast_variables")
    values = [tf.convert_to_tensor(v) for v in vs]

    def fn(*arrays: np.ndarray) -> list[np.ndarray]:
        flat = [np.ascontiguousarray(a).reshape(-1).view(np.uint8) for a in arrays]
        packed = ddl.broadcast(np.concatenate(flat) if flat else np.zeros(0, np.uint8), root_rank, name=name)
        outs, start = [], 0
        for a, f in zip(arrays, flat, strict=True):
            outs.append(packed[start : start + f.size].view(a.dtype).reshape(a.shape))
            start += f.size
        return outs

    outs = host_call(fn, values, [t.dtype for t in values], [t.shape for t in values], what="broadcast_variables")
    for v, o in zip(vs, outs, strict=True):
        v.assign(o)
