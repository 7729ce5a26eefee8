"""Local SGD and DiLoCo: ranks train alone for ``period`` steps, then combine what they learnt.

Both keep an *anchor*, the weights every rank agreed on at the last outer step. Every
``period`` inner steps each rank's *pseudo-gradient* (anchor - its weights) is averaged
over the ranks (through a communication hook: plain, fp16, or PowerSGD) and an outer
update moves the anchor:

- :class:`LocalSGD` (Stich 2019, "Local SGD converges fast and communicates little"):
  anchor - average, i.e. the average of the ranks' weights;
- :class:`DiLoCo` (Douillard et al. 2023, arXiv:2311.08105): an outer optimizer takes
  the average as its gradient (Nesterov SGD, lr 0.7, momentum 0.9 by default, as in
  the paper).

With ``overlap=k`` the average travels while the next ``k`` inner steps run (streaming
DiLoCo's idea, Douillard et al. 2025): the outer update is applied k steps late, and the
steps a rank took meanwhile are kept on top of it (weights = new anchor + what this rank
moved since the round started). ``synchronize()`` brings every rank to the same weights
(call it before evaluating or saving when ``overlap`` is on, or between rounds).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from ddl.base.ops import ReduceOp
from ddl.engine.hooked import HookedBuckets, Pending
from ddl.engine.naming import manifest_name
from ddl.engine.periodic import RoundSchedule
from ddl.runtime import api
from ddl.runtime.process_sets import global_process_set

from . import kernels
from .collectives import grouped_allreduce_
from .optimizer import DistributedOptimizer
from .tensors import from_numpy, numpy_dtype
from .wrapping import PassesThrough

__all__ = ["DiLoCo", "LocalSGD"]


class _Periodic(PassesThrough):
    """The shared machinery: the anchor, the rounds of pseudo-gradients, overlap, state."""

    _kind = "periodic"

    def __init__(self, inner: torch.optim.Optimizer, params: list[torch.Tensor], *, period: int, compression: Any,
                 overlap: int, process_set: Any) -> None:
        if not isinstance(inner, torch.optim.Optimizer):
            raise TypeError(f"{type(self).__name__} wraps a torch.optim.Optimizer, got {type(inner).__name__}")
        if isinstance(inner, DistributedOptimizer):
            raise TypeError(f"{type(self).__name__} wraps a plain optimizer (each rank steps alone between rounds), "
                            "not a DistributedOptimizer (sharded or not): pass the optimizer it wraps")
        self._schedule = RoundSchedule.checked(type(self).__name__, period, overlap)
        if not params:
            raise ValueError(f"{type(self).__name__}: no parameters to average")
        for p in params:
            if not p.dtype.is_floating_point:
                raise TypeError(f"{type(self).__name__} averages floating-point parameters, got one of {p.dtype}")
        self.__dict__["optimizer"] = inner
        self.period, self.overlap = period, overlap
        self._params = params
        self._process_set = None if process_set is None or process_set.process_set_id == 0 else process_set
        manifest = [(tuple(p.shape), str(p.dtype)) for p in params]
        self._rounds = HookedBuckets([tuple(p.shape) for p in params], [numpy_dtype(p.dtype) for p in params],
                                     hook=compression, name=manifest_name(f"ddl.torch.{self._kind}", manifest),
                                     matmul=kernels.matmul)
        self._anchor: list[torch.Tensor] | None = None  # taken at the first step: after the user's broadcast
        self._boundary: list[torch.Tensor] = []  # the weights when the round in flight started
        self._pending: Pending | None = None
        self._landed: list[torch.Tensor] | None = None  # a round's average, finished but not applied yet
        self._merge_at = 0
        self.steps = 0  # inner steps taken
        self._unsent = 0  # inner steps whose progress no round has carried yet

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The inner optimizer's ``zero_grad``."""
        self.optimizer.zero_grad(set_to_none=set_to_none)

    @property
    def hook_state(self) -> Any:
        """The pseudo-gradients' hook state (PowerSGD's), None for a plain compressor."""
        return self._rounds.state

    # -- the steps -----------------------------------------------------------------------
    #: ``torch.amp.GradScaler.step(opt)`` calls ``step()`` on every rank, skipped or not, with
    #: ``grad_scale`` and ``found_inf`` set: a rank whose gradients overflowed skips its inner
    #: step alone, and every rank still counts the step, so the rounds stay aligned.
    _step_supports_amp_scaling = True

    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        """One inner step on this rank's gradients; every ``period`` steps, an outer step.

        Under a ``GradScaler`` (``scaler.step(opt)``) the inner step is skipped on a rank
        whose gradients are not finite, and the gradients are unscaled here if
        ``scaler.unscale_(opt)`` did not do it; the step is counted on every rank.
        """
        if self._anchor is None:
            self._anchor = [p.detach().clone() for p in self._params]
        found_inf, grad_scale = self.__dict__.get("found_inf"), self.__dict__.get("grad_scale")
        if found_inf is not None and float(found_inf) > 0:
            loss = None  # this rank's gradients overflowed: its inner step is skipped, as GradScaler does
        else:
            if grad_scale is not None:
                _unscale(self.optimizer, grad_scale)
            loss = self.optimizer.step(closure) if closure is not None else self.optimizer.step()
        self.steps += 1
        self._unsent += 1
        if self._pending is not None:
            self._pending.done()  # moves a PowerSGD round on
        if self._schedule.merge_due(self.steps, self._in_flight(), self._merge_at):
            self._merge()
        if self._schedule.round_due(self.steps):
            self._start_round()
            if self._schedule.waits:
                self._merge()
        return loss

    def synchronize(self) -> None:
        """Every rank to the same weights now: finish the round in flight and average the
        steps taken since (an outer step over them, if any). A collective call."""
        if self._in_flight():
            self._merge()
        if self._schedule.last_round_due(self._unsent, self._anchor is not None):
            self._start_round()
            self._merge()

    def _in_flight(self) -> bool:
        """A round started and not applied yet (travelling, or landed and waiting for its step)."""
        return self._pending is not None or self._landed is not None

    def _start_round(self) -> None:
        assert self._anchor is not None
        with torch.no_grad():
            for view, a, p in zip(self._rounds.views(), self._anchor, self._params, strict=True):
                host = _host_tensor(view, a.dtype)
                if a.device.type == "cpu":
                    torch.sub(a, p, out=host)
                else:
                    host.copy_(a - p)
            self._boundary = [p.detach().clone() for p in self._params]
        self._average_buffers()
        self._pending = self._rounds.start(api.collectives(self._process_set))
        self._merge_at = self._schedule.merge_at(self.steps)
        self._unsent = 0

    def in_sync(self) -> bool:
        """Whether every rank holds the same weights now: no round in flight or waiting to be
        applied, and no step since the last one (or none at all)."""
        return self._pending is None and self._landed is None and (self._unsent == 0 or self._anchor is None)

    def _land(self) -> None:
        """Finish the round in flight (a collective) and keep its average, not applied yet."""
        if self._pending is not None:
            assert self._anchor is not None
            self._landed = [from_numpy(v, a).clone() for v, a in zip(self._pending.wait(), self._anchor, strict=True)]
            self._pending = None

    def _merge(self) -> None:
        """Apply the finished round: the outer update of the anchor, then this rank's weights
        = new anchor + what it moved since the round started (nothing without overlap)."""
        self._land()
        assert self._landed is not None and self._anchor is not None
        averaged, self._landed = self._landed, None
        with torch.no_grad():
            moved = [p - b for p, b in zip(self._params, self._boundary, strict=True)]
            self._outer_update(averaged)
            for p, a, d in zip(self._params, self._anchor, moved, strict=True):
                p.copy_(a)
                if self.overlap:
                    p.add_(d)
        self._boundary = []

    def _outer_update(self, averaged: list[torch.Tensor]) -> None:
        raise NotImplementedError

    def _average_buffers(self) -> None:
        """Model buffers (BatchNorm statistics) are averaged at every round (DiLoCo only)."""

    # -- state ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Inner optimizer, anchor, step count, hook state (and outer optimizer). A round in
        flight is finished first (every rank commits at the same step, so all do) and kept
        with the weights it started from, to be applied when it would have been."""
        self._land()
        hook = getattr(self._rounds.state, "state_dict", None)
        return {"inner": self.optimizer.state_dict(), "steps": self.steps, "unsent": self._unsent,
                "anchor": _copies(self._anchor), "landed": _copies(self._landed),
                "boundary": _copies(self._boundary) if self._landed is not None else None,
                "merge_at": self._merge_at, "hook": hook() if hook is not None else None}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a :meth:`state_dict` (PowerSGD's rank-local errors start at zero)."""
        self.optimizer.load_state_dict(state_dict["inner"])
        self.steps, self._unsent = int(state_dict["steps"]), int(state_dict.get("unsent", 0))
        self._anchor = self._like_params(state_dict.get("anchor"))
        self._landed = self._like_params(state_dict.get("landed"))
        self._boundary = self._like_params(state_dict.get("boundary")) or []
        self._merge_at = int(state_dict.get("merge_at", self.steps))
        self._pending = None
        load = getattr(self._rounds.state, "load_state_dict", None)
        if load is not None and state_dict.get("hook") is not None:
            load(state_dict["hook"])

    def _synchronize_saved(self, replicas: list[list[torch.Tensor]], boundaries: list[list[torch.Tensor]] | None) -> None:
        """What :meth:`synchronize` would have done when a checkpoint was saved, from every
        saved rank's weights (``replicas``; ``boundaries``: where each started the landed
        round), without a collective: a world of another size continues from the one point
        every saved rank would have reached. The anchor, landed round and counters must be
        loaded already; the parameters end at the new anchor."""
        assert self._anchor is not None
        with torch.no_grad():
            if self._landed is not None:
                assert boundaries is not None
                averaged, self._landed = self._landed, None
                self._outer_update(averaged)
                replicas = [[a + (w - b) for a, w, b in zip(self._anchor, ws, bs, strict=True)]
                            for ws, bs in zip(replicas, boundaries, strict=True)]
            if self._unsent:
                self._outer_update([torch.stack([a - ws[i] for ws in replicas]).mean(0)
                                    for i, a in enumerate(self._anchor)])
            for p, a in zip(self._params, self._anchor, strict=True):
                p.copy_(a)
        self._unsent, self._boundary, self._pending = 0, [], None

    def _like_params(self, tensors: Any) -> list[torch.Tensor] | None:
        """Saved tensors, one per parameter, on the parameters' devices and dtypes (None stays None)."""
        if tensors is None:
            return None
        return [torch.as_tensor(t).to(p.device, p.dtype).clone() for t, p in zip(tensors, self._params, strict=True)]

    def __repr__(self) -> str:
        return f"ddl.torch.{type(self).__name__}({self.optimizer!r}, period={self.period}, overlap={self.overlap})"


