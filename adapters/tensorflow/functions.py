"""Horovod's object broadcasts, ``broadcast_global_variables``, ``DistributedOptimizer`` and
``BroadcastGlobalVariablesHook`` for ``ddl.tensorflow``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf
from ddl.runtime import api

from .tape import broadcast_variables


def _ps(process_set: Any) -> Any:
    return None if process_set is None or process_set.process_set_id == 0 else process_set


def broadcast_object(obj: Any, root_rank: int = 0, session: Any = None, name: str | None = None,
                     process_set: Any = None) -> Any:
    """Return ``root_rank``'s picklable ``obj`` on every rank (``session`` is ignored: TF 2 is eager)."""
    return api.broadcast_object(obj, root_rank, name=name, process_set=_ps(process_set))


def broadcast_object_fn(root_rank: int = 0, session: Any = None, name: str | None = None,
                        process_set: Any = None) -> Callable[[Any], Any]:
    """A function that broadcasts its argument from ``root_rank`` (Horovod's)."""
    return lambda obj: broadcast_object(obj, root_rank, session, name, process_set)


def allgather_object(obj: Any, session: Any = None, name: str | None = None, process_set: Any = None) -> list[Any]:
    """Every rank's picklable ``obj``, in rank order."""
    return api.allgather_object(obj, name=name, process_set=_ps(process_set))


def broadcast_global_variables(root_rank: int) -> Any:
    """Broadcast every TF1 global variable from ``root_rank`` (graph mode only, as Horovod).

    Raises:
        RuntimeError: called eagerly (TF 2's default); broadcast the model's and the
            optimizer's variables with ``broadcast_variables`` instead.
    """
    if tf.executing_eagerly():
        raise RuntimeError("hvd.broadcast_global_variables() does not support eager execution. "
                           "Please use `hvd.broadcast_variables(<model/optimizer variables>)` instead.")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


def DistributedOptimizer(optimizer: Any, name: str | None = None, use_locking: bool = False,  # noqa: N802
                         device_dense: str = "", device_sparse: str = "", compression: Any = None,
                         sparse_as_dense: bool = False, backward_passes_per_step: int = 1, op: Any = None,
                         gradient_predivide_factor: float = 1.0, average_aggregated_gradients: bool = False,
                         num_groups: int = 0, groups: Any = None, process_set: Any = None,
                         scale_local_gradients: bool = True) -> Any:
    """Horovod's ``hvd.DistributedOptimizer`` for TF 2: a Keras 3 optimizer wrapped by
    :class:`ddl.tensorflow.keras.DistributedOptimizer` (TF 1 optimizers are gone in TF 2.16+).

    Raises:
        TypeError: ``optimizer`` is not a Keras 3 optimizer.
    """
    from .keras.optimizer import DistributedOptimizer as KerasDistributedOptimizer

    kwargs: dict[str, Any] = {"backward_passes_per_step": backward_passes_per_step,
                              "average_aggregated_gradients": average_aggregated_gradients,
                              "compression": compression, "sparse_as_dense": sparse_as_dense, "name": name}
    if op is not None:
        kwargs["op"] = op
    return KerasDistributedOptimizer(optimizer, **kwargs)


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):  # type: ignore[misc]
    """A TF 1 ``SessionRunHook`` that broadcasts the global variables from ``root_rank`` once
    the session is created (for ``tf.compat.v1`` graph code; Keras uses the callback)."""

    def __init__(self, root_rank: int, device: str = "") -> None:
        super().__init__()
        self.root_rank = root_rank
        self.device = device

    def after_create_session(self, session: Any, coord: Any) -> None:
        for v in tf.compat.v1.global_variables():
            value = api.broadcast(session.run(v), self.root_rank, name=f"ddl.hook.{v.name}")
            v.load(value, session)
