"""Horovod's Adasum optimizer: each rank steps locally, and the parameter changes are
combined by Adasum (``DistributedOptimizer(..., op=ddl.Adasum)`` returns one)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import ddl
import torch
from ddl.base.ops import ReduceOp
from ddl.runtime import api


class DistributedAdasumOptimizer:
    """Wraps a torch optimizer so each ``step()`` applies the Adasum of every rank's update.

    ``step()`` remembers the parameters, runs the wrapped optimizer on the local
    gradients, and replaces each parameter's change by the Adasum over the ranks of
    everyone's changes (one grouped request per step; each tensor combined on its own).
    Everything else (``param_groups``, ``state``, ``zero_grad``, ``state_dict``) is the
    wrapped optimizer's. Gradients of ``backward_passes_per_step`` passes accumulate
    locally (the step runs on their sum).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, named_parameters: Iterable[Any] | None = None,
                 compression: Any = None, backward_passes_per_step: int = 1, op: Any = ReduceOp.ADASUM,
                 gradient_predivide_factor: float = 1.0, num_groups: int = 0, groups: Any = None,
                 sparse_as_dense: bool = False, process_set: Any = None, **_: Any) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"DistributedOptimizer wraps a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if process_set is not None and process_set.process_set_id not in (None, 0):
            raise NotImplementedError("Adasum over a process set is not supported (as in Horovod); "
                                      "use the global process set")
        self.__dict__["optimizer"] = optimizer
        self.backward_passes_per_step = backward_passes_per_step
        self._skip = False

    def __getattr__(self, name: str) -> Any:
        inner = self.__dict__.get("optimizer")
        if inner is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("param_groups", "state", "defaults"):
            setattr(self.optimizer, name, value)
        else:
            self.__dict__[name] = value

    def _params(self) -> list[torch.Tensor]:
        return [p for g in self.optimizer.param_groups for p in g["params"] if p.requires_grad]

    def synchronize(self) -> None:
        """Nothing to wait for: Adasum combines the parameter changes inside ``step()``."""

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Step locally, then combine every rank's change of each parameter by Adasum."""
        params = self._params()
        start = [p.detach().clone() for p in params]
        loss = self.optimizer.step(closure) if closure is not None else self.optimizer.step()
        if ddl.size() > 1 and params:
            with torch.no_grad():
                deltas = [(p.detach() - s).cpu().contiguous().numpy() for p, s in zip(params, start, strict=True)]
                combined = api.grouped_allreduce(deltas, op=ReduceOp.ADASUM, name="ddl.torch.adasum")
                for p, s, d in zip(params, start, combined, strict=True):
                    p.copy_(s + torch.from_numpy(d).to(p.device, p.dtype))
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()  # type: ignore[no-any-return]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)

    def __repr__(self) -> str:
        return f"ddl.torch.DistributedAdasumOptimizer({self.optimizer!r})"
