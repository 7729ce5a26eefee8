"""One training step's gradient reduction, planned and priced: the plan object ``ddl plan`` prints and tests compare with a run.

:func:`plan_step` puts together what a real step does, each part by the function the
runtime itself uses: ``ddl.torch``'s buckets (:func:`~ddl.reduction.buckets.gradient_buckets`:
its caps, its presence flags, its re-planning in the observed order), the engine's
fusion of what a cycle finds ready (:func:`~ddl.reduction.buckets.fuse`; a cycle's batch
small enough to ride in the negotiation record is reduced from it, ``inline``), and ``auto``'s
choice per fused buffer (:func:`~ddl.reduction.cost.choose`) on the model the runtime
prices with (:func:`~ddl.reduction.calibration.fixed_model` under ``DDL_CALIBRATION=off``,
a measured one otherwise). The timing is a model: gradients land in backward order (the
step's last ``backward_fraction``, in proportion to their bytes), and the engine, one
thread, takes every bucket ready when it is free.
"""

from __future__ import annotations

import dataclasses
import functools

from ddl.base.config import DEFAULT_FUSION_BYTES
from ddl.base.topology import Topology
from ddl.reduction import cost
from ddl.reduction.buckets import (
    FLAGS_PER_TENSOR,
    FusionItem,
    GradientBucket,
    fuse,
    gradient_buckets,
)


@dataclasses.dataclass(frozen=True)
class Reduction:
    """One allreduce the engine runs: a bucket on its own, or small buckets fused into one buffer."""

    buckets: tuple[int, ...]  # indices into StepPlan.buckets
    count: int  # elements
    algorithm: str
    start: float
    end: float


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """The buckets of a step, when each is ready, and the reductions that carry them."""

    buckets: tuple[GradientBucket, ...]
    ready: tuple[float, ...]  # per bucket, seconds after the step starts
    reductions: tuple[Reduction, ...]

    def reduction_of(self, bucket: int) -> Reduction:
        return next(r for r in self.reductions if bucket in r.buckets)

    @property
    def end(self) -> float:
        return max((r.end for r in self.reductions), default=0.0)


def landing_times(nbytes: list[int], *, step: float, backward_fraction: float,
                  order: list[int] | None = None) -> list[float]:
    """Seconds after the step starts at which each gradient lands (parameter order in and out):
    backward is the step's last ``backward_fraction``, gradients arrive in ``order`` (default:
    from the last parameter back), each taking time in proportion to its bytes; those not in
    ``order`` land at the end. ``ddl bench rehearsal`` replays gradients at these very times."""
    arrival = list(reversed(range(len(nbytes)))) if order is None else list(order)
    arrival += [i for i in reversed(range(len(nbytes))) if i not in set(arrival)]
    total = sum(nbytes) or 1
    backward_start = step * (1 - backward_fraction)
    ready_at, done = [0.0] * len(nbytes), 0
    for i in arrival:
        done += nbytes[i]
        ready_at[i] = backward_start + step * backward_fraction * done / total
    return ready_at


@functools.lru_cache(maxsize=65536)
def price(algorithm: str, topology: Topology, count: int, itemsize: int, model: cost.CostModel) -> float:
    """Seconds for one allreduce of ``count`` elements (``auto``: the model's own choice)."""
    if algorithm == "auto":
        algorithm = cost.choose(topology, count, itemsize, model)
    return cost.predict(algorithm, topology, count, itemsize, model)


def plan_step(numels: list[int], itemsize: int, topology: Topology, model: cost.CostModel, *, step: float,
              backward_fraction: float, first_cap: int, cap: int, order: list[int] | None = None,
              flags_per_tensor: int = FLAGS_PER_TENSOR, fusion_threshold: int = DEFAULT_FUSION_BYTES,
              algorithm: str = "auto", inline_bytes: int = 0) -> StepPlan:
    """The step ``ddl.torch`` and the engine would run for gradients of ``numels`` elements.

    Args:
        order: the gradient order the ranks agreed on after the first step (``ddl.torch``
            re-plans its buckets in it); None for the first step's plan.
        flags_per_tensor: presence flags per gradient (``ddl.torch``'s two; 0 for bare buckets).
        fusion_threshold: ``DDL_FUSION_THRESHOLD``.
        algorithm: ``auto`` (the model's choice per fused buffer, as the engine makes it), or one for all.
        inline_bytes: the engine's record payload (``ddl.engine.codec.inline_capacity``: 4 KiB
            below 17 ranks, 88 B up to 64, 0 where the exchange is compact, from 65 ranks): a
            cycle's ``auto`` batch that fits rides in it,
            priced as MPI's allreduce of that many bytes.
    """
    buckets = gradient_buckets(numels, [itemsize] * len(numels), first_cap=first_cap, cap=cap, order=order,
                               flags_per_tensor=flags_per_tensor)
    lands = landing_times([n * itemsize for n in numels], step=step, backward_fraction=backward_fraction, order=order)
    ready = tuple(max(lands[i] for i in b.members) for b in buckets)
    waiting = sorted(range(len(buckets)), key=lambda k: (ready[k], k))  # submitted as they fill
    reductions: list[Reduction] = []
    free = 0.0
    while waiting:
        start = max(free, ready[waiting[0]])
        cycle = [k for k in waiting if ready[k] <= start]  # what the engine finds ready when it runs
        waiting = [k for k in waiting if ready[k] > start]
        if algorithm == "auto" and sum(buckets[k].nbytes for k in cycle) <= inline_bytes:
            count = sum(buckets[k].count for k in cycle)
            end = start + price("mpi", topology, max(1, inline_bytes // itemsize), itemsize, model)
            reductions.append(Reduction(tuple(cycle), count, "inline", start, end))
            free = end
            continue
        items = [FusionItem(itemsize, buckets[k].nbytes, True) for k in cycle]  # in place, contiguous: solo if large
        for group in fuse(items, fusion_threshold):
            members = tuple(cycle[i] for i in group)
            count = sum(buckets[k].count for k in members)
            chosen = cost.choose(topology, count, itemsize, model) if algorithm == "auto" else algorithm
            end = start + price(chosen, topology, count, itemsize, model)
            reductions.append(Reduction(members, count, chosen, start, end))
            start = end
        free = start
    return StepPlan(buckets, ready, tuple(reductions))
