"""A latency/bandwidth network model that prices schedules; the basis of ``auto``.

Every link belongs to the outermost topology dimension its two ranks differ in. A step
costs ``pieces * (alpha_d + step_overhead) + bytes * beta_d * flows + reduced_bytes * gamma``
(``pieces``: the executor's segments of at most ``segment_bytes``), where ``flows`` is
how many ranks of the same dim-0 group (a host, when dims follow hosts) use an outer
link at that step: they share one network port. A step's cost is its slowest rank's,
since ranks move in lockstep; the ranks of the first dim-0 group stand for every group.
A shared-memory group step costs ``pieces * shm_alpha + copied_bytes * copy_beta +
reduced_bytes * gamma`` (:func:`group_step_time`), the copy rate falling from the cached
one to the memory-bound one as the buffer grows past the caches; an algorithm a topology cannot run
costs infinity, so ``auto`` never picks it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

from ddl.base.config import DEFAULT_SHM_BYTES
from ddl.base.topology import Topology
from ddl.reduction import pipelined
from ddl.reduction.algorithms import SCHEDULED
from ddl.reduction.executor import piece_elems, slot_bytes
from ddl.reduction.schedule import GroupStep, Schedule


@dataclasses.dataclass(frozen=True)
class Link:
    """Per-message latency ``alpha`` (s) and inverse bandwidth ``beta`` (s/byte)."""

    alpha: float
    beta: float


# Measured on the 2-core development machine (MPICH shared memory, mpi4py Sendrecv from
# Python): ~30 us per exchange, ~2 GB/s per stream, numpy add ~1 GB/s on one core.
SHARED_MEMORY = Link(alpha=30e-6, beta=1 / 2.0e9)
# A commodity 10 Gb/s Ethernet port between hosts.
NETWORK = Link(alpha=25e-6, beta=1 / 1.2e9)
REDUCE_GAMMA = 1 / 1.0e9
# A shared-memory piece: one barrier (~4 us on 2 ranks), two window syncs and the
# Python around a few numpy calls; copies run at memory speed (measured ~40 GB/s for
# 1 MiB on one core, taken lower for large buffers and several ranks per host).
SHM_ALPHA = 12e-6
SHM_BETA = 1 / 10e9
#: Buffer sizes at which ``shm_beta`` (cached) and ``shm_beta_large`` (memory-bound)
#: hold; the copy cost per byte is interpolated between them (the calibration probes).
COPY_CACHED_BYTES = 1 << 20
#: Octaves past the largest corrected size over which a correction fades to 1. On slow
#: links init can afford only the smallest correction run (256 KiB), a latency-bound one:
#: held for every larger size, its 1.5x priced 64 MiB of halving_doubling on 2 emulated
#: hosts at 4.9 s against 3.1 s measured.
CORRECTION_FADE_OCTAVES = 4
COPY_MEMORY_BYTES = 8 << 20


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Links per topology dimension (the last one repeats outward) and the reduce rate.

    The MPI library's own allreduce is priced from ``native_points`` (measured
    ``(bytes, seconds)`` pairs, interpolated) when there are any; otherwise as
    ``2 log2(p) alpha + 2 N beta + N gamma`` (recursive doubling for small messages,
    Rabenseifner for large) on the slowest link: it does not know the multi-ring dims.
    ``links`` are per non-unit dim (unit dims change no schedule and are dropped).
    ``step_overhead`` is the executor's Python cost per message beyond ``alpha``;
    ``segment_bytes`` (0: unsegmented) is its largest single message.
    ``shm_alpha`` is a shared-memory group step's fixed cost per piece (barrier and
    Python), ``shm_beta`` its copy cost (s/byte) for buffers of up to
    :data:`COPY_CACHED_BYTES`, ``shm_beta_large`` (0: the same) from
    :data:`COPY_MEMORY_BYTES` up, ``shm_bytes`` the slot cap per rank.
    """

    links: tuple[Link, ...]
    gamma: float = REDUCE_GAMMA
    step_overhead: float = 0.0
    segment_bytes: int = 0
    native_points: tuple[tuple[int, float], ...] = ()
    #: The largest size MPI's allreduce was measured at (0: none; priced by estimate
    #: alone). Past it the points are :func:`extend_native`'s estimate, and ``auto`` does
    #: not pick ``mpi`` on an estimate of a library's algorithm it cannot see: on 16
    #: emulated hosts the estimate said 20 s for a ResNet-50 step's buckets, MPI took 33 s
    #: and the ring, which auto picked by 3 %, 18 s.
    native_measured: int = 0
    shm_alpha: float = SHM_ALPHA
    shm_beta: float = SHM_BETA
    shm_bytes: int = DEFAULT_SHM_BYTES
    shm_beta_large: float = 0.0
    #: Per algorithm, ``(bytes, measured / predicted)`` from real runs at init (see
    #: :mod:`ddl.reduction.calibration`); between points the factor is interpolated in log size,
    #: below them the first holds, past the last it fades to 1 over
    #: :data:`CORRECTION_FADE_OCTAVES`. Empty: the model as fitted.
    corrections: tuple[tuple[str, tuple[tuple[int, float], ...]], ...] = ()

    def correction(self, algorithm: str, nbytes: int) -> float:
        """The measured/predicted factor for ``algorithm`` at ``nbytes`` (1.0 if none)."""
        points = next((pts for name, pts in self.corrections if name == algorithm), ())
        if not points:
            return 1.0
        if nbytes <= points[0][0]:
            return points[0][1]
        for (n0, f0), (n1, f1) in zip(points, points[1:], strict=False):
            if nbytes <= n1:
                w = math.log2(nbytes / n0) / math.log2(n1 / n0)
                return f0 + (f1 - f0) * w
        n_last, f_last = points[-1]
        fade = min(1.0, math.log2(nbytes / n_last) / CORRECTION_FADE_OCTAVES)
        return f_last + (1.0 - f_last) * fade

    def copy_beta(self, nbytes: int) -> float:
        """Seconds per byte copied when a group step covers ``nbytes``."""
        small, large = self.shm_beta, self.shm_beta_large or self.shm_beta
        if nbytes <= COPY_CACHED_BYTES:
            return small
        if nbytes >= COPY_MEMORY_BYTES:
            return large
        return small + (large - small) * (nbytes - COPY_CACHED_BYTES) / (COPY_MEMORY_BYTES - COPY_CACHED_BYTES)

    def link(self, dim: int) -> Link:
        return self.links[min(dim, len(self.links) - 1)]

    def to_json(self) -> dict[str, Any]:
        """The measured part of the model as JSON (``segment_bytes`` and ``shm_bytes`` are
        the job's settings, given again to :meth:`from_json`)."""
        return {"links": [[lk.alpha, lk.beta] for lk in self.links], "gamma": self.gamma,
                "step_overhead": self.step_overhead, "native_points": [list(p) for p in self.native_points],
                "native_measured": self.native_measured,
                "shm_alpha": self.shm_alpha, "shm_beta": self.shm_beta, "shm_beta_large": self.shm_beta_large,
                "corrections": [[name, [list(p) for p in pts]] for name, pts in self.corrections]}

    @classmethod
    def from_json(cls, m: dict[str, Any], *, segment_bytes: int, shm_bytes: int = DEFAULT_SHM_BYTES) -> CostModel:
        """The model :meth:`to_json` wrote.

        Raises:
            KeyError, TypeError, ValueError: ``m`` is not such a record.
        """
        return cls(
            links=tuple(Link(alpha=float(a), beta=float(b)) for a, b in m["links"]),
            gamma=float(m["gamma"]), step_overhead=float(m["step_overhead"]), segment_bytes=segment_bytes,
            native_points=tuple((int(n), float(t)) for n, t in m["native_points"]),
            native_measured=int(m.get("native_measured", 0)),
            shm_alpha=float(m.get("shm_alpha", SHM_ALPHA)), shm_beta=float(m.get("shm_beta", SHM_BETA)),
            shm_beta_large=float(m.get("shm_beta_large", 0.0)), shm_bytes=shm_bytes,
            corrections=tuple((str(name), tuple((int(n), float(f)) for n, f in pts))
                              for name, pts in m.get("corrections", [])))


