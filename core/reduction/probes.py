"""The measurements behind the cost model: a plan of probes in, one named set of samples out.

Every rank runs the same probes in lockstep: a ring shift (``Sendrecv`` to the next
rank, from the previous one) of a few sizes along each non-unit topology dim, a local
numpy reduce, the executor's cost per step (tiny reducing steps), the MPI library's own
allreduce at a few sizes, and where the ``shm`` algorithm can run, its cost per piece
(tiny group steps) and a memory copy rate. Ranks agree on every control decision
(repeats, skips) by MAX-reducing it, and the samples are MAX-reduced at the end, so each
rank gets identical :class:`Samples` (ranks that fitted different models would pick
different algorithms and deadlock). :mod:`ddl.reduction.calibration` fits the model.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import time
from collections.abc import Callable

import numpy as np

from ddl.base.cpus import available_cpus
from ddl.base.ops import ReduceOp
from ddl.base.topology import Topology
from ddl.reduction import cost
from ddl.reduction.algorithms.shm import why_not_shared
from ddl.reduction.executor import run_schedule
from ddl.reduction.schedule import GroupStep, Schedule, Step, chunks_of, partition
from ddl.wire.comm import Comm

#: ``(bytes, repeats)`` pairs, smallest first.
Probes = tuple[tuple[int, int], ...]


@dataclasses.dataclass(frozen=True)
class ProbePlan:
    """What calibration runs, and within which budgets (the defaults are what ``init`` uses).

    Attributes:
        link: ring-shift probes per dim: latency, then bandwidth points; the largest is
            past the caches, where large messages live. 1 MiB (the default segment, which
            dominates the beta fit) gets 8 repeats: a noisy median there misleads auto.
        native: the MPI library's own allreduce. Its large-message algorithm can switch
            and slow down past a few MiB (measured: 2x per byte at 16 MiB on one host), so
            the last point is well past that; beyond it the last slope carries on.
        gamma: the local reduce probe.
        step_repeats: tiny reducing steps per timed run of the executor probe.
        budget: seconds each collective probe aims at (repeats cut to fit, at least one
            timed run; at 32 ranks on 2 cores full repeats made ``init`` take 2.3 s).
        link_warm_cap: a link probe whose warm-up alone took up to this many budgets is
            still timed once after it (the warm-up pays a connection's ramp-up).
        skip_beyond: a native probe predicted past this many seconds is skipped (and priced
            from the links).
        shm_steps: tiny group steps per timed run of the shared-memory probe.
        copy: memory-copy probes in cache and past it (measured: 40 GB/s at 1 MiB, 8.5
            GB/s at 4 MiB; shm moves more bytes through memory than a ring, so pricing
            large buffers at the cached rate made auto pick it where ring ran 1.7x faster).
        corrections: whole-schedule runs per algorithm (bytes), and their repeats.
        correction_skip_beyond: a correction run the model predicts past this is skipped
            (at 32 ranks on 2 cores the model is 3-5x optimistic there).
        correction_budget: seconds of correction runs after which the rest are skipped.
        correct: run the corrections at all.
    """

    link: Probes = ((8, 15), (64 << 10, 8), (1 << 20, 8), (4 << 20, 2))
    link_warm_cap: float = 4.0
    native: Probes = ((8, 15), (4 << 10, 10), (64 << 10, 6), (1 << 20, 4), (16 << 20, 2))
    gamma: tuple[int, int] = (1 << 20, 5)
    step_repeats: int = 32
    budget: float = 0.03
    skip_beyond: float = 0.1
    shm_steps: int = 4
    copy: Probes = ((cost.COPY_CACHED_BYTES, 5), (cost.COPY_MEMORY_BYTES, 3))
    corrections: tuple[int, ...] = (256 << 10, 4 << 20, 32 << 20)
    correction_repeats: int = 3
    correction_skip_beyond: float = 0.05
    correction_budget: float = 0.15
    correct: bool = True


#: The plan ``init`` runs.
DEFAULT_PLAN = ProbePlan()


@dataclasses.dataclass(frozen=True)
class Samples:
    """What the probes measured (seconds), the slowest rank's view, identical on every rank.

    Attributes:
        links: per non-unit dim, one time per :attr:`ProbePlan.link` probe.
        gamma: seconds per byte of a local numpy reduce.
        step: seconds per executor step (a tiny reducing ``Sendrecv``, alpha included).
        native: one time per :attr:`ProbePlan.native` probe (:data:`SKIPPED` where not run).
        shm: where ``shm`` can run: seconds per tiny group step, then per byte copied for
            each :attr:`ProbePlan.copy` probe; empty otherwise.
    """

    links: tuple[tuple[float, ...], ...]
    gamma: float
    step: float
    native: tuple[float, ...]
    shm: tuple[float, ...] = ()

    def vector(self) -> np.ndarray:
        """Every sample in one float64 vector (the layout :meth:`from_vector` reads)."""
        return np.array([v for link in self.links for v in link] + [self.gamma, self.step, *self.native, *self.shm],
                        dtype=np.float64)

    def from_vector(self, vec: np.ndarray) -> Samples:
        """Samples of this one's shape holding ``vec``'s values."""
        values = [float(v) for v in vec]
        k = len(self.links[0]) if self.links else 0
        links = tuple(tuple(values[d * k : (d + 1) * k]) for d in range(len(self.links)))
        at = len(self.links) * k
        native = tuple(values[at + 2 : at + 2 + len(self.native)])
        return Samples(links, values[at], values[at + 1], native, tuple(values[at + 2 + len(self.native) :]))


def agree_max(comm: Comm, values: list[float]) -> list[float]:
    """Every rank's values, element-wise maximum: how ranks agree on a probe's outcome."""
    vec = np.array(values, dtype=np.float64)
    if vec.size:
        comm.allreduce_native(vec, ReduceOp.MAX)
    return [float(v) for v in vec]


def median_time(fn: Callable[[], object], reps: int, comm: Comm | None, budget: float, *,
                warm_cap: float = 1.0) -> float:
    """Median seconds of ``fn`` over ``reps`` runs after a warm-up.

    With ``comm`` (``fn`` is then a collective probe every rank runs), the ranks agree on
    the slowest warm-up and cut ``reps`` to fit about ``budget``; a probe whose warm-up
    alone is over budget is not repeated, its warm-up is the sample, unless the warm-up
    took at most ``warm_cap`` budgets: then one timed run follows it.
    """
    t0 = time.perf_counter()
    fn()  # warm-up: first-touch pages, lazy connection set-up
    warm = time.perf_counter() - t0
    if comm is not None:
        slowest = agree_max(comm, [warm])[0]  # the same count of repeats on every rank
        reps = min(reps, int(budget / max(slowest, 1e-9)))
        if reps == 0 and slowest > budget * warm_cap:
            return slowest
        reps = max(reps, 1)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_samples(comm: Comm, topology: Topology, plan: ProbePlan, *, shm_bytes: int) -> Samples:
    """Run the plan's probes on every rank (a collective call); the agreed samples."""
    comm.barrier()
    dims = [d for d, n in enumerate(topology.dims) if n > 1]
    links = tuple(tuple(_link_samples(comm, topology, d, plan)) for d in dims)
    gamma, step = _local_samples(comm, topology, dims[0], plan) if dims else (0.0, 0.0)
    native = tuple(_native_samples(comm, plan))
    shm = tuple(_shm_samples(comm, topology, plan, shm_bytes=shm_bytes)) if why_not_shared(topology) is None else ()
    mine = Samples(links, gamma, step, native, shm)
    return mine.from_vector(np.array(agree_max(comm, list(mine.vector()))))


def _link_samples(comm: Comm, topology: Topology, dim: int, plan: ProbePlan) -> list[float]:
    ring = topology.ring(dim)
    i = ring.index(topology.rank)
    nxt, prv = ring[(i + 1) % len(ring)], ring[i - 1]
    # Connect first: MPI (UCX, TCP) opens a pair's connection at its first message, which
    # took 9 ms between emulated hosts; as the 8-byte probe's warm-up it put the warm-up
    # over budget, so it became the sample and priced every message of that dim at 9 ms
    # where a ring step paid 2.
    connect = np.ones(8, np.uint8)
    comm.sendrecv(connect, nxt, np.empty(8, np.uint8), prv)
    # A pair's first large message also pays the connection's ramp-up: on 2 emulated hosts at
    # 100 Mbit/s the first 1 MiB read 78 Mbit/s in 3 inits of 4, the next ones 95-99. Taken
    # as the sample (over budget), it priced every large message ~20 % slow; so a warm-up
    # within ``link_warm_cap`` budgets gets one timed run after it.
    out = []
    for nbytes, reps in plan.link:
        send, recv = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)
        out.append(median_time(functools.partial(comm.sendrecv, send, nxt, recv, prv), reps, comm, plan.budget,
                               warm_cap=plan.link_warm_cap))
    return out


