"""Gradients reduced through a stateful communication hook (``ddl.PowerSGD``) in ``ddl.tensorflow``.

Keras reduces a step's gradients in one host call; with a stateful hook that call packs
them into :class:`ddl.engine.hooked.HookedBuckets` (kept per gradient list, so the hook's
state follows the same buckets every step) and hands each bucket to the hook. Keras
kernels keep their output dimension last (``(kh, kw, in, out)``, ``(in, out)``), so the
hook sees each as (everything else) x out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from ddl.base.ops import ReduceOp
from ddl.engine.compression import Compressor
from ddl.engine.hooked import HookedBuckets, Pending
from ddl.engine.hooks import CommHook, as_hook
from ddl.engine.powersgd import PowerSGD
from ddl.runtime import api

__all__ = ["HookedReducer", "as_reduction", "hook_config", "hook_from_config"]


class HookedReducer:
    """A stateful hook and its state, applied to lists of arrays named alike on every rank.

    Example:
        >>> reducer = HookedReducer(ddl.PowerSGD(rank=4))                                   # doctest: +SKIP
        >>> averaged = reducer.reduce(arrays, name="grads", op=ddl.Average, process_set=None)  # doctest: +SKIP
    """

    def __init__(self, hook: CommHook, state: Any = None) -> None:
        self.hook = hook
        self.state = hook.new_state() if state is None else state
        self._buckets: dict[tuple[str, ReduceOp], HookedBuckets] = {}

    def start(self, arrays: Sequence[np.ndarray], *, name: str, op: ReduceOp, process_set: Any) -> Pending:
        """Copy ``arrays`` into their buckets and start reducing them (returns at once)."""
        shapes = [tuple(a.shape) for a in arrays]
        buckets = self._buckets.get((name, op))
        if buckets is None or [v.shape for v in buckets.views()] != shapes:
            buckets = HookedBuckets(shapes, [a.dtype for a in arrays], hook=self.hook, name=name, op=op, out_axis=-1,
                                    state=self.state)
            self._buckets[(name, op)] = buckets
        for view, a in zip(buckets.views(), arrays, strict=True):
            view[...] = a
        return buckets.start(api.collectives(process_set))

    def reduce(self, arrays: Sequence[np.ndarray], *, name: str, op: ReduceOp, process_set: Any,
               loss_scale: float | None = None) -> list[np.ndarray]:
        """``arrays`` reduced over the ranks, as new arrays (the buckets are reused next step).

        One call reduces a whole step's gradients, so the hook's update of the step is kept
        only if every result is finite: a loss scaler skips the step otherwise, and the hook
        state stays as it was (PowerSGD's ``commit``). ``loss_scale``: the scale the
        gradients carry, which the hook's error memory follows.
        """
        transactional = all(hasattr(self.state, f) for f in ("commit", "rollback", "deferred"))
        if transactional:
            self.state.deferred = True
        if loss_scale is not None and hasattr(self.state, "loss_scale"):
            self.state.loss_scale = loss_scale
        out = [v.copy() for v in self.start(arrays, name=name, op=op, process_set=process_set).wait()]
        if transactional:
            if all(np.isfinite(v).all() for v in out):
                self.state.commit()
            else:
                self.state.rollback()
        return out


def as_reduction(compression: Any) -> Compressor | HookedReducer:
    """A compressor as it is; a stateful hook (or a HookedReducer) as a :class:`HookedReducer`.

    Raises:
        ValueError: neither a compressor nor a hook.
    """
    if isinstance(compression, HookedReducer):
        return compression
    hook = as_hook(compression)
    return hook if isinstance(hook, Compressor) else HookedReducer(hook)


def hook_config(value: Any) -> Any:
    """How a Keras ``get_config`` stores a compression: a compressor's name, PowerSGD's settings."""
    hook = value.hook if isinstance(value, HookedReducer) else value
    if isinstance(hook, Compressor):
        return hook.name
    if isinstance(hook, PowerSGD):
        return {"class_name": "PowerSGD", "config": dataclasses.asdict(hook)}
    raise ValueError(f"cannot save the communication hook {hook!r} in a Keras config; only ddl.Compression.* "
                     "and ddl.PowerSGD are saved")


def hook_from_config(value: Any) -> Any:
    """What :func:`hook_config` stored, as a compressor name or a PowerSGD hook again."""
    if isinstance(value, dict) and value.get("class_name") == "PowerSGD":
        return PowerSGD(**value["config"])
    return value
