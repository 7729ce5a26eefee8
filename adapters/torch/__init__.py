"""ddl for PyTorch: Horovod's ``horovod.torch`` API on ddl's core.

Every public name of ``horovod.torch`` 0.28.1 is here with Horovod's signature, so a
Horovod script runs with one changed import (``import ddl.torch as hvd``); see the
migration page for the few differences.

Example:
    >>> import ddl.torch as hvd                                    # doctest: +SKIP
    >>> hvd.init()                                                 # doctest: +SKIP
    >>> opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())  # doctest: +SKIP
    >>> hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # doctest: +SKIP
"""

from __future__ import annotations

from ddl import Adasum, Average, Max, Min, MismatchError, Product, Sum
from ddl.base.errors import HorovodInternalError
from ddl.base.lazy import submodules
from ddl.engine.powersgd import PowerSGD
from ddl.runtime import process
from ddl.runtime.process import *  # noqa: F403 - init, rank, process sets, *_built, ...: the same on every adapter

from . import checkpoint as checkpoint  # ddl.torch.checkpoint.save / load: sharded, any world size
from . import optimizer as _optimizer
from .amp import install as _reduce_before_grad_scaler
from .broadcast import (  # type: ignore[assignment]
    allgather_object as allgather_object,  # replaces the core's: tensors go to CPU first
)
from .broadcast import (
    broadcast_object as broadcast_object,  # replaces the core's: tensors go to CPU first
)
from .broadcast import (
    broadcast_optimizer_state,
    broadcast_parameters,
)
from .collectives import (
    TorchHandle,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    poll,
    sparse_allreduce_async,
    synchronize,
)
from .compression import Compression
from .kernels import install as _use_torch_kernels
from .local_sgd import DiLoCo, LocalSGD
from .movement import (  # type: ignore[assignment]
    allgather,
    allgather_async,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allgather,
    grouped_allgather_async,
    grouped_reducescatter,
    grouped_reducescatter_async,
    join,
    reducescatter,
    reducescatter_async,
)
from .optimizer import DistributedOptimizer
from .sharded_optimizer import ShardedOptimizer as _ShardedOptimizer
from .sharded_optimizer import ZeroRedundancyOptimizer
from .sync_batch_norm import SyncBatchNorm

_use_torch_kernels()  # float16 casts and sums at memory speed (numpy's take ~100 ns per subnormal)
_optimizer.sharded_class = _ShardedOptimizer  # what DistributedOptimizer(..., shard_optimizer_state=True) builds
_reduce_before_grad_scaler()  # GradScaler.unscale_ (and scaler.step) read reduced gradients, as with DDP


# ddl.torch.elastic (the elastic training work) loads on first use.
__getattr__ = submodules("ddl.torch", ("elastic",))


__all__ = [  # noqa: RUF022 - grouped as Horovod's own list
    *process.__all__,
    "Adasum", "Average", "Compression", "DistributedOptimizer", "HorovodInternalError", "Max", "Min",
    "MismatchError", "Product", "Sum", "SyncBatchNorm", "TorchHandle", "allgather", "allgather_async",
    "allgather_object", "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "alltoall",
    "alltoall_async", "barrier", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters", "grouped_allgather",
    "grouped_allgather_async", "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "grouped_reducescatter", "grouped_reducescatter_async", "join", "poll",
    "reducescatter", "reducescatter_async", "sparse_allreduce_async", "synchronize",
    "ZeroRedundancyOptimizer",  # ddl's: torch.distributed.optim's, sharding over ddl's ranks
    # ddl's own: training over slow links
    "DiLoCo", "LocalSGD", "PowerSGD",
]
