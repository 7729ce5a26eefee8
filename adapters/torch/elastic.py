"""Elastic training for PyTorch with Horovod's names: ``TorchState``, ``run``, ``ElasticSampler``.

Run the script with ``ddlrun --elastic``: a lost host ends the world it was in, and the
next world (the hosts left, and those that join) resumes from the last ``state.commit()``,
which every host keeps on its tmpfs. See ``docs/guides/elastic.md``.

Example:
    >>> import ddl.torch as dt, ddl.torch.elastic as elastic          # doctest: +SKIP
    >>> state = elastic.TorchState(model=model, optimizer=opt, sampler=sampler, epoch=0, step=0)  # doctest: +SKIP
    >>> @elastic.run
    ... def train(state):
    ...     ...; state.commit()                                        # doctest: +SKIP
"""

from __future__ import annotations

import copy
import io
from collections.abc import Iterator, Sized
from typing import Any

import numpy as np

import torch
from ddl.base.errors import HorovodInternalError, HostsUpdatedInterrupt
from ddl.runtime.elastic import ObjectState, State, run, updates_pending, world_number
from ddl.runtime.elastic.position import DataPosition, Positioned
from ddl.runtime.process import rank, size

from .optimizer import DistributedOptimizer
from .sharded_optimizer import ShardedOptimizer


class ElasticSampler(Positioned, torch.utils.data.Sampler[int]):
    """Deals what is left of the epoch over the ranks, again after every change of world size.

    Like ``DistributedSampler``, one shuffled order per epoch (``seed + epoch``), the same on
    every rank; unlike it, it remembers how many samples the world has processed this
    epoch (:meth:`record_batch`), so that after a reset (tracked by a :class:`TorchState`)
    the remaining samples are dealt over the new world: none is repeated or skipped. The
    one exception is the epoch's last step when fewer samples remain than it takes to give
    every rank as many batches (see :func:`ddl.runtime.elastic.position.deal`): pass
    ``batch_size`` so that happens only when it must.

    Args:
        dataset: the data (its length must not change).
        shuffle: shuffle each epoch (default True).
        seed: the shuffle's seed, the same on every rank.
        batch_size: the loader's batch size per rank, if known (see above).
    """

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0, *, batch_size: int | None = None) -> None:
        self.dataset, self.shuffle, self.seed, self.batch_size = dataset, shuffle, seed, batch_size
        self.position = DataPosition(seed=seed)
        self.num_replicas, self.rank = 1, 0
        self.indices: list[int] = []
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Count one processed batch of ``batch_size`` per rank (the whole world's)."""
        self.position.advance(per_rank=batch_size, size=self.num_replicas, limit=len(self.dataset))

    def reset(self) -> None:
        """Deal the epoch's remaining samples over the current world (rank and size now)."""
        self.num_replicas, self.rank = size(), rank()
        share = self.position.share(len(self.dataset), rank=self.rank, size=self.num_replicas,
                                    batch_size=self.batch_size, shuffle=self.shuffle)
        self.indices = [int(i) for i in share]

    def __iter__(self) -> Iterator[int]:
        return iter(list(self.indices))

    def __len__(self) -> int:
        return len(self.indices)


class _Handler:
    """How one object of a state is saved, restored and carried as bytes."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.saved: Any = None
        self.save()

    def save(self) -> None:
        self.saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(copy.deepcopy(self.saved))

    def replicated(self) -> Any:
        """What every rank holds alike (all of it, here)."""
        return self.saved

    def load_replicated(self, saved: Any) -> None:
        self.saved = saved


class _ShardedOptimizerHandler(_Handler):
    """A sharded optimizer: the saved copy is this rank's part (its parameters' state), and
    the hyperparameters, which every rank holds alike. The parts travel as entries keyed by
    the parameter's place in ``param_groups``, to their owner in each world."""

    value: ShardedOptimizer

    def save(self) -> None:
        self.saved = copy.deepcopy(self.value.shard_state_dict())

    def restore(self) -> None:
        self.value.load_shard(copy.deepcopy(self.saved))

    def replicated(self) -> Any:
        return {"param_groups": self.saved["param_groups"], "state": {}}

    def load_replicated(self, saved: Any) -> None:
        self.saved = {"param_groups": saved["param_groups"], "state": self.saved["state"]}

    def entries(self, name: str) -> dict[str, bytes]:
        out = {}
        for index, slots in self.saved["state"].items():
            buffer = io.BytesIO()
            torch.save({k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in slots.items()}, buffer)
            out[f"{name}/{index}"] = buffer.getvalue()
        return out

    def owner(self, index: int) -> int:
        rank_of = self.value.partition.owners[index]
        return rank_of if rank_of >= 0 else 0

    def load_entries(self, entries: dict[int, bytes]) -> None:
        self.saved["state"] = {i: torch.load(io.BytesIO(blob), map_location="cpu", weights_only=False)
                               for i, blob in entries.items()}


