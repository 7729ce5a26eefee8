"""The cost model behind ``auto``, fitted at ``init`` from measured samples, and its files.

:mod:`ddl.reduction.probes` runs a :class:`~ddl.reduction.probes.ProbePlan` and returns
agreed :class:`~ddl.reduction.probes.Samples`; :func:`fit` turns them into a
:class:`~ddl.reduction.cost.CostModel` with the same float arithmetic on every rank, and
:func:`corrections` runs each schedule whole to correct it per algorithm. A calibration
file (``DDL_CALIBRATION=path``) skips the probes when it matches the world size, dims
and host names; ``ddl plan`` reads the same files (:func:`read_model`).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from ddl.base.atomic_write import write_atomically
from ddl.base.config import DEFAULT_SHM_BYTES
from ddl.base.ops import ReduceOp
from ddl.base.topology import Topology
from ddl.reduction import cost
from ddl.reduction.algorithms import SCHEDULED
from ddl.reduction.executor import run_schedule
from ddl.reduction.probes import (
    DEFAULT_PLAN,
    SKIPPED,
    ProbePlan,
    Samples,
    agree_max,
    measure_samples,
    median_time,
)
from ddl.reduction.schedule import Schedule
from ddl.wire.comm import Comm

FORMAT = 1


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


def fit_link(points: list[tuple[int, float]]) -> cost.Link:
    """alpha from the smallest probe, beta by least squares of the rest through it."""
    (n0, t0), rest = points[0], points[1:]
    alpha = max(t0, 1e-7)
    num = sum((t - alpha) * (n - n0) for n, t in rest)
    den = sum((n - n0) ** 2 for n, _ in rest)
    beta = max(num / den if den else 0.0, 1e-12)
    return cost.Link(alpha=alpha, beta=beta)


def fit(samples: Samples, plan: ProbePlan = DEFAULT_PLAN, *, segment_bytes: int, flows: int = 1,
        shm_bytes: int = DEFAULT_SHM_BYTES) -> cost.CostModel:
    """The model from the agreed ``samples`` of ``plan``'s probes.

    ``flows``: ranks of one dim-0 group that shared an outer link during its probe;
    the model multiplies that sharing back in, so the per-flow beta is stored. Without
    shared-memory samples the shm constants keep their defaults.
    """
    shm_alpha, shm_beta, shm_beta_large = cost.SHM_ALPHA, cost.SHM_BETA, 0.0
    if samples.shm:
        piece, copy, copy_large = samples.shm
        shm_alpha, shm_beta, shm_beta_large = max(piece, 1e-7), max(copy, 1e-13), max(copy_large, copy, 1e-13)
    k = len(plan.link)
    # The executor never sends more than segment_bytes in one message, so beta is fitted
    # on the probes it meets: a full segment is priced as measured. Larger probes run
    # faster per byte (measured on emulated hosts: 1 MiB at half the rate of 4 MiB),
    # and fitting them too priced multi-segment steps 2-3x too low.
    largest = max(segment_bytes, plan.link[min(1, k - 1)][0]) if segment_bytes > 0 else None
    links = []
    for d, times in enumerate(samples.links):
        link = fit_link([(n, t) for (n, _), t in zip(plan.link, times, strict=True) if largest is None or n <= largest])
        links.append(link if d == 0 else cost.Link(link.alpha, link.beta / max(1, flows)))
    overhead = samples.step - links[0].alpha if links else 0.0
    points = tuple((n, t) for (n, _), t in zip(plan.native, samples.native, strict=True) if t != SKIPPED)
    return cost.CostModel(links=tuple(links), gamma=max(samples.gamma, 1e-13), step_overhead=max(0.0, overhead),
                          segment_bytes=segment_bytes, native_points=points,
                          shm_alpha=shm_alpha, shm_beta=shm_beta, shm_beta_large=shm_beta_large, shm_bytes=shm_bytes)


def measure(comm: Comm, topology: Topology, *, segment_bytes: int, shm_bytes: int = DEFAULT_SHM_BYTES,
            plan: ProbePlan = DEFAULT_PLAN) -> Calibration:
    """Run ``plan``'s probes on every rank (a collective call) and fit one shared model."""
    start = time.perf_counter()
    samples = measure_samples(comm, topology, plan, shm_bytes=shm_bytes)
    dims = [d for d, n in enumerate(topology.dims) if n > 1]
    flows = topology.dims[dims[0]] if dims else 1
    model = cost.extend_native(fit(samples, plan, segment_bytes=segment_bytes, flows=flows, shm_bytes=shm_bytes),
                               topology)
    if plan.correct:
        model = dataclasses.replace(model, corrections=corrections(comm, topology, model, plan))
    return Calibration(model, "measured", time.perf_counter() - start)


