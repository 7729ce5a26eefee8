"""ZeRO stage 1 for torch: each rank keeps the optimizer state of its part of the parameters.

``DistributedOptimizer(opt, shard_optimizer_state=True)`` and the drop-in
:class:`ZeroRedundancyOptimizer` are this class. The wrapped optimizer keeps every
parameter in its ``param_groups`` (so LR schedulers and hyperparameters work unchanged on
the wrapper or on the optimizer itself), but at ``step()`` only the parameters this rank
owns have a gradient, so it updates them alone and creates state for them alone. Which
rank owns what is :func:`ddl.reduction.partition.partition_by_bytes` of the parameter
manifest: the same on every rank, derived again whenever the parameters or the world
change (the state that changes hands moves with it).
"""

from __future__ import annotations

import pickle
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

import ddl
import torch
from ddl.reduction.partition import Partition, partition_by_bytes
from ddl.runtime import api

from .optimizer import DistributedOptimizer, _all_params
from .reducer import Reducer
from .sharded_reducer import ShardedReducer
from .tensors import to_cpu

_NOT_CONSOLIDATED = ("the optimizer state of a sharded optimizer is spread over the ranks: call "
                     "optimizer.consolidate_state_dict(to=R) on every rank, then state_dict() on rank R; or save "
                     "with ddl.torch.checkpoint.save(path, model=..., optimizer=...), which writes each rank's part")