class _HookedOptimizerHandler(_Handler):
    """A DistributedOptimizer with a stateful hook: the hook's shared state (PowerSGD's call
    counts and Q) is kept beside the optimizer's; its rank-local errors restart at zero."""

    def save(self) -> None:
        self.saved = {"optimizer": copy.deepcopy(self.value.state_dict()),
                      "hook": copy.deepcopy(self.value.hook_state.state_dict())}

    def restore(self) -> None:
        self.value.load_state_dict(copy.deepcopy(self.saved["optimizer"]))
        self.value.hook_state.load_state_dict(copy.deepcopy(self.saved["hook"]))


def _handler_for(value: Any) -> _Handler | None:
    if isinstance(value, ShardedOptimizer):
        return _ShardedOptimizerHandler(value)
    kinds = (torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler, ElasticSampler)
    if isinstance(value, DistributedOptimizer) and callable(getattr(value.hook_state, "state_dict", None)):
        return _HookedOptimizerHandler(value)
    return _Handler(value) if isinstance(value, kinds) else None


class TorchState(ObjectState):
    """State of a PyTorch training: models, optimizers, LR schedulers, samplers, and plain values.

    Each keyword whose value is a ``torch.nn.Module``, ``torch.optim.Optimizer`` (a
    ``DistributedOptimizer``, ``LocalSGD`` or ``DiLoCo`` too), LR scheduler or
    :class:`ElasticSampler` is kept through its ``state_dict``; any other value is a plain
    attribute (``state.epoch``). Assigning such an object anew (``state.model = other``)
    tracks the new one. A ``DistributedOptimizer``'s stateful hook (PowerSGD) is kept with
    it: what the ranks share (call counts, Q) comes from the commit, and each rank's error
    feedback starts again at zero.

    A sharded optimizer (``shard_optimizer_state=True``) is kept as its parts: each rank's
    saved copy holds its own parameters' state, each host's commit every rank's (one
    whole copy per host), and the next world re-splits it by its own partition.

    Example:
        >>> state = TorchState(model=model, optimizer=opt, epoch=0, step=0)   # doctest: +SKIP
    """

    _handlers: dict[str, _Handler]

    def __init__(self, model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None,
                 **values: Any) -> None:
        values = {"model": model, "optimizer": optimizer, **values}
        handlers = {name: h for name, v in values.items() if (h := _handler_for(v)) is not None}
        object.__setattr__(self, "_handlers", handlers)
        for name, handler in handlers.items():
            object.__setattr__(self, name, handler.value)
        super().__init__(**{k: v for k, v in values.items() if k not in handlers})

    def __setattr__(self, name: str, value: Any) -> None:
        handlers: dict[str, _Handler] = self.__dict__.get("_handlers", {})
        if name in handlers:
            handlers[name] = _Handler(value)
        object.__setattr__(self, name, value)

    def save(self) -> None:
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def saved_bytes(self) -> bytes:
        buffer = io.BytesIO()
        torch.save({"objects": {name: h.replicated() for name, h in self._handlers.items()},
                    "values": self._saved_state}, buffer)
        return buffer.getvalue()

    def load_saved_bytes(self, payload: bytes) -> None:
        data = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=False)
        for name, saved in data["objects"].items():
            if name in self._handlers:
                self._handlers[name].load_replicated(saved)
        self._saved_state = data["values"]

    # A sharded optimizer's state: this rank's part in memory, one whole copy per host's commit.
    def _sharded(self) -> dict[str, _ShardedOptimizerHandler]:
        return {n: h for n, h in self._handlers.items() if isinstance(h, _ShardedOptimizerHandler)}

    def sharded_entries(self) -> dict[str, bytes] | None:
        sharded = self._sharded()
        if not sharded:
            return None
        out: dict[str, bytes] = {}
        for name, handler in sharded.items():
            out.update(handler.entries(name))
        return out

    def sharded_owner(self, key: str) -> int:
        name, index = key.rsplit("/", 1)
        return self._sharded()[name].owner(int(index))

    def load_sharded_entries(self, entries: dict[str, bytes]) -> None:
        for name, handler in self._sharded().items():
            handler.load_entries({int(k.rsplit("/", 1)[1]): blob for k, blob in entries.items()
                                  if k.rsplit("/", 1)[0] == name})


def preload() -> None:
    """Warm-up for the elastic agent (entry point ``ddl.preload``): PyTorch imports much of
    itself on first use (an optimizer's first construction: seconds), so pay that once there."""
    parameter = torch.nn.Parameter(torch.zeros(1))
    torch.optim.SGD([parameter], lr=0.1, momentum=0.9)
    torch.optim.Adam([parameter], lr=0.1)
    np.zeros(1)


__all__ = ["ElasticSampler", "HorovodInternalError", "HostsUpdatedInterrupt", "ObjectState", "State",
           "TorchState", "run", "updates_pending", "world_number"]
