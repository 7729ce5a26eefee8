"""SyncBatchNormalization: Keras 3 batch normalization over every rank's batch.

In training each rank's per-channel count, sum and sum of squares are allreduced (in
float64, one grouped call whose gradient is the same allreduce of the gradients), so the
mean and variance are those of the global batch, forward and backward: N ranks on B/N
samples each compute what one process computes on B samples.
"""

from __future__ import annotations

from typing import Any

import keras

import tensorflow as tf
from ddl.base.ops import ReduceOp
from ddl.runtime.process_sets import ProcessSet, global_process_set

from .mpi_ops import grouped_allreduce


@keras.saving.register_keras_serializable(package="ddl")
class SyncBatchNormalization(keras.layers.BatchNormalization):  # type: ignore[misc]
    """``keras.layers.BatchNormalization`` with statistics over all ranks (Horovod's).

    Args:
        fused: accepted for Horovod's signature (must not be True).
        process_set: normalize over this process set's ranks only.
        **kwargs: ``keras.layers.BatchNormalization``'s.

    Example:
        >>> layer = ddl.tensorflow.SyncBatchNormalization(momentum=0.9)  # doctest: +SKIP
    """

    def __init__(self, fused: bool | None = False, *, process_set: ProcessSet = global_process_set,
                 **kwargs: Any) -> None:
        if fused:
            raise ValueError("SyncBatchNormalization does not support fused=True")
        super().__init__(**kwargs)
        self.process_set = process_set

    def _moments(self, inputs: Any, mask: Any) -> tuple[Any, Any]:
        if mask is not None:
            raise ValueError("SyncBatchNormalization does not support masks")
        x = tf.cast(inputs, tf.float64)
        axes = list(self._reduction_axes)
        shape = tf.shape(x, out_type=tf.int64)
        count = tf.cast(tf.reduce_prod(tf.gather(shape, axes)), tf.float64)
        total, s, sq = grouped_allreduce(
            [tf.reshape(count, [1]), tf.reduce_sum(x, axes), tf.reduce_sum(tf.square(x), axes)],
            op=ReduceOp.SUM, process_set=self.process_set)
        n = total[0]
        mean = s / n
        var = tf.maximum(sq / n - tf.square(mean), 0.0)
        return tf.cast(mean, inputs.dtype), tf.cast(var, inputs.dtype)

    def get_config(self) -> dict[str, Any]:
        config: dict[str, Any] = super().get_config()
        config.pop("synchronized", None)
        return config
