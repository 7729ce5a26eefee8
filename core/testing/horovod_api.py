"""Horovod 0.28.1's public names and signatures, and how ddl's adapters cover them.

The names are those ``horovod.torch``, ``horovod.tensorflow``, ``horovod.tensorflow.keras``
and its ``callbacks`` bind publicly (read from Horovod 0.28.1's source); each maps to its
parameter list (``"a,b=,*args"``: ``=`` marks a default), ``"value"`` for constants and
classes compared by name only, ``"module"`` for submodules. :func:`coverage` checks each
against the matching ddl module: present, and with a compatible signature — Horovod's
parameters in Horovod's positional order with defaults where Horovod has them (ddl may
add keyword-only parameters, or defaults, after them).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from typing import Any

HOROVOD_0_28_1: dict[str, dict[str, str]] = {
    "ddl.tensorflow": {
        "Adasum": "value",
        "Average": "value",
        "BroadcastGlobalVariablesHook": "root_rank,device=",
        "Compression": "class",
        "DistributedGradientTape": "gradtape,device_dense=,device_sparse=,compression=,sparse_as_dense=,op=,gradient_predivide_factor=,num_groups=,groups=,process_set=,scale_local_gradients=",
        "DistributedOptimizer": "optimizer,name=,use_locking=,device_dense=,device_sparse=,compression=,sparse_as_dense=,backward_passes_per_step=,op=,gradient_predivide_factor=,average_aggregated_gradients=,num_groups=,groups=,process_set=,scale_local_gradients=",
        "LocalGradientAggregationHelper": "backward_passes_per_step,allreduce_func,sparse_as_dense,average_aggregated_gradients,rank,optimizer_type,process_set=,scale_local_gradients=,name=",
        "Max": "value",
        "Min": "value",
        "PartialDistributedGradientTape": "gradtape,device_dense=,device_sparse=,compression=,sparse_as_dense=,op=,gradient_predivide_factor=,num_groups=,groups=,process_set=,local_layers=,scale_local_gradients=",
        "ProcessSet": "value",
        "Product": "value",
        "Sum": "value",
        "SyncBatchNormalization": "fused=,**kwargs",
        "add_process_set": "process_set",
        "allgather": "tensor,name=,ignore_name_scope=,process_set=",
        "allgather_object": "obj,session=,name=,process_set=",
        "allreduce": "tensor,average=,device_dense=,device_sparse=,compression=,op=,prescale_factor=,postscale_factor=,name=,process_set=,ignore_name_scope=",
        "alltoall": "tensor,splits=,name=,ignore_name_scope=,process_set=",
        "broadcast": "tensor,root_rank,name=,ignore_name_scope=,process_set=",
        "broadcast_": "variables,root_rank,name=,process_set=",
        "broadcast_global_variables": "root_rank",
        "broadcast_object": "obj,root_rank=,session=,name=,process_set=",
        "broadcast_object_fn": "root_rank=,session=,name=,process_set=",
        "broadcast_variables": "variables,root_rank,process_set=,inplace=",
        "ccl_built": "",
        "check_num_rank_power_of_2": "num_rank",
        "cross_rank": "",
        "cross_size": "",
        "cuda_built": "",
        "ddl_built": "",
        "elastic": "module",
        "global_process_set": "value",
        "gloo_built": "",
        "gloo_enabled": "",
        "grouped_allgather": "tensors,name=,ignore_name_scope=,process_set=",
        "grouped_allreduce": "tensors,average=,device_dense=,device_sparse=,compression=,op=,prescale_factor=,postscale_factor=,process_set=,ignore_name_scope=,name=",
        "grouped_reducescatter": "tensors,device_dense=,compression=,op=,process_set=,prescale_factor=,postscale_factor=",
        "handle_average_backwards_compatibility": "op,average",
        "init": "comm=,process_sets=",
        "is_homogeneous": "",
        "is_initialized": "",
        "join": "",
        "local_rank": "",
        "local_rank_op": "name=",
        "local_size": "",
        "local_size_op": "name=",
        "mpi_built": "",
        "mpi_enabled": "",
        "mpi_threads_supported": "",
        "nccl_built": "",
        "process_set_included_op": "process_set_id=,name=",
        "rank": "",
        "rank_op": "name=",
        "reducescatter": "tensor,device_dense=,compression=,op=,name=,process_set=,ignore_name_scope=,prescale_factor=,postscale_factor=",
        "refs_to_vars": "refs",
        "remove_process_set": "process_set",
        "rocm_built": "",
        "shutdown": "",
        "size": "",
        "size_op": "process_set_id=,name=",
        "start_timeline": "file_path,mark_cycles=",
        "stop_timeline": "",
        "vars_to_refs": "vars",
    },
    "ddl.tensorflow.keras": {
        "Average": "value",
        "Compression": "class",
        "DistributedOptimizer": "optimizer,name=,device_dense=,device_sparse=,compression=,sparse_as_dense=,gradient_predivide_factor=,op=,backward_passes_per_step=,average_aggregated_gradients=,num_groups=,groups=,process_set=,scale_local_gradients=",
        "ProcessSet": "value",
        "Sum": "value",
        "add_process_set": "process_set",
        "allgather": "value,name=",
        "allreduce": "value,name=,average=,prescale_factor=,postscale_factor=,op=,compression=",
        "broadcast": "value,root_rank,name=",
        "broadcast_global_variables": "root_rank",
        "callbacks": "module",
        "ccl_built": "",
        "cross_rank": "",
        "cross_size": "",
        "cuda_built": "",
        "ddl_built": "",
        "elastic": "module",
        "global_process_set": "value",
        "gloo_built": "",
        "gloo_enabled": "",
        "init": "comm=,process_sets=",
        "is_initialized": "",
        "load_model": "filepath,custom_optimizers=,custom_objects=,compression=,legacy_opts=",
        "local_rank": "",
        "local_size": "",
        "mpi_built": "",
        "mpi_enabled": "",
        "mpi_threads_supported": "",
        "nccl_built": "",
        "rank": "",
        "reducescatter": "value,name=,op=",
        "remove_process_set": "process_set",
        "rocm_built": "",
        "shutdown": "",
        "size": "",
        "start_timeline": "file_path,mark_cycles=",
        "stop_timeline": "",
    },
    "ddl.torch": {
        "Adasum": "value",
        "Average": "value",
        "Compression": "class",
        "DistributedOptimizer": "optimizer,named_parameters=,compression=,backward_passes_per_step=,op=,gradient_predivide_factor=,num_groups=,groups=,sparse_as_dense=,process_set=",
        "HorovodInternalError": "value",
        "Max": "value",
        "Min": "value",
        "ProcessSet": "value",
        "Product": "value",
        "Sum": "value",
        "SyncBatchNorm": "num_features,eps=,momentum=,affine=,track_running_stats=",
        "add_process_set": "process_set",
        "allgather": "tensor,name=,process_set=",
        "allgather_async": "tensor,name=,process_set=",
        "allgather_object": "obj,name=",
        "allreduce": "tensor,average=,name=,compression=,op=,prescale_factor=,postscale_factor=,process_set=",
        "allreduce_": "tensor,average=,name=,op=,prescale_factor=,postscale_factor=,process_set=",
        "allreduce_async": "tensor,average=,name=,op=,prescale_factor=,postscale_factor=,process_set=",
        "allreduce_async_": "tensor,average=,name=,op=,prescale_factor=,postscale_factor=,process_set=",
        "alltoall": "tensor,splits=,name=,process_set=",
        "alltoall_async": "tensor,splits=,name=,process_set=",
        "barrier": "process_set=",
        "broadcast": "tensor,root_rank,name=,process_set=",
        "broadcast_": "tensor,root_rank,name=,process_set=",
        "broadcast_async": "tensor,root_rank,name=,process_set=",
        "broadcast_async_": "tensor,root_rank,name=,process_set=",
        "broadcast_object": "obj,root_rank=,name=,process_set=",
        "broadcast_optimizer_state": "optimizer,root_rank,model=",
        "broadcast_parameters": "params,root_rank",
        "ccl_built": "",
        "cross_rank": "",
        "cross_size": "",
        "cuda_built": "",
        "ddl_built": "",
        "elastic": "module",
        "global_process_set": "value",
        "gloo_built": "",
        "gloo_enabled": "",
        "grouped_allgather": "tensors,name=,process_set=",
        "grouped_allgather_async": "tensors,name=,process_set=",
        "grouped_allreduce": "tensors,average=,name=,compression=,op=,prescale_factor=,postscale_factor=,process_set=",
        "grouped_allreduce_": "tensors,average=,name=,op=,prescale_factor=,postscale_factor=,process_set=",
        "grouped_allreduce_async": "tensors,average=,name=,op=,prescale_factor=,postscale_factor=,process_set=",
        "grouped_allreduce_async_": "tensors,average=,name=,op=,prescale_factor=,postscale_factor=,process_set=",
        "grouped_reducescatter": "tensors,name=,compression=,op=,process_set=,prescale_factor=,postscale_factor=",
        "grouped_reducescatter_async": "tensors,name=,op=,process_set=,prescale_factor=,postscale_factor=",
        "init": "comm=,process_sets=",
        "is_initialized": "",
        "join": "device=",
        "local_rank": "",
        "local_size": "",
        "mpi_built": "",
        "mpi_enabled": "",
        "mpi_threads_supported": "",
        "nccl_built": "",
        "poll": "handle",
        "rank": "",
        "reducescatter": "tensor,name=,compression=,op=,process_set=,prescale_factor=,postscale_factor=",
        "reducescatter_async": "tensor,name=,op=,process_set=,prescale_factor=,postscale_factor=",
        "remove_process_set": "process_set",
        "rocm_built": "",
        "shutdown": "",
        "size": "",
        "sparse_allreduce_async": "tensor,name,op,process_set=",
        "start_timeline": "file_path,mark_cycles=",
        "stop_timeline": "",
        "synchronize": "handle",
    },
    "ddl.tensorflow.keras.callbacks": {
        "BroadcastGlobalVariablesCallback": "root_rank,device=,local_variables=",
        "MetricAverageCallback": "device=",
        "LearningRateScheduleCallback": "initial_lr,multiplier,start_epoch=,end_epoch=,staircase=,momentum_correction=,steps_per_epoch=",
        "LearningRateWarmupCallback": "initial_lr,warmup_epochs=,momentum_correction=,steps_per_epoch=,verbose=",
        "BestModelCheckpoint": "monitor=,verbose=,save_weights_only=,mode=,save_freq=",
    },
}


@dataclasses.dataclass(frozen=True)
class Row:
    """One Horovod name in one module: whether ddl has it, and with a compatible signature."""

    module: str
    name: str
    present: bool
    compatible: bool
    why: str = ""


def coverage(module: str) -> list[Row]:
    """Every Horovod name of ``module`` (a ddl module name) checked against that module."""
    mod = importlib.import_module(module)
    rows = []
    for name, spec in HOROVOD_0_28_1[module].items():
        try:
            obj = getattr(mod, name)
        except (AttributeError, ImportError) as exc:
            rows.append(Row(module, name, False, False, f"missing ({exc})"))
            continue
        ok, why = _compatible(obj, spec)
        rows.append(Row(module, name, True, ok, why))
    return rows


def _compatible(obj: Any, spec: str) -> tuple[bool, str]:
    if spec in ("value", "module", "class"):
        return True, ""
    try:
        target = obj.__init__ if inspect.isclass(obj) else obj
        sig = inspect.signature(target)
    except (TypeError, ValueError) as exc:
        return False, f"no signature: {exc}"
    params = [p for p in sig.parameters.values() if p.name != "self"]
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    has_kwargs = any(p.kind is p.VAR_KEYWORD for p in params)
    has_args = any(p.kind is p.VAR_POSITIONAL for p in params)
    wanted = [w for w in spec.split(",") if w]
    for i, w in enumerate(wanted):
        if w.startswith("**"):
            if not has_kwargs:
                return False, "takes no **kwargs"
            continue
        if w.startswith("*"):
            if not has_args:
                return False, "takes no *args"
            continue
        name, default = w.rstrip("="), w.endswith("=")
        if i >= len(positional) or positional[i].name != name:
            got = positional[i].name if i < len(positional) else "nothing"
            return False, f"parameter {i} is {got!r}, Horovod's is {name!r}"
        if default and positional[i].default is inspect.Parameter.empty:
            return False, f"{name!r} has no default"
    return True, ""