class LocalSGD(_Periodic):
    """Local SGD: each rank steps on its own gradients; every ``period`` steps the weights are averaged.

    Wraps a plain optimizer (not a ``DistributedOptimizer``: nothing is reduced per step).
    What travels is each rank's change since the last average, so it can be compressed.
    With ``period=1`` and plain SGD it is synchronous data-parallel SGD (to rounding).
    Optimizer state (momentum) stays each rank's own, as in Lin et al.'s post-local SGD.

    Args:
        optimizer: a ``torch.optim.Optimizer`` over the parameters to keep in sync.
        period: H, inner steps between averages (>= 1).
        compression: how the changes travel: ``ddl.Compression.none`` (default), ``.fp16``,
            ``.bf16`` or ``ddl.PowerSGD(...)``.
        overlap: inner steps the average may take in the background (0: wait; up to ``period``).
        process_set: average over this ``ddl.ProcessSet`` only.

    Raises:
        ValueError: ``period`` < 1, ``overlap`` outside 0..period, no parameters.
        TypeError: not a torch optimizer, or a parameter that is not floating-point.

    Example:
        >>> opt = ddl.torch.LocalSGD(torch.optim.SGD(model.parameters(), lr=0.1), period=8)  # doctest: +SKIP
        >>> ddl.torch.broadcast_parameters(model.state_dict(), root_rank=0)                   # doctest: +SKIP
        >>> loss.backward(); opt.step(); opt.zero_grad()                                      # doctest: +SKIP
    """

    _kind = "localsgd"

    def __init__(self, optimizer: torch.optim.Optimizer, period: int, *, compression: Any = None, overlap: int = 0,
                 process_set: Any = None) -> None:
        params = [p for g in getattr(optimizer, "param_groups", []) for p in g["params"]]
        super().__init__(optimizer, params, period=period, compression=compression, overlap=overlap,
                         process_set=process_set)

    def _outer_update(self, averaged: list[torch.Tensor]) -> None:
        assert self._anchor is not None
        for a, d in zip(self._anchor, averaged, strict=True):
            a.sub_(d)  # anchor - mean(anchor - w_i) = mean(w_i)