def corrections(comm: Comm, topology: Topology, model: cost.CostModel,
                plan: ProbePlan) -> tuple[tuple[str, tuple[tuple[int, float], ...]], ...]:
    """Run each schedule this topology can run at ``plan.corrections`` and keep
    measured / predicted per algorithm: the link probes miss what a whole schedule meets
    (skew between steps, caches, a memory-bound copy), and ``auto`` picked an algorithm
    up to 1.4x slower than the best without this. A probe the model predicts past
    ``plan.correction_skip_beyond`` is not run (the decision uses only the agreed model, so every
    rank skips alike); the measured times are MAX-reduced like every other sample."""
    names = [a for a in SCHEDULED if SCHEDULED[a].unavailable(topology) is None]
    # With one non-unit dim, multiring compiles the ring's very schedule: run it once.
    same_as_ring = sum(d > 1 for d in topology.dims) <= 1 and "ring" in names and "multiring" in names
    if same_as_ring:
        names.remove("multiring")
    runs: list[tuple[str, int, float]] = []
    seg = max(1, model.segment_bytes // 4) if model.segment_bytes > 0 else 1 << 30
    start, spent = time.perf_counter(), 0.0
    for nbytes in plan.corrections:
        count = nbytes // 4
        buf = np.ones(count, np.float32)
        for name in names:
            predicted = cost.predict(name, topology, count, 4, model)
            if not 0 < predicted <= plan.correction_skip_beyond or spent > plan.correction_budget:
                continue
            schedule = SCHEDULED[name].compile(topology, topology.rank, count)

            def run(s: Schedule = schedule, b: np.ndarray = buf) -> None:  # sums of ones: p**4 at most
                run_schedule(comm, s, b, ReduceOp.SUM, segment_elems=seg, shm_bytes=model.shm_bytes)

            runs.append((name, nbytes, median_time(run, plan.correction_repeats, comm, plan.budget) / predicted))
            spent = agree_max(comm, [time.perf_counter() - start])[0]  # stop at the same run everywhere
    ratios = agree_max(comm, [r for _, _, r in runs])
    table: dict[str, list[tuple[int, float]]] = {}
    for (name, nbytes, _), ratio in zip(runs, ratios, strict=True):
        table.setdefault(name, []).append((nbytes, min(max(ratio, 0.2), 5.0)))
    if same_as_ring and "ring" in table:
        table["multiring"] = table["ring"]
    return tuple((name, tuple(points)) for name, points in table.items())


def identity(topology: Topology, hostnames: list[str]) -> dict[str, Any]:
    """What a calibration file must match to be reused."""
    return {"world_size": topology.size, "dims": list(topology.dims), "hosts": list(hostnames)}


def save(path: str | Path, calibration: Calibration, who: dict[str, Any]) -> None:
    """Write ``calibration`` as JSON with the identity it was measured for."""
    data = {"format": FORMAT, **who, "seconds": calibration.seconds, "model": calibration.model.to_json()}
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(target, json.dumps(data, indent=1))


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
        model = cost.CostModel.from_json(data["model"], segment_bytes=segment_bytes, shm_bytes=shm_bytes)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"ddl: ignoring calibration file {target} ({exc}); measuring again", file=sys.stderr)
        return None
    return Calibration(model, f"loaded from {target}")


def fixed_model(topology: Topology, *, segment_bytes: int, shm_bytes: int = DEFAULT_SHM_BYTES) -> cost.CostModel:
    """The model ``auto`` prices with under ``DDL_CALIBRATION=off`` (and in a world of one): the
    fixed constants, MPI's own allreduce by its closed form (no measured points, none estimated).
    ``ddl plan --calibration off`` prices with this very model."""
    return dataclasses.replace(cost.default_model(topology), segment_bytes=segment_bytes, shm_bytes=shm_bytes)


def calibrate(comm: Comm, topology: Topology, hostnames: list[str], setting: str | None,
              *, segment_bytes: int, shm_bytes: int = DEFAULT_SHM_BYTES, plan: ProbePlan = DEFAULT_PLAN) -> Calibration:
    """The model for this job (a collective call when ``comm.size > 1``).

    ``setting`` is ``DDL_CALIBRATION``: None measures, ``"off"`` keeps the fixed
    constants, anything else is a file to load when it matches this job, or to write.
    Rank 0 alone reads and writes the file and broadcasts what it found. ``plan``: the
    probes to run (tests shrink them).
    """
    if comm.size == 1 or setting == "off":
        return Calibration(fixed_model(topology, segment_bytes=segment_bytes, shm_bytes=shm_bytes), "fixed")
    who = identity(topology, hostnames)
    loaded = None
    if setting is not None and comm.rank == 0:
        loaded = load(setting, who, segment_bytes=segment_bytes, shm_bytes=shm_bytes)
    loaded = comm.bcast_object(loaded, 0)
    if loaded is not None:
        return loaded  # type: ignore[no-any-return]
    result = measure(comm, topology, segment_bytes=segment_bytes, shm_bytes=shm_bytes, plan=plan)
    if setting is not None and comm.rank == 0:
        try:
            save(setting, result, who)
        except OSError as exc:
            print(f"ddl: could not write calibration file {setting} ({exc}); check the path", file=sys.stderr)
    return result


def read_model(path: str | Path, *, segment_bytes: int, shm_bytes: int = DEFAULT_SHM_BYTES) -> tuple[cost.CostModel, dict[str, Any]]:
    """The model in a calibration file, whatever job it was measured for, and the file's
    identity (``world_size``, ``dims``, ``hosts``): what ``ddl plan --calibration`` prices with.

    Raises:
        OSError, ValueError, KeyError, TypeError: the file cannot be read as a calibration.
    """
    data = json.loads(Path(path).read_text())
    model = cost.CostModel.from_json(data["model"], segment_bytes=segment_bytes, shm_bytes=shm_bytes)
    return model, {k: data.get(k) for k in ("world_size", "dims", "hosts")}
