"""What an optimizer wrapper of ddl.torch passes through to the optimizer it wraps.

DistributedOptimizer and LocalSGD/DiLoCo are ``torch.optim.Optimizer`` subclasses (so
schedulers, GradScaler and ``isinstance`` checks accept them) that own no parameter
groups or state of their own: those are the wrapped optimizer's, read and written
through, so a scheduler that sets ``lr`` on the wrapper sets it where the step reads it.
"""

from __future__ import annotations

from typing import Any

import torch


class PassesThrough(torch.optim.Optimizer):
    """``param_groups``, ``state``, ``defaults`` and any other attribute are those of
    ``self.optimizer`` (set in ``__dict__`` by the subclass, before anything reads them)."""

    optimizer: Any  # the wrapped torch.optim.Optimizer

    @property  # type: ignore[override]
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups  # type: ignore[no-any-return]

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = value

    @property  # type: ignore[override]
    def state(self) -> Any:
        return self.optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self.optimizer.state = value

    @property  # type: ignore[override]
    def defaults(self) -> dict[str, Any]:
        return self.optimizer.defaults  # type: ignore[no-any-return]

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self.optimizer.defaults = value

    def __getattr__(self, name: str) -> Any:
        # Anything else (hook registries, private fields) is the wrapped optimizer's.
        inner = self.__dict__.get("optimizer")
        if inner is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(inner, name)
