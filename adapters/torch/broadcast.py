"""Start every rank from the same weights and optimizer state."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

import ddl
import torch
from ddl.runtime import api

from .optimizer import DistributedOptimizer
from .tensors import to_cpu as _to_cpu


def broadcast_parameters(
    params: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], root_rank: int = 0,
) -> None:
    """Overwrite every tensor in ``params`` with ``root_rank``'s, in place.

    Takes ``model.state_dict()`` (buffers included) or ``model.named_parameters()``. All
    tensors travel as one byte buffer, so a model of any number of tensors and dtypes
    costs one broadcast; a manifest of names, shapes and dtypes is compared first and a
    difference is reported on every rank.

    Raises:
        ValueError: ``params`` is not name/tensor pairs, or a tensor name repeats.
        ddl.MismatchError: the ranks hold different tensors.

    Example:
        >>> ddl.torch.broadcast_parameters(model.state_dict(), root_rank=0)  # doctest: +SKIP
    """
    items = list(params.items()) if isinstance(params, Mapping) else list(params)
    for item in items:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                and isinstance(item[1], torch.Tensor)):
            raise ValueError("broadcast_parameters takes model.state_dict() or model.named_parameters() "
                             f"(name, tensor) pairs, got an item {type(item).__name__}")
    names = [n for n, _ in items]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ValueError(f"broadcast_parameters got the name {dup!r} twice")
    _check_manifest([(n, tuple(t.shape), str(t.dtype)) for n, t in items], "broadcast_parameters")
    if ddl.size() == 1 or not items:
        return
    tensors = [t for _, t in items]
    sizes = [t.numel() * t.element_size() for t in tensors]
    flat = np.empty(sum(sizes), dtype=np.uint8)
    offset = 0
    if ddl.rank() == root_rank:
        for t, n in zip(tensors, sizes, strict=True):
            flat[offset : offset + n] = _bytes_of(t)
            offset += n
    ddl.broadcast_(flat, root_rank, name="ddl.torch.broadcast_parameters")
    if ddl.rank() == root_rank:
        return
    offset = 0
    with torch.no_grad():
        for t, n in zip(tensors, sizes, strict=True):
            src = torch.from_numpy(flat[offset : offset + n]).view(t.dtype).view(t.shape)
            t.copy_(src)
            offset += n


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0, model: Any = None) -> None:
    """Give every rank ``root_rank``'s optimizer state and hyperparameters, and nothing else.

    The root's whole ``state_dict()`` is sent and loaded on the other ranks: a rank
    without state (Adam before its first step) gets the root's, a rank with stale state
    (its own checkpoint) loses it, and a fresh root leaves every rank fresh. No weight
    moves and no step is counted, so ``broadcast_parameters`` followed by this call
    trains exactly what one process trains from the root's model and optimizer.

    Horovod instead gives a state-less optimizer one local step with zero gradients:
    weight decay then moves the weights and Adam counts a step, so training differs from
    one process, and when only the root resumed a checkpoint the replicas diverge. ddl
    keeps the one-process equivalence (see the Horovod migration page).

    Args:
        optimizer: a ``torch.optim.Optimizer`` or a ``DistributedOptimizer`` around one.
        root_rank: the rank whose state every rank takes.
        model: accepted for Horovod's signature; not needed.

    Raises:
        TypeError: ``optimizer`` is not a torch optimizer.
        ddl.MismatchError: the ranks' optimizers have different parameter groups.

    Example:
        >>> ddl.torch.broadcast_optimizer_state(optimizer, root_rank=0)  # doctest: +SKIP
    """
    optimizer = getattr(optimizer, "optimizer", optimizer) if not isinstance(optimizer, torch.optim.Optimizer) \
        else optimizer  # the Adasum wrapper holds its optimizer
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"broadcast_optimizer_state takes a torch optimizer, got {type(optimizer).__name__}")
    groups = [len(g["params"]) for g in optimizer.param_groups]
    _check_manifest(groups, "broadcast_optimizer_state (parameters per group)")
    if ddl.size() == 1:
        return
    sharded = getattr(type(optimizer), "broadcast_state", None)  # ShardedOptimizer's (ZeRO-1)
    if isinstance(optimizer, DistributedOptimizer) and sharded is not None:
        sharded(optimizer, root_rank)  # each rank takes its part of the root's state
        return
    state = _to_cpu(optimizer.state_dict()) if ddl.rank() == root_rank else None
    state = ddl.broadcast_object(state, root_rank, name="ddl.torch.broadcast_optimizer_state")
    if ddl.rank() != root_rank:
        optimizer.load_state_dict(state)


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None, process_set: Any = None) -> Any:
    """Return ``root_rank``'s picklable ``obj`` (tensors included, moved to CPU) everywhere."""
    send = _to_cpu(obj) if ddl.rank() == root_rank else None
    ps = None if process_set is None or process_set.process_set_id == 0 else process_set
    return api.broadcast_object(send, root_rank, name=name, process_set=ps)


def allgather_object(obj: Any, name: str | None = None) -> list[Any]:
    """Every rank's picklable ``obj`` (tensors moved to CPU), in rank order."""
    return api.allgather_object(_to_cpu(obj), name=name)


def _bytes_of(t: torch.Tensor) -> np.ndarray:
    flat = t.detach().reshape(-1).contiguous().cpu()
    out: np.ndarray = flat.view(torch.uint8).numpy()
    return out


def _check_manifest(manifest: Any, what: str) -> None:
    """Compare ``manifest`` across ranks; every rank raises if any differ."""
    if ddl.size() == 1:
        return
    everyone = ddl.allgather_object(manifest, name=f"ddl.torch.{what.split()[0]}.manifest")
    bad = [r for r, m in enumerate(everyone) if m != everyone[0]]
    if not bad:
        return
    theirs = everyone[bad[0]]
    if isinstance(manifest, list) and isinstance(theirs, list):
        diff = next(((a, b) for a, b in zip(everyone[0], theirs, strict=False) if a != b), None)
        detail = (f"rank 0 has {diff[0]}, rank {bad[0]} has {diff[1]}" if diff
                  else f"rank 0 has {len(everyone[0])} entries, rank {bad[0]} has {len(theirs)}")
    else:
        detail = f"rank 0: {everyone[0]!r}, rank {bad[0]}: {theirs!r}"
    raise ddl.MismatchError(f"{what}: the ranks hold different tensors ({detail}); "
                            "build the same model on every rank")