def default_model(topology: Topology) -> CostModel:
    """Shared memory inside a host, the network between hosts (uncalibrated constants)."""
    outer = NETWORK if topology.cross_size > 1 else SHARED_MEMORY
    return CostModel(links=(SHARED_MEMORY, *([outer] * max(0, len(topology.dims) - 1))))


def schedule_time(schedules: list[Schedule], topology: Topology, itemsize: int, model: CostModel) -> float:
    """Predicted seconds for the lockstep run of ``schedules`` (one dim-0 group's ranks).

    A schedule the executor pipelines (:mod:`ddl.reduction.pipelined`) pays its in-host
    steps beside the ring, all but the first and the last of its fractions."""
    pipe = pipelined.plan(schedules[0], itemsize)
    fractions = pipe.fractions if pipe is not None else 1
    total = in_host = 0.0
    for k in range(max(len(s.steps) for s in schedules)):
        rows = []
        group_cost = 0.0
        for s in schedules:
            if k >= len(s.steps):
                continue
            st = s.steps[k]
            if isinstance(st, GroupStep):
                group_cost = max(group_cost, group_step_time(st, itemsize, model))
                continue
            peer = st.send_peer if st.send_peer is not None else st.recv_peer
            assert peer is not None
            rows.append((topology.link_dim(s.rank, peer), st))
        flows = max(1, sum(1 for dim, _ in rows if dim >= 1))
        step_cost = group_cost
        for dim, st in rows:
            link = model.link(dim)
            share = flows if dim >= 1 else 1
            nbytes = max(st.send_count, st.recv_count) * itemsize
            reduce_bytes = st.recv_count * itemsize if st.reduce else 0
            pieces = max(1, -(-nbytes // model.segment_bytes)) if model.segment_bytes > 0 else 1
            fixed = (fractions if pipe is not None else pieces) * (link.alpha + model.step_overhead)
            step_cost = max(step_cost, fixed + nbytes * link.beta * share + reduce_bytes * model.gamma)
        if pipe is not None and not rows:
            in_host += step_cost
        else:
            total += step_cost
    if pipe is None:
        return total + in_host
    return in_host / fractions + max(total, in_host * (fractions - 1) / fractions)


def group_step_time(step: GroupStep, itemsize: int, model: CostModel) -> float:
    """Predicted seconds for one shared-memory group step, cut into pieces as the executor does.

    A reduce-scatter copies the whole span into the slots and combines ``members - 1``
    chunk pieces; an allgather copies one chunk in and ``members - 1`` chunks out: the
    span either way.
    """
    n = len(step.members)
    if n < 2 or step.longest == 0:
        return 0.0
    per = piece_elems(n, slot_bytes(n, step.longest, itemsize, model.shm_bytes), itemsize)
    pieces = -(-step.longest // per)
    reduced = (n - 1) * step.longest * itemsize if step.reduce else 0
    span = step.span * itemsize
    return pieces * model.shm_alpha + span * model.copy_beta(span) + reduced * model.gamma


def native_time(topology: Topology, nbytes: int, model: CostModel) -> float:
    """Predicted seconds for the MPI library's own allreduce."""
    p = topology.size
    if p == 1:
        return 0.0
    if model.native_points:
        return interpolate(model.native_points, nbytes)
    slow = model.link(len(topology.dims) - 1 if topology.cross_size > 1 else 0)
    reduce = nbytes * (p - 1) / p * model.gamma
    return 2 * math.ceil(math.log2(p)) * slow.alpha + 2 * nbytes * slow.beta + reduce


#: Sizes MPI's allreduce is priced at where nobody measured it: 8 B to 4 GiB, 4x apart.
NATIVE_SIZES = tuple(8 << (2 * k) for k in range(15))


def native_estimate(topology: Topology, nbytes: int, model: CostModel) -> float:
    """MPI's allreduce as the model sees it: MPICH and Open MPI reduce large messages with
    Rabenseifner's algorithm over ranks in rank order, which is ``halving_doubling``'s
    schedule run without ddl's Python cost per message or its segments."""
    bare = dataclasses.replace(model, step_overhead=0.0, segment_bytes=0, native_points=(), corrections=())
    return predict("halving_doubling", topology, max(1, nbytes // 4), 4, bare)


def extend_native(model: CostModel, topology: Topology) -> CostModel:
    """``model`` with MPI's allreduce priced up to 4 GiB where nobody measured it.

    With no measured points, :func:`native_estimate` throughout. Past the last measured
    point (calibration skips sizes that would take too long), the measured time plus what
    ``halving_doubling``'s full price adds from there (the same algorithm, with the
    per-message costs and corrections this model found; added, not scaled, since the
    last point may be a latency): on 2 emulated hosts at 200 Mbit/s the bare
    estimate priced 64 MiB at 3.5 s, MPI took 4.4 s and ``auto`` picked it over a
    multi-ring that took 3.1 s.
    """
    if topology.size == 1:
        return model
    measured = model.native_points
    if model.native_measured:
        return model  # extended already
    if not measured:
        return dataclasses.replace(model, native_points=tuple((n, native_estimate(topology, n, model))
                                                              for n in NATIVE_SIZES))
    n_last, t_last = measured[-1]
    full = dataclasses.replace(model, native_points=())
    base = predict("halving_doubling", topology, max(1, n_last // 4), 4, full)
    tail = tuple((n, t_last + predict("halving_doubling", topology, n // 4, 4, full) - base)
                 for n in NATIVE_SIZES if n > n_last)
    return dataclasses.replace(model, native_points=measured + tail, native_measured=n_last)


def interpolate(points: tuple[tuple[int, float], ...], nbytes: int) -> float:
    """Piecewise-linear ``seconds(nbytes)`` through measured points, sorted by size.

    Below the first point its time holds (latency-bound); past the last, the last
    segment's slope carries on (bandwidth-bound).
    """
    if nbytes <= points[0][0]:
        return points[0][1]
    if len(points) == 1:
        return points[0][1] * nbytes / max(1, points[0][0])
    for (n0, t0), (n1, t1) in zip(points, points[1:], strict=False):
        if nbytes <= n1:
            return t0 + (t1 - t0) * (nbytes - n0) / (n1 - n0)
    (n0, t0), (n1, t1) = points[-2], points[-1]
    return t1 + max(0.0, (t1 - t0) / (n1 - n0)) * (nbytes - n1)


def predict(algorithm: str, topology: Topology, count: int, itemsize: int, model: CostModel) -> float:
    """Predicted seconds for one allreduce of ``count`` elements by ``algorithm``.

    Infinite for an algorithm this topology cannot run (``shm`` across hosts); zero in
    a world of one, where nothing runs.
    """
    if algorithm == "mpi":
        return native_time(topology, count * itemsize, model)
    alg = SCHEDULED[algorithm]
    if topology.size == 1:
        return 0.0
    if alg.unavailable(topology) is not None:
        return math.inf
    # Unit dims change no schedule; drop them so "1x6" prices exactly like "6".
    dims = tuple(d for d in topology.dims if d > 1) or (1,)
    if dims != topology.dims:
        topology = dataclasses.replace(topology, dims=dims)
    group = topology.ring(0, topology.order[0]) if topology.dims[0] > 1 else [topology.order[0]]
    # Besides the first dim-0 group (for port sharing), ranks 1 and p-1 in topology
    # order stand for the ranks a fold step leaves busy (halving_doubling's odd ones).
    if len(topology.dims) == 1:
        # No outer links to share, and a ring's ranks move alike: pricing all p schedules
        # would cost O(p^2) steps (26 s at p=1024) for the same answer.
        group = group[:1]
    groups = [group, [topology.order[min(1, topology.size - 1)]], [topology.order[-1]]]
    times = []
    for members in groups:
        schedules = [alg.compile(topology, r, count) for r in members]
        times.append(schedule_time(schedules, topology, itemsize, model) if any(x.steps for x in schedules) else 0.0)
    return max(times) * model.correction(algorithm, count * itemsize)


def choose(topology: Topology, count: int, itemsize: int, model: CostModel) -> str:
    """The cheapest algorithm for this message by ``model``; ties go to the MPI library,
    which is a candidate only up to the largest size calibration measured it at (when it
    measured any: see :attr:`CostModel.native_measured`).

    Priced once per size class (four per octave of bytes), at the class's lower bound:
    pricing compiles schedules, which costs milliseconds at hundreds of ranks, and a
    training job's many gradient sizes then share a few cached decisions.
    """
    if topology.size == 1 or count == 0:
        return "mpi"
    return _choose_class(topology, size_class(count * itemsize), itemsize, model)


def size_class(nbytes: int) -> int:
    """The class of a message size: 4 per octave (2**(k/4) bytes and up)."""
    return int(4 * math.log2(max(1, nbytes)))


@functools.lru_cache(maxsize=4096)
def _choose_class(topology: Topology, klass: int, itemsize: int, model: CostModel) -> str:
    return ranked_class(topology, klass, itemsize, model)[0][0]


@functools.lru_cache(maxsize=4096)
def ranked_class(topology: Topology, klass: int, itemsize: int, model: CostModel) -> tuple[tuple[str, float], ...]:
    """Every usable algorithm for messages of size class ``klass``, cheapest first, with its
    predicted seconds (:func:`choose`'s pick first; what ``auto``'s trials try next)."""
    count = max(1, int(2 ** (klass / 4)) // itemsize)
    unmeasured = 0 < model.native_measured < count * itemsize  # MPI only where it was measured
    costs = {name: predict(name, topology, count, itemsize, model) for name in ("mpi", *SCHEDULED)
             if not (name == "mpi" and unmeasured)}
    order = sorted(costs, key=lambda n: (costs[n], n != "mpi"))  # stable: ties keep the listed order
    usable = tuple((name, costs[name]) for name in order if math.isfinite(costs[name]))
    return usable or tuple((name, costs[name]) for name in order)