class ShardedOptimizer(DistributedOptimizer):
    """``DistributedOptimizer(..., shard_optimizer_state=True)``: ZeRO stage 1 (see the module docstring).

    Differences from the unsharded wrapper, each for a reason:

    - ``state`` holds this rank's parameters' state only, and ``state_dict()`` needs
      :meth:`consolidate_state_dict` first (a part passed off as the whole would load
      silently wrong into one process); :meth:`shard_state_dict` is this rank's part.
    - ``load_state_dict(sd)`` takes a one-process ``state_dict`` and keeps this rank's part.
    - after ``step()`` every ``.grad`` is None: the gradient buffers carry the updated
      parameters back. Call ``synchronize()`` before reading gradients (clipping): it
      gives every rank every reduced gradient, as the unsharded wrapper does.
    - gradients travel in their own dtype (no ``compression``), over every rank (no
      ``process_set``); sparse ones travel densified and their owner makes them sparse again.

    Horovod's start-up recipe works unchanged: ``broadcast_optimizer_state(opt, root_rank)``
    gives every rank its part of the root's state as it was when the root wrapped its
    optimizer or last called ``load_state_dict`` (a checkpoint the root alone loaded), and
    the root's hyperparameters as they are at the broadcast (a scheduler built or a learning
    rate set after wrapping included); once training has stepped, the state is one logical
    state already and only the hyperparameters travel.

    Example:
        >>> opt = ddl.torch.DistributedOptimizer(torch.optim.Adam(model.parameters()),  # doctest: +SKIP
        ...                                      named_parameters=model.named_parameters(),
        ...                                      shard_optimizer_state=True)
    """

    # -- partition and state movement ------------------------------------------------------
    def _new_reducer(self, params: list[torch.Tensor], prefix: str, *, order: list[int] | None,
                     check: bool) -> Reducer:
        me = ddl.rank() if ddl.is_initialized() else 0
        partition = partition_of(params, ddl.size() if ddl.is_initialized() else 1)
        owners = {p: partition.owners[i] for i, p in enumerate(params) if p.requires_grad}
        previous: dict[torch.Tensor, int] | None = self.__dict__.get("_owners")
        if previous is None:
            # The state this rank holds as it wraps the optimizer, for broadcast_optimizer_state.
            self._pending: dict[str, Any] | None = self.optimizer.state_dict() if check else None
            self._consolidated: dict[str, Any] | None = None
        elif check and ddl.size() > 1:
            self._move_state(params, previous, owners, prefix)
        self._owners, self._partition, self._rank = owners, partition, me
        for p in list(self.optimizer.state):
            if owners.get(p) != me:
                del self.optimizer.state[p]
        return ShardedReducer(params, self._names, self._options, prefix, owners=owners, rank=me, order=order,
                              no_sync=self.__dict__.get("_no_sync", False))

    def _move_state(self, params: list[torch.Tensor], old: dict[torch.Tensor, int], new: dict[torch.Tensor, int],
                    prefix: str) -> None:
        """Hand the state of parameters whose owner changed to their new owner (a collective)."""
        me, state = ddl.rank(), self.optimizer.state
        leaving = {i: to_cpu(state[p]) for i, p in enumerate(params)
                   if old.get(p) == me and new.get(p) != me and p in state}
        arriving: dict[int, Any] = {}
        for theirs in api.allgather_object(leaving, name=f"{prefix}.reshard"):
            arriving.update({i: s for i, s in theirs.items() if new.get(params[i]) == me})
        if arriving:
            sd = self.optimizer.state_dict()
            sd["state"].update(arriving)
            self.optimizer.load_state_dict(sd)

    @property
    def partition(self) -> Partition:
        """Which rank owns each parameter, by its place in ``param_groups`` (frozen ones: nobody)."""
        return self._partition  # type: ignore[no-any-return]

    def owns(self, p: torch.Tensor) -> bool:
        """Whether this rank updates ``p`` and keeps its state."""
        return bool(self._owners.get(p) == self._rank)

    # -- the step ----------------------------------------------------------------------------
    def synchronize(self) -> None:
        """Finish the gradient exchange and give every rank every reduced gradient in ``.grad``
        (the owners alone get theirs when ``step()`` synchronizes by itself)."""
        self._reducer.full_gradients = True  # type: ignore[attr-defined]
        super().synchronize()

    def _reduce_before_unscale(self, scaler: Any) -> None:
        """``GradScaler.unscale_`` reads every gradient: give every rank all of them (with only
        its own, each rank would find inf in its part alone and skip other steps)."""
        self._reducer.full_gradients = True  # type: ignore[attr-defined]
        super()._reduce_before_unscale(scaler)

    def _sync(self) -> None:
        params = _all_params(self.optimizer)
        if len(params) != len(self._known) or any(a is not b for a, b in zip(params, self._known, strict=True)):
            raise RuntimeError("the optimizer's parameters changed behind the sharded DistributedOptimizer's back; "
                               "add parameters with optimizer.add_param_group(...) on every rank, which re-partitions "
                               "them and moves their state")
        super()._sync()

    def step(self, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:  # type: ignore[override]
        """Synchronize, update this rank's parameters, then gather every rank's updates."""
        reducer: ShardedReducer = self._reducer  # type: ignore[assignment]
        if closure is not None:
            def reduced_closure() -> Any:
                with torch.enable_grad():
                    loss = closure()
                self._sync()
                reducer.release_foreign_gradients()
                return loss

            loss = self.optimizer.step(reduced_closure, **kwargs)
        else:
            if not self._skip:
                if self.__dict__.get("_user_synchronized"):
                    warnings.warn("optimizer.step() called without optimizer.skip_synchronize() context after "
                                  "optimizer.synchronize(). This can cause training slowdown. You may want to "
                                  "consider using optimizer.skip_synchronize() context if you use "
                                  "optimizer.synchronize() in your code.", stacklevel=2)
                self._sync()
            reducer.release_foreign_gradients()
            loss = self.optimizer.step(**kwargs)
        self.__dict__["_user_synchronized"] = False
        self._pending = None
        reducer.gather_parameters()
        return loss

    # -- state -------------------------------------------------------------------------------
    def shard_state_dict(self) -> dict[str, Any]:
        """This rank's part: a ``state_dict()`` whose ``state`` holds the parameters it owns
        (indexed, as one process's, by place in ``param_groups``)."""
        return self.optimizer.state_dict()  # type: ignore[no-any-return]

    def consolidate_state_dict(self, to: int = 0) -> None:
        """Collect the whole state on rank ``to`` (a collective: call it on every rank); then
        ``state_dict()`` there returns it, as one process's optimizer would.

        Raises:
            ValueError: ``to`` is not a rank of this job.
        """
        size = ddl.size()
        if not 0 <= to < size:
            raise ValueError(f"consolidate_state_dict(to={to}): not a rank of this job of {size}")
        mine = self.shard_state_dict()
        parts = [mine["state"]]
        if size > 1:
            data = np.frombuffer(pickle.dumps(to_cpu(mine["state"]), protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
            splits = [0] * size
            splits[to] = data.size
            got, counts = api.alltoall(data, splits, name=f"{self._prefix}.consolidate")
            bounds = np.cumsum([0, *counts])
            if ddl.rank() == to:
                parts = [pickle.loads(got[bounds[r] : bounds[r + 1]].tobytes()) for r in range(size)]
        if ddl.rank() != to:
            self._consolidated = None
            return
        state: dict[int, Any] = {}
        for part in parts:
            state.update(part)
        self._consolidated = {"state": dict(sorted(state.items())), "param_groups": mine["param_groups"]}

    def state_dict(self) -> dict[str, Any]:
        """The whole state as :meth:`consolidate_state_dict` last collected it on this rank.

        Raises:
            RuntimeError: it was not collected here.
        """
        consolidated: dict[str, Any] | None = self.__dict__.get("_consolidated")
        if consolidated is None:
            raise RuntimeError(_NOT_CONSOLIDATED)
        return consolidated

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a one-process ``state_dict`` (this optimizer's class), keeping this rank's part."""
        params = _all_params(self.optimizer)
        mine = {i: s for i, s in state_dict["state"].items()
                if 0 <= int(i) < len(params) and self.owns(params[int(i)])}
        self.optimizer.load_state_dict({"state": mine, "param_groups": state_dict["param_groups"]})
        self._pending = state_dict

    def load_shard(self, state_dict: dict[str, Any]) -> None:
        """Load a ``state_dict`` that holds (at least) this rank's part, as every rank does from a
        checkpoint: the state is then whole across the ranks, and ``broadcast_optimizer_state``
        sends hyperparameters only."""
        params = _all_params(self.optimizer)
        mine = {i: s for i, s in state_dict["state"].items() if self.owns(params[int(i)])}
        self.optimizer.load_state_dict({"state": mine, "param_groups": state_dict["param_groups"]})
        self._pending = None

    def broadcast_state(self, root_rank: int) -> None:
        """``broadcast_optimizer_state`` for a sharded optimizer (see the class docstring).

        The root sends the state it held when it wrapped its optimizer or last loaded one
        (the parts it no longer keeps), and its hyperparameters as they are now: a learning
        rate set, or a scheduler built, after wrapping (with the keys a scheduler adds, such
        as ``initial_lr``) reaches every rank as the root has it. The root changes nothing.
        """
        if ddl.rank() == root_rank:
            pending = self.__dict__.get("_pending")
            sent = {"state": None if pending is None else to_cpu(pending["state"]),
                    "param_groups": self.optimizer.state_dict()["param_groups"]}
        else:
            sent = None
        got = ddl.broadcast_object(sent, root_rank, name=f"{self._prefix}.broadcast_state")
        if ddl.rank() != root_rank:
            if got["state"] is not None:
                self.load_state_dict(got)
            else:
                for mine, theirs in zip(self.optimizer.param_groups, got["param_groups"], strict=True):
                    params = mine["params"]
                    mine.clear()  # the root's keys, no more and no fewer
                    mine.update({k: v for k, v in theirs.items() if k != "params"}, params=params)
        self._pending = None

    def __repr__(self) -> str:
        return f"ddl.torch.DistributedOptimizer({self.optimizer!r}, shard_optimizer_state=True)"


def partition_of(params: list[torch.Tensor], world_size: int) -> Partition:
    """The partition of ``params`` (in ``param_groups`` order) over ``world_size`` ranks: by
    bytes, frozen ones to nobody. Every rank and every later world derives the same from the
    same parameters.

    Example:
        >>> partition_of([torch.zeros(4), torch.zeros(2), torch.zeros(2)], 2).owners
        (0, 1, 1)
    """
    return partition_by_bytes([p.numel() * p.element_size() for p in params], world_size,
                              skip=[not p.requires_grad for p in params])


class ZeroRedundancyOptimizer(ShardedOptimizer):
    """``torch.distributed.optim.ZeroRedundancyOptimizer``'s signature and methods, on ddl.

    Builds ``optimizer_class(params, **defaults)`` and shards it over every ddl rank. Unlike
    torch's, it also reduces the gradients (during backward, in ddl's buckets): there is no
    ``DistributedDataParallel`` to put around the model. Each parameter belongs to one rank
    (bytes balanced, as torch's sorted-greedy partition), which alone keeps its state and
    updates it; the updated parameters then reach every rank.

    Args:
        params: an iterable of tensors or of parameter-group dicts.
        optimizer_class: the ``torch.optim.Optimizer`` class to shard.
        process_group: must be None (ddl shards over all its ranks).
        parameters_as_bucket_view: accepted; ddl's buckets are separate buffers either way.
        overlap_with_ddp: must be False (ddl overlaps the exchange with backward itself).
        named_parameters: ``model.named_parameters()``, for error messages and checkpoints
            (a ddl addition; keyword only).
        **defaults: the optimizer's arguments (``lr=...``).

    Raises:
        ValueError: a process group, or ``overlap_with_ddp=True``.

    Example:
        >>> opt = ddl.torch.ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,  # doctest: +SKIP
        ...                                         lr=1e-3)
        >>> loss.backward(); opt.step()  # doctest: +SKIP
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        return torch.optim.Optimizer.__new__(cls)

    def __init__(self, params: Iterable[Any], optimizer_class: type[torch.optim.Optimizer], process_group: Any = None,
                 parameters_as_bucket_view: bool = False, overlap_with_ddp: bool = False, *,
                 named_parameters: Iterable[tuple[str, torch.nn.Parameter]] | None = None, **defaults: Any) -> None:
        if process_group is not None:
            raise ValueError("ddl's ZeroRedundancyOptimizer shards over every ddl rank; pass process_group=None")
        if overlap_with_ddp:
            raise ValueError("ddl's ZeroRedundancyOptimizer reduces gradients itself during backward; there is no "
                             "DistributedDataParallel to overlap with: drop overlap_with_ddp=True")
        self.parameters_as_bucket_view = parameters_as_bucket_view
        super().__init__(optimizer_class(params, **defaults), named_parameters=named_parameters,
                         shard_optimizer_state=True)
        self.initialized = True

    @property
    def optim(self) -> torch.optim.Optimizer:
        """The local optimizer (torch's name): it holds every parameter, and state for this rank's."""
        return self.optimizer  # type: ignore[no-any-return]

    @property
    def world_size(self) -> int:
        return int(self._partition.world_size)

    @property
    def rank(self) -> int:
        return int(self._rank)

    def __repr__(self) -> str:
        return f"ddl.torch.ZeroRedundancyOptimizer({self.optimizer!r})"
