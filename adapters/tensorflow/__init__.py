"""ddl for TensorFlow 2 / Keras 3: Horovod's ``horovod.tensorflow`` API on ddl's core.

Every public name of ``horovod.tensorflow`` 0.28.1 is here with Horovod's signature
(``import ddl.tensorflow as hvd``); the Keras optimizer wrapper and callbacks are in
:mod:`ddl.tensorflow.keras`. See the migration page for the differences.

Example:
    >>> import ddl.tensorflow as hvd                       # doctest: +SKIP
    >>> hvd.init()                                         # doctest: +SKIP
    >>> tape = hvd.DistributedGradientTape(tape)           # doctest: +SKIP
    >>> hvd.broadcast_variables(model.variables, root_rank=0)  # doctest: +SKIP
"""

from __future__ import annotations

from ddl import Adasum, Average, Max, Min, MismatchError, Product, Sum
from ddl.base.errors import HorovodInternalError
from ddl.base.lazy import submodules
from ddl.engine.powersgd import PowerSGD
from ddl.runtime import process
from ddl.runtime.process import *  # noqa: F403 - init, rank, process sets, *_built, ...: the same on every adapter

from .compression import Compression
from .functions import (
    BroadcastGlobalVariablesHook,
    DistributedOptimizer,
    allgather_object,
    broadcast_global_variables,
    broadcast_object,
    broadcast_object_fn,
)
from .mpi_ops import (
    allgather,
    allreduce,
    alltoall,
    broadcast,
    broadcast_,
    check_num_rank_power_of_2,
    grouped_allgather,
    grouped_allreduce,
    grouped_reducescatter,
    handle_average_backwards_compatibility,
    join,
    local_rank_op,
    local_size_op,
    process_set_included_op,
    rank_op,
    reducescatter,
    refs_to_vars,
    size_op,
    vars_to_refs,
)
from .sync_batch_norm import SyncBatchNormalization
from .tape import DistributedGradientTape, PartialDistributedGradientTape, broadcast_variables

# Horovod's module has it too; scripts call hvd._executing_eagerly().
from .util import _executing_eagerly as _executing_eagerly

# ddl.tensorflow.elastic (the elastic training work) loads on first use.
__getattr__ = submodules("ddl.tensorflow", ("elastic",))


__all__ = [  # noqa: RUF022 - grouped as Horovod's own list
    *process.__all__,
    "Adasum", "Average", "BroadcastGlobalVariablesHook", "Compression", "DistributedGradientTape",
    "DistributedOptimizer", "HorovodInternalError", "Max", "Min", "MismatchError",
    "PartialDistributedGradientTape", "Product", "Sum", "SyncBatchNormalization", "allgather",
    "allgather_object", "allreduce", "alltoall", "broadcast", "broadcast_", "broadcast_global_variables",
    "broadcast_object", "broadcast_object_fn", "broadcast_variables", "check_num_rank_power_of_2",
    "grouped_allgather", "grouped_allreduce", "grouped_reducescatter", "handle_average_backwards_compatibility",
    "join", "local_rank_op", "local_size_op", "process_set_included_op", "rank_op", "reducescatter",
    "refs_to_vars", "size_op", "vars_to_refs",
    # ddl's own: PowerSGD for DistributedGradientTape and the Keras optimizers
    "PowerSGD",
]
