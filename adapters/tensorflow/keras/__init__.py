"""ddl for Keras 3 on TensorFlow: Horovod's ``horovod.tensorflow.keras`` API on ddl's core.

Example:
    >>> import ddl.tensorflow.keras as hvd                                  # doctest: +SKIP
    >>> model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss=...)  # doctest: +SKIP
    >>> model.fit(ds, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import keras

import tensorflow as tf
from ddl.base.lazy import submodules
from ddl.base.ops import ReduceOp
from ddl.engine.powersgd import PowerSGD
from ddl.runtime import process
from ddl.runtime.process import *  # noqa: F403 - init, rank, process sets, *_built, ...: the same on every adapter
from ddl.tensorflow import Average, Compression, Sum, broadcast_variables
from ddl.tensorflow import mpi_ops as _ops
from ddl.tensorflow.sync_batch_norm import SyncBatchNormalization

from . import callbacks
from . import checkpoint as checkpoint  # save / load: sharded, at any world size
from . import elastic as elastic  # Horovod's hvd.elastic: KerasState and its callbacks
from .local_sgd import DiLoCo, LocalSGD
from .lossscale import install as _agree_before_loss_scale_checks
from .optimizer import DistributedOptimizer

_agree_before_loss_scale_checks()  # a LossScaleOptimizer around ddl's optimizers skips alike on every rank


def allreduce(value: Any, name: str | None = None, average: bool | None = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, op: Any = None, compression: Any = None) -> tf.Tensor:
    """Reduce ``value`` (a tensor, array or number) over all ranks (Horovod's Keras form)."""
    return _ops.allreduce(tf.constant(value), average=average, compression=compression, op=op,
                          prescale_factor=prescale_factor, postscale_factor=postscale_factor, name=name)


def allgather(value: Any, name: str | None = None) -> tf.Tensor:
    """Concatenate every rank's ``value`` on axis 0."""
    return _ops.allgather(tf.constant(value), name=name)


def broadcast(value: Any, root_rank: int, name: str | None = None) -> tf.Tensor:
    """``root_rank``'s ``value`` on every rank."""
    return _ops.broadcast(tf.constant(value), root_rank, name=name)


def reducescatter(value: Any, name: str | None = None, op: Any = ReduceOp.AVERAGE) -> tf.Tensor:
    """Reduce ``value`` and return this rank's rows of axis 0."""
    return _ops.reducescatter(tf.constant(value), op=op, name=name)


def broadcast_global_variables(root_rank: int) -> None:
    """Horovod's TF 1 global-variable broadcast: Keras 3 has no global variables.

    Raises:
        RuntimeError: always; use ``callbacks.BroadcastGlobalVariablesCallback(root_rank)``
            or ``broadcast_variables(model.variables + optimizer.variables, root_rank)``.
    """
    raise RuntimeError("hvd.broadcast_global_variables() needs TF 1 global variables, which Keras 3 does not have; "
                       "use hvd.callbacks.BroadcastGlobalVariablesCallback(root_rank) in model.fit, or "
                       "hvd.broadcast_variables(model.variables + optimizer.variables, root_rank)")


def load_model(filepath: str, custom_optimizers: Any = None, custom_objects: Any = None, compression: Any = None,
               legacy_opts: bool = False) -> keras.Model:
    """Load a saved Keras model with its optimizer wrapped in :class:`DistributedOptimizer`.

    A model saved with a ddl ``DistributedOptimizer`` comes back with it; one saved with a
    plain optimizer gets it wrapped (with ``compression``). ``custom_optimizers`` are
    optimizer classes to resolve by name; ``legacy_opts`` is accepted for the signature.
    """
    objects: dict[str, Any] = {"DistributedOptimizer": DistributedOptimizer}
    for cls in custom_optimizers or []:
        objects[cls.__name__] = cls
    objects.update(custom_objects or {})
    model = keras.models.load_model(filepath, custom_objects=objects)
    opt = getattr(model, "optimizer", None)
    if opt is not None and not isinstance(opt, DistributedOptimizer):
        model.optimizer = DistributedOptimizer(opt, compression=compression)
    return model


# ddl.tensorflow.keras.elastic (the elastic training work) loads on first use.
__getattr__ = submodules("ddl.tensorflow.keras", ("elastic",))


__all__ = [  # noqa: RUF022 - grouped as Horovod's own list
    *process.__all__,
    "Average", "Compression", "DistributedOptimizer", "Sum", "SyncBatchNormalization", "allgather", "allreduce",
    "broadcast", "broadcast_global_variables", "broadcast_variables", "callbacks", "load_model",
    "reducescatter",
    # ddl's own: training over slow links
    "DiLoCo", "LocalSGD", "PowerSGD",
]