class DiLoCo(_Periodic):
    """DiLoCo: inner steps on each rank alone, an outer optimizer on the averaged pseudo-gradient.

    Every ``period`` inner steps, the pseudo-gradient anchor - weights is averaged over the
    ranks and handed to ``outer_optimizer`` as the gradient of the anchor weights; every
    rank then continues from the new anchor. Model buffers (BatchNorm statistics) are
    averaged at each outer step. With ``period=1``, inner SGD and outer SGD at lr 1 without
    momentum it is synchronous SGD (to rounding).

    Args:
        model: the model trained (its parameters are the outer optimizer's).
        inner_optimizer: a ``torch.optim.Optimizer`` over the model's parameters (AdamW in
            the paper); not a ``DistributedOptimizer``.
        outer_optimizer: a ``torch.optim.Optimizer`` over the same parameters; default
            ``SGD(lr=0.7, momentum=0.9, nesterov=True)``, the paper's.
        period: H, inner steps per outer step (500 in the paper; >= 1).
        compression: how pseudo-gradients travel: ``ddl.Compression.none`` (default),
            ``.fp16`` (OpenDiLoCo's, without loss), ``.bf16`` or ``ddl.PowerSGD(...)``.
        overlap: inner steps the average may take in the background (0: wait; up to ``period``).
        process_set: average over this ``ddl.ProcessSet`` only.

    Raises:
        ValueError: ``period`` < 1, ``overlap`` outside 0..period, optimizers over other
            parameters than the model's.
        TypeError: not torch optimizers.

    Example:
        >>> inner = torch.optim.AdamW(model.parameters(), lr=1e-3)                   # doctest: +SKIP
        >>> opt = ddl.torch.DiLoCo(model, inner, period=50, compression=ddl.Compression.fp16)  # doctest: +SKIP
        >>> loss.backward(); opt.step(); opt.zero_grad()                             # doctest: +SKIP
    """

    _kind = "diloco"

    def __init__(self, model: torch.nn.Module, inner_optimizer: torch.optim.Optimizer,
                 outer_optimizer: torch.optim.Optimizer | None = None, *, period: int, compression: Any = None,
                 overlap: int = 0, process_set: Any = None) -> None:
        params: list[torch.Tensor] = [p for p in model.parameters() if p.requires_grad]
        if outer_optimizer is None:
            outer_optimizer = torch.optim.SGD(params, lr=0.7, momentum=0.9, nesterov=True)
        if not isinstance(outer_optimizer, torch.optim.Optimizer):
            raise TypeError(f"outer_optimizer must be a torch.optim.Optimizer, got {type(outer_optimizer).__name__}")
        for what, opt in (("inner_optimizer", inner_optimizer), ("outer_optimizer", outer_optimizer)):
            held = {id(p) for g in getattr(opt, "param_groups", []) for p in g["params"]}
            if held != {id(p) for p in params}:
                raise ValueError(f"DiLoCo: the {what} must hold exactly the model's trainable parameters "
                                 f"({len(params)}); it holds {len(held)} tensors")
        self.__dict__["outer_optimizer"] = outer_optimizer
        self.__dict__["model"] = model
        super().__init__(inner_optimizer, params, period=period, compression=compression, overlap=overlap,
                         process_set=process_set)
        self._buffers = [b for b in model.buffers() if b.dtype.is_floating_point]

    def _outer_update(self, averaged: list[torch.Tensor]) -> None:
        assert self._anchor is not None
        saved = [p.grad for p in self._params]
        for p, a, d in zip(self._params, self._anchor, averaged, strict=True):
            p.copy_(a)
            p.grad = d.to(p.dtype)
        self.outer_optimizer.step()
        for p, a, g in zip(self._params, self._anchor, saved, strict=True):
            a.copy_(p)
            p.grad = g

    def _average_buffers(self) -> None:
        if not self._buffers:
            return
        grouped_allreduce_(self._buffers, op=ReduceOp.AVERAGE, name=f"{self._rounds.name}.buffers",
                           process_set=self._process_set or global_process_set)

    def state_dict(self) -> dict[str, Any]:
        """The shared state plus the outer optimizer's."""
        out = super().state_dict()
        out["outer"] = self.outer_optimizer.state_dict()
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        if "outer" in state_dict:
            self.outer_optimizer.load_state_dict(state_dict["outer"])


def _copies(tensors: list[torch.Tensor] | None) -> list[torch.Tensor] | None:
    return None if tensors is None else [t.detach().clone() for t in tensors]


def _unscale(optimizer: torch.optim.Optimizer, grad_scale: torch.Tensor) -> None:
    """Divide the gradients by the loss scale, as ``GradScaler.unscale_`` (its float64 reciprocal)."""
    inv = grad_scale.double().reciprocal().float()
    with torch.no_grad():
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    (p.grad._values() if p.grad.is_sparse else p.grad).mul_(inv.to(p.grad.device))


def _host_tensor(view: Any, dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor of ``dtype`` sharing memory with the numpy ``view``."""
    return from_numpy(view, torch.empty(0, dtype=dtype))
