"""``torch.amp.GradScaler`` with ddl's optimizers: the gradients are reduced before the scaler reads them.

DDP has every gradient reduced when ``backward()`` returns, so its users write
``scaler.scale(loss).backward(); scaler.step(opt); scaler.update()``. ddl reduces while
backward runs and waits at ``step()``, so without help the scaler would unscale and check
for inf each rank's own gradients: the ranks would skip different steps, and the step
would use the reduced gradients still scaled. :func:`install` (run by ``import ddl.torch``)
wraps ``GradScaler.unscale_``, which ``scaler.step`` calls too, so that an optimizer that
defines ``_reduce_before_unscale`` (``DistributedOptimizer``, sharded or not) finishes its
reduction first: every rank then unscales, checks and skips on the same gradients, as one
process does. Other optimizers are untouched.
"""

from __future__ import annotations

import functools

import torch

_WRAPPED = "__ddl_reduces_first__"


def install() -> None:
    """Wrap ``torch.amp.GradScaler.unscale_`` once (its subclasses, ``torch.cuda.amp`` and
    ``torch.cpu.amp``, inherit it)."""
    scaler_class = torch.amp.GradScaler
    original = scaler_class.unscale_
    if getattr(original, _WRAPPED, False):
        return

    @functools.wraps(original)
    def unscale_(self: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> None:
        reduce_first = getattr(type(optimizer), "_reduce_before_unscale", None)  # the class's: no __getattr__
        if reduce_first is not None and self.is_enabled():
            reduce_first(optimizer, self)
        original(self, optimizer)

    setattr(unscale_, _WRAPPED, True)
    scaler_class.unscale_ = unscale_  # type: ignore[method-assign]
