"""Measures the cost model at ``init``: alpha/beta per dim, gamma, executor and MPI costs.

Every rank runs the same probes in lockstep: a ring shift (``Sendrecv`` to the next
rank, from the previous one) of a few sizes along each non-unit topology dim, a local
numpy reduce, the executor's cost per step (tiny reducing steps, less alpha), and the
MPI library's own allreduce at a few sizes, and where the ``shm`` algorithm can run,
its cost per piece (tiny group steps) and a memory copy rate. The medians are MAX-reduced, so every rank
fits the same numbers with the same float arithmetic and gets an identical
:class:`~ddl.cost.CostModel` (ranks that picked different algorithms would deadlock).
A calibration file (``DDL_CALIBRATION=path``) skips the probes when it matches the
world size, dims and host names.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from ddl import cost
from ddl.algorithms import SCHEDULED
from ddl.algorithms.shm import why_not_shared
from ddl.comm import Comm
from ddl.config import DEFAULT_SHM_BYTES
from ddl.executor import run_schedule
from ddl.ops import ReduceOp
from ddl.schedule import GroupStep, Schedule, Step, chunks_of, partition
from ddl.topology import Topology

FORMAT = 1
#: Ring-shift probe sizes (bytes) and repeats: latency, then bandwidth points; the
#: largest is past the caches, where large messages live. 1 MiB (the default segment,
#: which dominates the beta fit) gets 8 repeats: a noisy median there misleads auto.
LINK_PROBES = ((8, 15), (64 << 10, 8), (1 << 20, 8), (4 << 20, 2))
#: The MPI library's own allreduce: (bytes, repeats). Its large-message algorithm can
#: switch and slow down past a few MiB (measured: 2x per byte at 16 MiB on one host),
#: so the last point is well past that; beyond it the last slope carries on.
NATIVE_PROBES = ((8, 15), (4 << 10, 10), (64 << 10, 6), (1 << 20, 4), (16 << 20, 2))
GAMMA_PROBE = (1 << 20, 5)
#: Seconds each collective probe aims at (repeats cut to fit, at least one timed run).
PROBE_BUDGET = 0.03
#: A native-allreduce probe predicted to take longer than this is extrapolated instead.
SKIP_BEYOND = 0.1
#: Whole-schedule runs that correct the model per algorithm: (bytes) and repeats.
CORRECTION_PROBES = (256 << 10, 4 << 20, 32 << 20)
CORRECTION_REPEATS = 3
#: A correction run the model predicts past this is skipped (at 32 ranks on 2 cores the
#: model is 3-5x optimistic there, and the runs made init take 2.6 s of probes).
CORRECTION_SKIP_BEYOND = 0.05
#: Seconds of correction runs after which the rest are skipped (agreed by every rank).
CORRECTION_BUDGET = 0.15
STEP_PROBE = 32
#: Shared memory: tiny group steps per timed run, and copy probes (bytes, repeats) in
#: cache and past it (measured: 40 GB/s at 1 MiB, 8.5 GB/s at 4 MiB; shm moves more
#: bytes through memory than a ring, so pricing large buffers at the cached rate made
#: auto pick it where ring ran 1.7x faster). About 4 ms, whatever the world size.
SHM_STEP_PROBE = 4
COPY_PROBES = ((cost.COPY_CACHED_BYTES, 5), (cost.COPY_MEMORY_BYTES, 3))


@dataclasses.dataclass(frozen=True)
class Calibration:
    """A measured (or loaded) model and where it came from."""

    model: cost.CostModel
    source: str
    seconds: float = 0.0

    def describe(self) -> str:
        links = ", ".join(f"dim{i}: alpha {lk.alpha * 1e6:.1f} us, {1e-9 / lk.beta:.2f} GB/s"
                          for i, lk in enumerate(self.model.links))
        return (f"{self.source} cost model ({self.seconds * 1e3:.0f} ms): {links}; reduce "
                f"{1e-9 / self.model.gamma:.2f} GB/s, step overhead {self.model.step_overhead * 1e6:.1f} us, "
                f"shm piece {self.model.shm_alpha * 1e6:.1f} us, copy {1e-9 / self.model.shm_beta:.1f} GB/s "
                f"cached, {1e-9 / (self.model.shm_beta_large or self.model.shm_beta):.1f} GB/s large, "
                f"MPI allreduce {len(self.model.native_points)} points"
                + ("; measured/predicted " + ", ".join(f"{name} " + "/".join(f"{f:.2f}" for _, f in pts)
                                                       for name, pts in self.model.corrections)
                   if self.model.corrections else ""))


def _median_time(fn: Any, reps: int, comm: Comm | None = None) -> float:
    """Median seconds of ``fn`` over ``reps`` runs after a warm-up.

    With ``comm`` (``fn`` is then a collective probe every rank runs), the ranks agree on
    the slowest warm-up and cut ``reps`` to fit about :data:`PROBE_BUDGET`; a probe whose
    warm-up alone is over budget is not repeated, its warm-up is the sample. At 32 ranks
    sharing 2 cores a 16 MiB allreduce takes a third of a second, and the full repeats
    made ``init`` take 2.3 s of probes there.
    """
    t0 = time.perf_counter()
    fn()  # warm-up: first-touch pages, lazy connection set-up
    warm = time.perf_counter() - t0
    if comm is not None:
        slowest = np.array([warm])
        comm.allreduce_native(slowest, ReduceOp.MAX)  # the same count of repeats on every rank
        reps = min(reps, int(PROBE_BUDGET / max(float(slowest[0]), 1e-9)))
        if reps == 0:
            return float(slowest[0])
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _link_samples(comm: Comm, topology: Topology, dim: int, probes: tuple[tuple[int, int], ...]) -> list[float]:
    ring = topology.ring(dim)
    i = ring.index(topology.rank)
    nxt, prv = ring[(i + 1) % len(ring)], ring[i - 1]
    out = []
    for nbytes, reps in probes:
        send, recv = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)
        out.append(_median_time(lambda s=send, r=recv: comm.sendrecv(s, nxt, r, prv), reps, comm))
    return out


def _local_samples(comm: Comm, topology: Topology, dim: int) -> list[float]:
    n, reps = GAMMA_PROBE
    a, b = np.ones(n // 4, np.float32), np.ones(n // 4, np.float32)
    gamma = _median_time(lambda: np.add(a, b, out=a), reps) / n
    # The executor's own cost per step, measured in place: tiny reducing steps along
    # dim ``dim`` while every peer runs the same (a partner spinning in MPI slows
    # Python here about 2x, which a quiet local probe would miss). Minus alpha below.
    ring = topology.ring(dim)
    i = ring.index(topology.rank)
    step = Step(ring[(i + 1) % len(ring)], (0, 2), ring[i - 1], (2, 4), reduce=True)
    schedule = Schedule("probe", topology.rank, 4, (step,) * STEP_PROBE)
    buf = np.ones(4, np.float32)
    per_step = _median_time(lambda: run_schedule(comm, schedule, buf, ReduceOp.SUM, segment_elems=1 << 20), 5, comm)
    return [gamma, per_step / STEP_PROBE]


def _shm_samples(comm: Comm, topology: Topology, *, shm_bytes: int) -> list[float]:
    """Seconds per tiny shared-memory group step on this rank's dim-0 group (barrier and
    Python included), and seconds per byte of a memory copy; all members run them together."""
    members = tuple(topology.ring(0))
    n = len(members)
    step = GroupStep(members, tuple(chunks_of(partition(0, 4 * n, n))), reduce=True)
    schedule = Schedule("probe", topology.rank, 4 * n, (step,) * SHM_STEP_PROBE)
    buf = np.ones(4 * n, np.float32)
    per_step = _median_time(lambda: run_schedule(comm, schedule, buf, ReduceOp.SUM, segment_elems=1 << 20,
                                                 shm_bytes=shm_bytes), 5, comm) / SHM_STEP_PROBE
    # A short copy runs on a core of its own; in a long allreduce with more ranks on the
    # host than cores, the members' copies take turns (measured at 4 ranks on 2 cores:
    # 64 MiB ran 2x slower than the probe's rate predicted).
    share = max(1.0, topology.local_size / (os.cpu_count() or 1))
    out = [per_step]
    for size, reps in COPY_PROBES:
        src, dst = np.ones(size, np.uint8), np.empty(size, np.uint8)
        out.append(_median_time(lambda s=src, d=dst: np.copyto(d, s), reps) / size * share)
    return out


def _native_samples(comm: Comm, probes: tuple[tuple[int, int], ...]) -> list[float]:
    """The MPI library's allreduce at each probe size; a size the previous (agreed) time
    predicts at over :data:`SKIP_BEYOND` is not run but extrapolated linearly, as the
    model itself extrapolates past its last point."""
    out: list[float] = []
    last: tuple[int, float] | None = None
    for nbytes, reps in probes:
        if last is not None and last[1] * nbytes / max(1, last[0]) > SKIP_BEYOND:
            out.append(last[1] * nbytes / max(1, last[0]))
            continue
        buf = np.ones(max(1, nbytes // 4), np.float32)
        sample = np.array([_median_time(lambda b=buf: comm.allreduce_native(b, ReduceOp.SUM), reps, comm)])
        comm.allreduce_native(sample, ReduceOp.MAX)  # decide the next skip alike everywhere
        out.append(float(sample[0]))
        last = (nbytes, float(sample[0]))
    return out


def fit_link(points: list[tuple[int, float]]) -> cost.Link:
    """alpha from the smallest probe, beta by least squares of the rest through it."""
    (n0, t0), rest = points[0], points[1:]
    alpha = max(t0, 1e-7)
    num = sum((t - alpha) * (n - n0) for n, t in rest)
    den = sum((n - n0) ** 2 for n, _ in rest)
    beta = max(num / den if den else 0.0, 1e-12)
    return cost.Link(alpha=alpha, beta=beta)


def fit(
    samples: list[float], n_dims: int, *, segment_bytes: int, flows: int = 1,
    link_probes: tuple[tuple[int, int], ...] = LINK_PROBES, native_probes: tuple[tuple[int, int], ...] = NATIVE_PROBES,
    shm: bool = False, shm_bytes: int = DEFAULT_SHM_BYTES,
) -> cost.CostModel:
    """The model from the reduced sample vector that :func:`measure` gathers.

    ``flows``: ranks of one dim-0 group that shared an outer link during its probe;
    the model multiplies that sharing back in, so the per-flow beta is stored.
    ``shm``: the vector ends with the three shared-memory samples (else defaults stay).
    """
    shm_alpha, shm_beta, shm_beta_large = cost.SHM_ALPHA, cost.SHM_BETA, 0.0
    if shm:
        samples, (piece, copy, copy_large) = samples[:-3], samples[-3:]
        shm_alpha, shm_beta, shm_beta_large = max(piece, 1e-7), max(copy, 1e-13), max(copy_large, copy, 1e-13)
    k = len(link_probes)
    # The executor never sends more than segment_bytes in one message, so beta is fitted
    # on the probes it meets: a full segment is priced as measured. Larger probes run
    # faster per byte (measured on emulated hosts: 1 MiB at half the rate of 4 MiB),
    # and fitting them too priced multi-segment steps 2-3x too low.
    largest = max(segment_bytes, link_probes[min(1, k - 1)][0]) if segment_bytes > 0 else None
    links = []
    for d in range(n_dims):
        link = fit_link([(n, samples[d * k + j]) for j, (n, _) in enumerate(link_probes)
                         if largest is None or n <= largest])
        links.append(link if d == 0 else cost.Link(link.alpha, link.beta / max(1, flows)))
    gamma, per_step = samples[n_dims * k], samples[n_dims * k + 1]
    overhead = per_step - links[0].alpha if links else 0.0
    native = samples[n_dims * k + 2 :]
    points = tuple((n, t) for (n, _), t in zip(native_probes, native, strict=True))
    return cost.CostModel(links=tuple(links), gamma=max(gamma, 1e-13), step_overhead=max(0.0, overhead),
                          segment_bytes=segment_bytes, native_points=points,
                          shm_alpha=shm_alpha, shm_beta=shm_beta, shm_beta_large=shm_beta_large, shm_bytes=shm_bytes)


def measure(
    comm: Comm, topology: Topology, *, segment_bytes: int, shm_bytes: int = DEFAULT_SHM_BYTES,
    link_probes: tuple[tuple[int, int], ...] = LINK_PROBES, native_probes: tuple[tuple[int, int], ...] = NATIVE_PROBES,
    correct: bool = True,
) -> Calibration:
    """Run the probes on every rank (a collective call) and fit one shared model.

    ``link_probes`` / ``native_probes``: ``(bytes, repeats)``, smallest first.
    """
    start = time.perf_counter()
    comm.barrier()
    dims = [d for d, n in enumerate(topology.dims) if n > 1]
    samples: list[float] = []
    for d in dims:
        samples += _link_samples(comm, topology, d, link_probes)
    samples += _local_samples(comm, topology, dims[0]) if dims else [0.0, 0.0]
    samples += _native_samples(comm, native_probes)
    shm = why_not_shared(topology) is None  # the same answer on every rank
    if shm:
        samples += _shm_samples(comm, topology, shm_bytes=shm_bytes)
    vec = np.array(samples, dtype=np.float64)
    comm.allreduce_native(vec, ReduceOp.MAX)  # the slowest rank's view, identical everywhere
    flows = topology.dims[dims[0]] if dims else 1
    model = fit([float(v) for v in vec], len(dims), segment_bytes=segment_bytes, flows=flows,
                link_probes=link_probes, native_probes=native_probes, shm=shm, shm_bytes=shm_bytes)
    if correct:
        model = dataclasses.replace(model, corrections=_corrections(comm, topology, model))
    return Calibration(model, "measured", time.perf_counter() - start)


def _corrections(comm: Comm, topology: Topology, model: cost.CostModel) -> tuple[tuple[str, tuple[tuple[int, float], ...]], ...]:
    """Run each schedule this topology can run at :data:`CORRECTION_PROBES` and keep
    measured / predicted per algorithm: the link probes miss what a whole schedule meets
    (skew between steps, caches, a memory-bound copy), and ``auto`` picked an algorithm
    up to 1.4x slower than the best without this. A probe the model predicts past
    :data:`CORRECTION_SKIP_BEYOND` is not run (the decision uses only the agreed model, so every
    rank skips alike); the measured times are MAX-reduced like every other sample."""
    names = [a for a in SCHEDULED if SCHEDULED[a].unavailable(topology) is None]
    # With one non-unit dim, multiring compiles the ring's very schedule: run it once.
    same_as_ring = sum(d > 1 for d in topology.dims) <= 1 and "ring" in names and "multiring" in names
    if same_as_ring:
        names.remove("multiring")
    runs: list[tuple[str, int, float]] = []
    seg = max(1, model.segment_bytes // 4) if model.segment_bytes > 0 else 1 << 30
    start, spent = time.perf_counter(), np.zeros(1)
    for nbytes in CORRECTION_PROBES:
        count = nbytes // 4
        buf = np.ones(count, np.float32)
        for name in names:
            predicted = cost.predict(name, topology, count, 4, model)
            if not 0 < predicted <= CORRECTION_SKIP_BEYOND or spent[0] > CORRECTION_BUDGET:
                continue
            schedule = SCHEDULED[name].compile(topology, topology.rank, count)

            def run(s: Schedule = schedule, b: np.ndarray = buf) -> None:  # sums of ones: p**4 at most
                run_schedule(comm, s, b, ReduceOp.SUM, segment_elems=seg, shm_bytes=model.shm_bytes)

            runs.append((name, nbytes, _median_time(run, CORRECTION_REPEATS, comm) / predicted))
            spent[0] = time.perf_counter() - start
            comm.allreduce_native(spent, ReduceOp.MAX)  # stop at the same run everywhere
    ratios = np.array([r for _, _, r in runs], dtype=np.float64)
    if ratios.size:
        comm.allreduce_native(ratios, ReduceOp.MAX)
    table: dict[str, list[tuple[int, float]]] = {}
    for (name, nbytes, _), ratio in zip(runs, ratios.tolist(), strict=True):
        table.setdefault(name, []).append((nbytes, min(max(ratio, 0.2), 5.0)))
    if same_as_ring and "ring" in table:
        table["multiring"] = table["ring"]
    return tuple((name, tuple(points)) for name, points in table.items())


def identity(topology: Topology, hostnames: list[str]) -> dict[str, Any]:
    """What a calibration file must match to be reused."""
    return {"world_size": topology.size, "dims": list(topology.dims), "hosts": list(hostnames)}


def save(path: str | Path, calibration: Calibration, who: dict[str, Any]) -> None:
    """Write ``calibration`` as JSON with the identity it was measured for."""
    m = calibration.model
    data = {"format": FORMAT, **who, "seconds": calibration.seconds,
            "model": {"links": [[lk.alpha, lk.beta] for lk in m.links], "gamma": m.gamma,
                      "step_overhead": m.step_overhead, "native_points": [list(p) for p in m.native_points],
                      "shm_alpha": m.shm_alpha, "shm_beta": m.shm_beta, "shm_beta_large": m.shm_beta_large,
                      "corrections": [[name, [list(p) for p in pts]] for name, pts in m.corrections]}}
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(target)


def load(path: str | Path, who: dict[str, Any], *, segment_bytes: int,
         shm_bytes: int = DEFAULT_SHM_BYTES) -> Calibration | None:
    """The saved calibration if ``path`` holds one for this identity, else None."""
    target = Path(path)
    if not target.is_file():
        return None
    try:
        data = json.loads(target.read_text())
        if data.get("format") != FORMAT or any(data.get(k) != v for k, v in who.items()):
            return None
        m = data["model"]
        model = cost.CostModel(
            links=tuple(cost.Link(alpha=float(a), beta=float(b)) for a, b in m["links"]),
            gamma=float(m["gamma"]), step_overhead=float(m["step_overhead"]), segment_bytes=segment_bytes,
            native_points=tuple((int(n), float(t)) for n, t in m["native_points"]),
            shm_alpha=float(m.get("shm_alpha", cost.SHM_ALPHA)), shm_beta=float(m.get("shm_beta", cost.SHM_BETA)),
            shm_beta_large=float(m.get("shm_beta_large", 0.0)), shm_bytes=shm_bytes,
            corrections=tuple((str(name), tuple((int(n), float(f)) for n, f in pts))
                              for name, pts in m.get("corrections", [])))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"ddl: ignoring calibration file {target} ({exc}); measuring again", file=sys.stderr)
        return None
    return Calibration(model, f"loaded from {target}")


def calibrate(comm: Comm, topology: Topology, hostnames: list[str], setting: str | None,
              *, segment_bytes: int, shm_bytes: int = DEFAULT_SHM_BYTES, **probes: Any) -> Calibration:
    """The model for this job (a collective call when ``comm.size > 1``).

    ``setting`` is ``DDL_CALIBRATION``: None measures, ``"off"`` keeps the fixed
    constants, anything else is a file to load when it matches this job, or to write.
    Rank 0 alone reads and writes the file and broadcasts what it found. ``probes``
    go to :func:`measure` (tests shrink them).
    """
    fixed = dataclasses.replace(cost.default_model(topology), segment_bytes=segment_bytes, shm_bytes=shm_bytes)
    if comm.size == 1 or setting == "off":
        return Calibration(fixed, "fixed")
    who = identity(topology, hostnames)
    loaded = None
    if setting is not None and comm.rank == 0:
        loaded = load(setting, who, segment_bytes=segment_bytes, shm_bytes=shm_bytes)
    loaded = comm.bcast_object(loaded, 0)
    if loaded is not None:
        return loaded  # type: ignore[no-any-return]
    result = measure(comm, topology, segment_bytes=segment_bytes, shm_bytes=shm_bytes, **probes)
    if setting is not None and comm.rank == 0:
        try:
            save(setting, result, who)
        except OSError as exc:
            print(f"ddl: could not write calibration file {setting} ({exc}); check the path", file=sys.stderr)
    return result
