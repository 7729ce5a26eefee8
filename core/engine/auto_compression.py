"""``compression="auto"``: compress a bucket only where the link time it saves exceeds its own work.

A compressor or PowerSGD trades work on the rank (casts, products, error feedback) for
bytes on the link. Between ranks of one host the "link" is shared memory, which moves
bytes about as fast as a cast touches them, so compression can only slow the step
there; across hosts it pays once the link is slow enough. :func:`decide` prices both
sides for one bucket on the cost model the engine chooses algorithms with (calibrated
at ``init`` where it was), and :class:`AutoCompression` is the hook object that asks it:
an adapter resolves it bucket by bucket (:meth:`AutoCompression.resolve`), and
``ddl plan`` prints the same decision. The inputs (topology, the agreed cost model,
shapes, fixed rates) are alike on every rank, so the ranks always decide alike.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from ddl.base.topology import Topology
from ddl.engine.compression import Compression, Compressor
from ddl.engine.hooks import CommHook, Traffic, as_hook, traffic
from ddl.reduction import cost
from ddl.reduction.step_plan import price

__all__ = ["DEFAULT_FLOP_RATE", "DEFAULT_MEMORY_RATE", "AutoCompression", "Decision", "as_hook_or_auto", "decide",
           "hook_seconds"]

#: Multiply-adds per second a rank's core gives a hook's products when none is measured.
DEFAULT_FLOP_RATE = 10e9
#: Bytes per second a rank's element-wise passes (casts, errors, copies) read and write.
DEFAULT_MEMORY_RATE = 5e9


@dataclasses.dataclass(frozen=True)
class Decision:
    """Whether one bucket is compressed, and why: the priced link seconds the hook saves
    against the seconds of its own work (``reason`` says it in words)."""

    compress: bool
    saved_s: float
    cost_s: float
    reason: str


def hook_seconds(hook: Compressor | CommHook, t: Traffic, count: int, itemsize: int, *,
                 flop_rate: float = DEFAULT_FLOP_RATE, memory_rate: float = DEFAULT_MEMORY_RATE) -> float:
    """The hook's own work on one bucket of ``count`` elements: a compressor's two casts
    (pack: read the values, write the wire; unpack: the reverse), a stateful hook's products
    and passes (:class:`~ddl.engine.hooks.Traffic`)."""
    if isinstance(hook, Compressor):
        wire = sum(r.itemsize for r in t.rounds[:1])
        return 0.0 if wire >= itemsize else 2.0 * count * (itemsize + wire) / memory_rate
    return t.flops / flop_rate + t.memory_bytes / memory_rate


def decide(hook: Compressor | CommHook, shapes: Sequence[tuple[int, ...]], itemsize: int, topology: Topology,
           model: cost.CostModel, *, out_axis: int = 0, flop_rate: float = DEFAULT_FLOP_RATE,
           memory_rate: float = DEFAULT_MEMORY_RATE) -> Decision:
    """Compress a bucket of ``shapes`` (elements of ``itemsize`` bytes) with ``hook``, or send it plainly?

    One host (every rank's peers behind shared memory): never. Otherwise: compress where
    the priced time of the plain allreduce minus the hook's rounds exceeds the hook's own
    work (:func:`hook_seconds`).

    Example:
        >>> decide(ddl.Compression.fp16, [(2048, 1024)], 4, topology, model).compress  # doctest: +SKIP
        False
    """
    count = sum(math.prod(s) for s in shapes)
    if topology.size == 1 or count == 0:
        return Decision(False, 0.0, 0.0, "one rank: nothing to send")
    t = traffic(hook, shapes, itemsize, out_axis=out_axis)
    work = hook_seconds(hook, t, count, itemsize, flop_rate=flop_rate, memory_rate=memory_rate)
    plain = sum(price("auto", topology, max(1, r.count), r.itemsize, model)
                for r in traffic(Compression.none, shapes, itemsize).rounds)
    hooked = sum(price("auto", topology, max(1, r.count), r.itemsize, model) for r in t.rounds)
    saved = plain - hooked
    if topology.cross_size == 1:
        return Decision(False, saved, work, "one host: its ranks share memory, which moves bytes as fast as the "
                                            f"hook's own passes touch them (priced: {saved * 1e3:.3g} ms saved, "
                                            f"{work * 1e3:.3g} ms of work)")
    if saved > work:
        return Decision(True, saved, work, f"saves {saved * 1e3:.3g} ms of link time for {work * 1e3:.3g} ms of "
                                           "its own work")
    return Decision(False, saved, work, f"would save {saved * 1e3:.3g} ms of link time for {work * 1e3:.3g} ms "
                                        "of its own work")


@dataclasses.dataclass(frozen=True)
class AutoCompression:
    """``hook`` on the buckets where it pays (:func:`decide`), plain reduction on the others.

    ``compression="auto"`` is ``AutoCompression(ddl.Compression.fp16)``; give PowerSGD as
    ``ddl.AutoCompression(ddl.PowerSGD(rank=4))``. Its state, where it has one, is the inner
    hook's.

    Args:
        hook: the compressor or stateful hook to use where it pays.
        flop_rate, memory_rate: what the hook's products and passes are priced at.

    Example:
        >>> opt = ddl.torch.DistributedOptimizer(sgd, compression="auto")  # doctest: +SKIP
    """

    hook: Compressor | CommHook = Compression.fp16
    flop_rate: float = DEFAULT_FLOP_RATE
    memory_rate: float = DEFAULT_MEMORY_RATE
    name: ClassVar[str] = "auto"

    def __post_init__(self) -> None:
        if isinstance(self.hook, AutoCompression):
            raise ValueError("AutoCompression(AutoCompression(...)): give the hook itself")
        if not (self.flop_rate > 0 and self.memory_rate > 0):
            raise ValueError(f"AutoCompression rates must be > 0, got flop_rate={self.flop_rate!r}, "
                             f"memory_rate={self.memory_rate!r}")

    def new_state(self) -> Any:
        """The inner hook's state (None for a compressor)."""
        return None if isinstance(self.hook, Compressor) else self.hook.new_state()

    def decide(self, shapes: Sequence[tuple[int, ...]], itemsize: int, topology: Topology, model: cost.CostModel,
               *, out_axis: int = 0) -> Decision:
        """:func:`decide` for this hook and rates."""
        return decide(self.hook, shapes, itemsize, topology, model, out_axis=out_axis, flop_rate=self.flop_rate,
                      memory_rate=self.memory_rate)

    def resolve(self, shapes: Sequence[tuple[int, ...]], dtype: np.dtype, topology: Topology, model: cost.CostModel,
                *, out_axis: int = 0) -> Compressor | CommHook:
        """The hook for one bucket: the inner one where it pays, ``Compression.none`` elsewhere
        (and for values that are not floating point, which no compression touches)."""
        if np.dtype(dtype).kind != "f" and np.dtype(dtype).name != "bfloat16":
            return Compression.none
        chosen = self.decide(shapes, np.dtype(dtype).itemsize, topology, model, out_axis=out_axis)
        return self.hook if chosen.compress else Compression.none

    def __repr__(self) -> str:
        return f"ddl.AutoCompression({self.hook!r})"


def as_hook_or_auto(value: Any) -> Compressor | CommHook | AutoCompression:
    """What an adapter's ``compression=`` takes: ``"auto"`` (:class:`AutoCompression` of fp16),
    an :class:`AutoCompression`, or whatever :func:`~ddl.engine.hooks.as_hook` accepts.

    Raises:
        ValueError: none of these (the message lists them).
    """
    if isinstance(value, AutoCompression):
        return value
    if isinstance(value, str) and value == "auto":
        return AutoCompression()
    try:
        return as_hook(value)
    except ValueError as exc:
        raise ValueError(f"{exc}; or \"auto\" (ddl.AutoCompression: compress only where it pays)") from None
