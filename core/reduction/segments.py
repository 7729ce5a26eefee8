"""Reduce-scatter and allgather over uneven owner segments: a sharded optimizer's two exchanges.

A sharded bucket holds rank 0's tensors, then rank 1's, and so on (see
:mod:`ddl.reduction.partition`); ``bounds[r]:bounds[r+1]`` is rank r's segment. The
gradient exchange is a reduce-scatter that leaves each rank the sum of its own segment;
the parameter exchange is an allgather that hands every rank every segment. Together they
move what one allreduce moves, and the update between them touches 1/N of the tensors.

When one host holds the whole world, both are one shared-memory group step (the same
window the ``shm`` allreduce uses); otherwise they are rings in topology order. The
gradient exchange is priced against an allreduce of the same bucket by the cost model
(:func:`choose_gradient_exchange`): a bucket owned by one rank reduces faster by an
allreduce than by a ring that carries all of it through every rank.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from ddl.base.topology import Topology
from ddl.reduction import cost
from ddl.reduction.algorithms.shm import why_not_shared
from ddl.reduction.schedule import GroupStep, Schedule, ring_allgather, ring_reduce_scatter

#: The two ways a sharded bucket's gradients are reduced.
REDUCE_SCATTER = "reducescatter"
ALLREDUCE = "allreduce"


def check_bounds(bounds: Sequence[int], size: int, count: int) -> tuple[int, ...]:
    """``bounds`` as a tuple after checking it cuts ``count`` elements into ``size`` segments.

    Raises:
        ValueError: not ``size + 1`` non-decreasing values from 0 to ``count``.

    Example:
        >>> check_bounds([0, 2, 5], 2, 5)
        (0, 2, 5)
    """
    out = tuple(int(b) for b in bounds)
    if len(out) != size + 1 or out[0] != 0 or out[-1] != count or any(a > b for a, b in zip(out, out[1:], strict=False)):
        raise ValueError(f"segment bounds must be {size + 1} non-decreasing offsets from 0 to {count} "
                         f"(one segment per rank), got {list(out)}")
    return out


def shares_memory(topology: Topology) -> bool:
    """True when one shared-memory group step can run the exchange: one host, one dim-0 ring."""
    return topology.size > 1 and topology.dims[0] == topology.size and why_not_shared(topology) is None


@functools.lru_cache(maxsize=512)
def segment_schedule(topology: Topology, rank: int, bounds: tuple[int, ...], *, reduce: bool) -> Schedule:
    """``rank``'s schedule of the reduce-scatter (``reduce``) or allgather over ``bounds``.

    Example:
        >>> from ddl.base.topology import build_topology
        >>> s = segment_schedule(build_topology(0, ["a", "b"]), 0, (0, 1, 3), reduce=True)
        >>> [(st.send, st.recv) for st in s.steps]
        [((1, 3), (0, 1))]
    """
    kind = "reduce-scatter" if reduce else "allgather"
    if topology.size == 1:
        return Schedule(f"segment {kind}", rank, bounds[-1], ())
    if shares_memory(topology):
        members = tuple(topology.ring(0, rank))
        chunks = tuple((bounds[m], bounds[m + 1]) for m in members)
        step = GroupStep(members, chunks, reduce=reduce, dim=0, phase=f"shm segment {kind}")
        return Schedule(f"segment {kind}", rank, bounds[-1], (step,))
    order = list(topology.order)
    ring = ring_reduce_scatter if reduce else ring_allgather
    steps = ring(order, rank, [(bounds[m], bounds[m + 1]) for m in order], dim=0, phase=f"segment {kind}")
    return Schedule(f"segment {kind}", rank, bounds[-1], tuple(steps))


def sole_owner(bounds: Sequence[int]) -> int | None:
    """The one rank whose segment holds elements, when only one does (then the allgather is a
    broadcast from it); None otherwise.

    Example:
        >>> sole_owner([0, 0, 7, 7])
        1
    """
    filled = [r for r in range(len(bounds) - 1) if bounds[r + 1] > bounds[r]]
    return filled[0] if len(filled) == 1 else None


def exchange_time(topology: Topology, bounds: tuple[int, ...], itemsize: int, model: cost.CostModel, *,
                  reduce: bool) -> float:
    """Predicted seconds of the segment reduce-scatter (``reduce``) or allgather over ``bounds``.

    One host: the group step's price (:func:`ddl.reduction.cost.group_step_time`). A ring:
    each of its p-1 steps moves every segment one hop at once, so a step lasts as long as
    the largest segment takes over the ring's slowest link (the host boundary), in
    messages of the model's segment size, plus its reduction.
    """
    if topology.size == 1 or bounds[-1] == 0:
        return 0.0
    schedule = segment_schedule(topology, topology.order[0], bounds, reduce=reduce)
    if shares_memory(topology):
        step = schedule.steps[0]
        assert isinstance(step, GroupStep)
        return cost.group_step_time(step, itemsize, model)
    order, p = topology.order, topology.size
    slowest = max(topology.link_dim(order[i], order[(i + 1) % p]) for i in range(p))
    link = model.link(slowest)
    longest = max(bounds[r + 1] - bounds[r] for r in range(p)) * itemsize
    pieces = max(1, -(-longest // model.segment_bytes)) if model.segment_bytes > 0 else 1
    step_s = pieces * (link.alpha + model.step_overhead) + longest * link.beta + (longest * model.gamma if reduce else 0)
    return (p - 1) * step_s


def choose_gradient_exchange(topology: Topology, bounds: tuple[int, ...], itemsize: int,
                             model: cost.CostModel) -> str:
    """:data:`REDUCE_SCATTER` or :data:`ALLREDUCE` for a sharded bucket, whichever the cost model
    prices lower (the reduce-scatter on a tie: it moves half the bytes).

    Example:
        >>> from ddl.base.topology import build_topology
        >>> topo = build_topology(0, ["a", "a", "b", "b"])
        >>> model = cost.default_model(topo)
        >>> choose_gradient_exchange(topo, (0, 1 << 20, 2 << 20, 3 << 20, 4 << 20), 4, model)
        'reducescatter'
        >>> choose_gradient_exchange(topo, (0, 4 << 20, 4 << 20, 4 << 20, 4 << 20), 4, model)
        'allreduce'
    """
    count = bounds[-1]
    if topology.size == 1 or count == 0:
        return REDUCE_SCATTER
    scatter = exchange_time(topology, bounds, itemsize, model, reduce=True)
    algorithm = cost.choose(topology, count, itemsize, model)
    return ALLREDUCE if cost.predict(algorithm, topology, count, itemsize, model) < scatter else REDUCE_SCATTER