def _local_samples(comm: Comm, topology: Topology, dim: int, plan: ProbePlan) -> tuple[float, float]:
    n, reps = plan.gamma
    a, b = np.ones(n // 4, np.float32), np.ones(n // 4, np.float32)
    gamma = median_time(lambda: np.add(a, b, out=a), reps, None, plan.budget) / n
    # The executor's own cost per step, measured in place: tiny reducing steps along
    # dim ``dim`` while every peer runs the same (a partner spinning in MPI slows
    # Python here about 2x, which a quiet local probe would miss).
    ring = topology.ring(dim)
    i = ring.index(topology.rank)
    step = Step(ring[(i + 1) % len(ring)], (0, 2), ring[i - 1], (2, 4), reduce=True)
    schedule = Schedule("probe", topology.rank, 4, (step,) * plan.step_repeats)
    buf = np.ones(4, np.float32)
    per_run = median_time(lambda: run_schedule(comm, schedule, buf, ReduceOp.SUM, segment_elems=1 << 20), 5, comm,
                          plan.budget)
    return gamma, per_run / plan.step_repeats


def _shm_samples(comm: Comm, topology: Topology, plan: ProbePlan, *, shm_bytes: int) -> list[float]:
    """Seconds per tiny shared-memory group step on this rank's dim-0 group (barrier and
    Python included), and seconds per byte of a memory copy; all members run them together."""
    members = tuple(topology.ring(0))
    n = len(members)
    step = GroupStep(members, tuple(chunks_of(partition(0, 4 * n, n))), reduce=True)
    schedule = Schedule("probe", topology.rank, 4 * n, (step,) * plan.shm_steps)
    buf = np.ones(4 * n, np.float32)
    per_step = median_time(lambda: run_schedule(comm, schedule, buf, ReduceOp.SUM, segment_elems=1 << 20,
                                                shm_bytes=shm_bytes), 5, comm, plan.budget) / plan.shm_steps
    # A short copy runs on a core of its own; in a long allreduce with more ranks on the
    # host than cores, the members' copies take turns (measured at 4 ranks on 2 cores:
    # 64 MiB ran 2x slower than the probe's rate predicted).
    share = max(1.0, topology.local_size / available_cpus())
    out = [per_step]
    for size, reps in plan.copy:
        src, dst = np.ones(size, np.uint8), np.empty(size, np.uint8)
        out.append(median_time(functools.partial(np.copyto, dst, src), reps, None, plan.budget) / size * share)
    return out


#: A native probe that was not run (its time predicted past the budget).
SKIPPED = -1.0


def _native_samples(comm: Comm, plan: ProbePlan) -> list[float]:
    """The MPI library's allreduce at each probe size; once the last two (agreed) times
    predict a size past ``plan.skip_beyond`` along their slope, it and every larger one
    are :data:`SKIPPED`: the model prices those from its links
    (:func:`ddl.reduction.cost.extend_native`). Extrapolating measured times instead went
    wrong: one point is a latency, not a rate (scaled by bytes from an 8-byte probe that
    took 6 ms under load, 4 KiB came out at 3 s), and two latency-bound ones give a slope
    of noise (16 MiB at 17.8 s where it took 2.9 s)."""
    out: list[float] = []
    comm.allreduce_native(np.ones(2, np.float32), ReduceOp.SUM)  # connect (see _link_samples)
    for nbytes, reps in plan.native:
        if len(out) >= 2:
            (n0, _), (n1, _) = plan.native[len(out) - 2], plan.native[len(out) - 1]
            if out[-1] == SKIPPED or out[-1] + max(0.0, out[-1] - out[-2]) / max(1, n1 - n0) * (nbytes - n1) \
                    > plan.skip_beyond:
                out.append(SKIPPED)
                continue
        buf = np.ones(max(1, nbytes // 4), np.float32)
        sample = median_time(functools.partial(comm.allreduce_native, buf, ReduceOp.SUM), reps, comm, plan.budget)
        out.append(agree_max(comm, [sample])[0])  # decide the next skip alike everywhere
    return out
