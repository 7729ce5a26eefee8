"""``ddl plan``: predicted allreduce, bucket schedule, step time, scaling and memory for any cluster.

With ``--model`` it also prices memory per rank (parameters, gradient buckets, the
optimizer state of ``--optimizer`` with and without ``shard_optimizer_state``), and with
``--step-ms`` the sharded step beside the unsharded one (``--update-ms``: the update's
share of the step, which sharding divides among the ranks).

It builds the plan a step would run (:func:`ddl.reduction.step_plan.plan_step`: the
function whose parts ``ddl.torch``, the engine and ``auto`` use themselves) and prices it
with the cost model ``auto`` uses (:mod:`ddl.reduction.cost`), on a topology given as a
spec (``4x64``: 4 ranks per host x 64 hosts), with link figures per dimension, a
calibration file written by ``init`` (``DDL_CALIBRATION=FILE``), or ``--calibration off``
(the fixed model ``DDL_CALIBRATION=off`` prices with). The step: gradients land during
backward (from the last parameter back, or in ``--order``, the order ``ddl.torch``
observed and re-planned in), fill ``ddl.torch``'s buckets (a small first one, then
``--bucket-mb``; two presence flags per gradient travel with them), and the engine takes
every bucket ready when it is free, fusing those under 1 MiB up to ``--fusion-threshold``.

Example:
    ddl plan --topology 4x64 --link 20GB/s:5us --link 100gbit:3us --reduce-rate 50GB/s \\
        --model resnet50 --step-ms 200
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path
from typing import Any

from ddl.base.config import DEFAULT_FUSION_BYTES, DEFAULT_SEGMENT_BYTES
from ddl.base.errors import TopologyError
from ddl.base.topology import Topology, build_topology, parse_spec
from ddl.engine.codec import inline_capacity, shared_records
from ddl.reduction import calibration, cost
from ddl.reduction.algorithms import SCHEDULED
from ddl.reduction.buckets import (
    BUCKET_BYTES,
    FIRST_BUCKET_BYTES,
    FLAGS_PER_TENSOR,
    MiB,
    gradient_buckets,
)
from ddl.reduction.partition import partition_by_bytes, segment_bounds
from ddl.reduction.segments import ALLREDUCE, choose_gradient_exchange, exchange_time
from ddl.reduction.step_plan import StepPlan, landing_times, plan_step, price
from ddl.tools import plan_hooks
from ddl.tools.arg_types import amount, count, nonnegative, share
from ddl.tools.helptext import plain
from ddl.tools.plan_models import ModelSpecError, gradient_shapes, gradient_sizes

__all__ = ["STATE_PER_PARAMETER", "BucketRun", "PlanError", "ShardedBucketRun", "StepPlan", "build_cost_model",
           "link_bound", "main", "make_plan", "memory_lines", "parse_bandwidth", "parse_latency", "parse_link",
           "plan_topology", "price", "read_order", "sharded_lines", "sharded_step_schedule", "step_schedule"]

ALGORITHMS = ("mpi", *SCHEDULED)
_BANDWIDTH = re.compile(r"^([0-9.eE+-]+)\s*([kKmMgGtT]?)(bit|Bit|bps|Bps|b|B)?(/s)?$")
_LATENCY = re.compile(r"^([0-9.eE+-]+)\s*(s|ms|us|µs|ns)?$")
_SCALE = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


class PlanError(ValueError):
    """Bad ``ddl plan`` input; the message says what was given and what is accepted."""


def parse_bandwidth(text: str) -> float:
    """Bytes per second from ``100gbit``, ``12.5GB/s``, ``800MB/s`` or a plain number of bytes/s."""
    m = _BANDWIDTH.match(text.strip())
    if not m:
        raise PlanError(f"bandwidth {text!r}: write e.g. 100gbit, 12.5GB/s or 1.2e9 (bytes/s)")
    value = float(m[1]) * _SCALE[m[2].lower()]
    rate = value / 8 if m[3] in ("bit", "Bit", "bps", "b") else value  # a lower-case b is a bit
    if not rate > 0:
        raise PlanError(f"bandwidth {text!r} must be positive")
    return rate


def parse_latency(text: str) -> float:
    """Seconds from ``3us``, ``0.5ms``, ``2e-6`` (plain numbers are seconds)."""
    m = _LATENCY.match(text.strip())
    if not m:
        raise PlanError(f"latency {text!r}: write e.g. 3us, 0.5ms or 2e-6 (seconds)")
    scale = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}[m[2] or ""]
    value = float(m[1]) * scale
    if value < 0:
        raise PlanError(f"latency {text!r} must not be negative")
    return value


def parse_link(text: str) -> cost.Link:
    """``BANDWIDTH:LATENCY`` (``100gbit:3us``) into a :class:`~ddl.reduction.cost.Link`."""
    bandwidth, colon, latency = text.rpartition(":")
    if not colon:
        raise PlanError(f"--link {text!r}: write BANDWIDTH:LATENCY, e.g. 100gbit:3us")
    return cost.Link(alpha=parse_latency(latency), beta=1.0 / parse_bandwidth(bandwidth))


def plan_topology(spec: str) -> Topology:
    """Rank 0's view of a cluster of ``spec`` (``4x64``): hosts hold ``dims[0]`` ranks each."""
    try:
        dims = parse_spec(spec).dims
    except TopologyError as exc:
        raise PlanError(str(exc)) from None
    size = 1
    for d in dims:
        size *= d
    names = [f"host{r // dims[0]}" for r in range(size)]
    return build_topology(0, names, spec)


def model_from_calibration(path: str | Path, topology: Topology, *, segment_bytes: int) -> tuple[cost.CostModel, list[str]]:
    """The cost model in a calibration file (the one ``auto`` used: links, corrections, shm
    figures); MPI's measured points only when the file is for this very job shape."""
    try:
        model, who = calibration.read_model(path, segment_bytes=segment_bytes)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PlanError(f"cannot read calibration file {path} ({exc}); give one written by DDL_CALIBRATION=FILE") from None
    notes = [f"cost model from {path} (measured at {who.get('world_size')} ranks, dims "
             f"{'x'.join(map(str, who.get('dims') or []))})"]
    if who.get("world_size") != topology.size or who.get("dims") != list(topology.dims):
        model = dataclasses.replace(model, native_points=(), native_measured=0)
        notes.append("its MPI allreduce points are for another job size: dropped")
    return model, notes


def link_bound(topology: Topology, nbytes: int, model: cost.CostModel) -> float:
    """The least time any allreduce needs: 2(H-1)/H x N bytes through each host's port."""
    hosts = topology.size // topology.dims[0] if len(topology.dims) > 1 else 1
    if hosts <= 1:
        return 0.0
    return 2 * (hosts - 1) / hosts * nbytes * model.link(1).beta


@dataclasses.dataclass(frozen=True)
class BucketRun:
    """One bucket of the step: its gradients, its buffer's bytes (flags included), when it is
    ready, and the reduction that carries it (buckets the engine fuses share one)."""

    tensors: int
    nbytes: int
    ready: float
    algorithm: str
    start: float
    end: float
    reduction: int
    members: tuple[int, ...]


def step_schedule(sizes: list[int], itemsize: int, topology: Topology, model: cost.CostModel, *, step: float,
                  backward_fraction: float, first_cap: int, cap: int, algorithm: str = "auto",
                  order: list[int] | None = None, fusion_threshold: int = DEFAULT_FUSION_BYTES) -> list[BucketRun]:
    """Each bucket of :func:`~ddl.reduction.step_plan.plan_step`'s plan, in the order the buckets fill."""
    planned = plan_step(sizes, itemsize, topology, model, step=step, backward_fraction=backward_fraction,
                        first_cap=first_cap, cap=cap, order=order, fusion_threshold=fusion_threshold,
                        algorithm=algorithm, inline_bytes=engine_inline_bytes(topology))
    return bucket_runs(planned)


def engine_inline_bytes(topology: Topology) -> int:
    """What a cycle's record carries inline at this job size (nothing in the compact
    exchange); on one host the records go through shared memory (not in elastic worlds,
    which the plan does not price)."""
    return inline_capacity(topology.size, shared=shared_records(topology.size, topology.cross_size <= 1, elastic=False))


def bucket_runs(planned: StepPlan) -> list[BucketRun]:
    runs = []
    for k, bucket in enumerate(planned.buckets):
        reduction = planned.reduction_of(k)
        runs.append(BucketRun(len(bucket.members), bucket.nbytes, planned.ready[k], reduction.algorithm,
                              reduction.start, reduction.end, planned.reductions.index(reduction), bucket.members))
    return runs


#: Bytes of optimizer state per byte of parameters, by optimizer (``--optimizer``).
STATE_PER_PARAMETER = {"sgd": 0, "momentum": 1, "adagrad": 1, "rmsprop": 1, "adam": 2, "adamw": 2}


@dataclasses.dataclass(frozen=True)
class ShardedBucketRun:
    """A bucket of a sharded optimizer's step: its gradient exchange and parameter gather."""

    tensors: int
    nbytes: int
    ready: float
    exchange: str
    start: float
    end: float
    gather_s: float


def sharded_step_schedule(sizes: list[int], itemsize: int, topology: Topology, model: cost.CostModel, *,
                          step: float, backward_fraction: float, first_cap: int,
                          cap: int) -> tuple[list[ShardedBucketRun], tuple[int, ...]]:
    """The buckets of a step with ``shard_optimizer_state=True``: each bucket's gradients go
    to their owners by a segment reduce-scatter or an allreduce (the cheaper by the model,
    as ddl.torch chooses) while backward runs; after the update each bucket's parameters
    come back by an allgather. Returns the buckets and the bytes each rank owns."""
    nbytes = [n * itemsize for n in sizes]
    owners = partition_by_bytes(nbytes, topology.size).owners
    ready_at = landing_times(nbytes, step=step, backward_fraction=backward_fraction)
    runs, free = [], 0.0
    for bucket in gradient_buckets(sizes, [itemsize] * len(sizes), first_cap=first_cap, cap=cap):
        members = bucket.members
        counts = [0] * topology.size
        for i in members:  # each owner's segment: its gradients and their presence flags
            counts[owners[i]] += sizes[i] + FLAGS_PER_TENSOR
        bounds = segment_bounds(counts)
        exchange = choose_gradient_exchange(topology, bounds, itemsize, model)
        seconds = (price("auto", topology, bounds[-1], itemsize, model) if exchange == ALLREDUCE
                   else exchange_time(topology, bounds, itemsize, model, reduce=True))
        ready = max(ready_at[i] for i in members)
        start = max(ready, free)
        free = start + seconds
        runs.append(ShardedBucketRun(len(members), bounds[-1] * itemsize, ready, exchange, start, free,
                                     exchange_time(topology, bounds, itemsize, model, reduce=False)))
    return runs, partition_by_bytes(nbytes, topology.size).loads


def memory_lines(sizes: list[int], itemsize: int, topology: Topology, optimizer: str) -> tuple[list[str], dict[str, Any]]:
    """Per-rank bytes of parameters, gradient buckets and optimizer state, sharded and not."""
    factor = STATE_PER_PARAMETER[optimizer]
    params = sum(sizes) * itemsize
    largest = partition_by_bytes([n * itemsize for n in sizes], topology.size).largest_load
    unsharded, sharded = factor * params, factor * largest
    lines = [f"memory per rank ({optimizer}: {factor} byte(s) of state per parameter byte): parameters "
             f"{human(params)}, gradient buckets {human(params)}, optimizer state {human(unsharded)} unsharded, "
             f"{human(sharded)} sharded (the largest rank's part: {largest / max(1, params):.1%} of the parameters) "
             f"-> {human(2 * params + unsharded)} vs {human(2 * params + sharded)}"]
    return lines, {"optimizer": optimizer, "parameter_bytes": params, "gradient_bucket_bytes": params,
                   "state_bytes_unsharded": unsharded, "state_bytes_sharded": sharded,
                   "largest_owned_parameter_bytes": largest}


def read_order(text: str, count: int) -> list[int]:
    """``--order``: parameter indices (a JSON list, or a file holding one), as ``ddl.torch``'s
    ``DistributedOptimizer.gradient_order()`` gives them.

    Raises:
        PlanError: not a list of distinct indices below ``count``.
    """
    source = text
    if not text.lstrip().startswith("["):
        try:
            source = Path(text).read_text()
        except OSError as exc:
            raise PlanError(f"--order {text!r}: not a JSON list and not a readable file ({exc})") from None
    try:
        order = json.loads(source)
    except ValueError:
        order = None
    if not isinstance(order, list) or not all(isinstance(i, int) and 0 <= i < count for i in order) \
            or len(set(order)) != len(order):
        raise PlanError(f"--order: give distinct parameter indices below {count} (the model's gradients) as a JSON "
                        f"list, e.g. [3, 2, 0, 1]; got {source.strip()[:100]!r}")
    return order


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.4g}{unit}"
        n /= 1024
    return f"{n:.4g}TiB"


def with_native_estimate(model: cost.CostModel, topology: Topology) -> cost.CostModel:
    """``model`` with MPI's allreduce priced at 8 B - 4 GiB (x4 apart) where nobody measured
    it (:func:`ddl.reduction.cost.extend_native`); ``auto`` reads the points as measured ones."""
    return cost.extend_native(model, topology)


def build_cost_model(args: argparse.Namespace, topology: Topology) -> tuple[cost.CostModel, list[str]]:
    """The model ``auto`` would price with: ``--calibration off`` is the runtime's fixed model,
    MPI's allreduce by its closed form, exactly as ``DDL_CALIBRATION=off`` prices it; links
    given or a calibration file are a measured model, MPI's allreduce estimated where nobody
    measured it (as calibration extends its own measurements)."""
    if args.calibration and args.link:
        raise PlanError("give --link figures or --calibration, not both")
    if args.calibration == "off":
        if args.reduce_rate or args.step_overhead_us is not None:
            raise PlanError("--calibration off prices with the runtime's fixed constants; --reduce-rate and "
                            "--step-overhead-us would change them: give --link figures instead")
        model = calibration.fixed_model(topology, segment_bytes=args.segment_bytes)
        return model, ["cost model: the fixed constants of DDL_CALIBRATION=off (MPI's allreduce by its closed form, "
                       "as the runtime prices it then)",
                       f"reduce {1e-9 / model.gamma:.3g} GB/s, executor overhead {model.step_overhead * 1e6:.3g} us "
                       f"a message, segments of {human(model.segment_bytes)}"]
    if args.calibration:
        model, notes = model_from_calibration(args.calibration, topology, segment_bytes=args.segment_bytes)
    elif args.link:
        model = cost.CostModel(links=tuple(parse_link(t) for t in args.link), gamma=cost.REDUCE_GAMMA,
                               segment_bytes=args.segment_bytes)
        notes = ["links given: " + "; ".join(f"dim{i} {1e-9 / lk.beta:.3g} GB/s, alpha {lk.alpha * 1e6:.3g} us"
                                              for i, lk in enumerate(model.links))]
    else:
        raise PlanError("give link figures per dim (--link 20GB/s:5us --link 100gbit:3us) or --calibration FILE")
    if args.reduce_rate:
        model = dataclasses.replace(model, gamma=1.0 / parse_bandwidth(args.reduce_rate))
    if args.step_overhead_us is not None:
        model = dataclasses.replace(model, step_overhead=args.step_overhead_us * 1e-6)
    if not model.native_points:
        model = with_native_estimate(model, topology)
        notes.append("mpi: MPI's allreduce is not measured here; priced as its large-message algorithm "
                     "(Rabenseifner: halving_doubling's schedule without ddl's per-message cost)")
    notes.append(f"reduce {1e-9 / model.gamma:.3g} GB/s, executor overhead {model.step_overhead * 1e6:.3g} us "
                 f"a message, segments of {human(model.segment_bytes)}; outer links shared by a host's ranks")
    return model, notes


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ddl plan", description=plain(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topology", required=True, help="dims innermost first, e.g. 4x64 (4 ranks per host x 64 hosts)")
    p.add_argument("--link", action="append", metavar="BW:LAT",
                   help="one per dim, innermost first (the last repeats outward), e.g. 20GB/s:5us; outer "
                        "dims: a host's port, shared by its ranks")
    p.add_argument("--calibration", metavar="FILE|off",
                   help="a cost model written by init (DDL_CALIBRATION=FILE), or off: the fixed model of "
                        "DDL_CALIBRATION=off")
    p.add_argument("--model", help="resnet50, FILE.onnx, package.module:factory (torch), @FILE or sizes 1000,2048x1000")
    p.add_argument("--step-ms", type=amount, help="measured single-rank step time (forward+backward+update), ms")
    p.add_argument("--backward-fraction", type=share, default=2 / 3, help="share of the step in backward (2/3)")
    p.add_argument("--itemsize", type=count(), default=4, help="bytes per gradient element (4: float32)")
    p.add_argument("--bucket-mb", type=amount, default=BUCKET_BYTES / MiB)
    p.add_argument("--first-bucket-mb", type=amount, default=FIRST_BUCKET_BYTES / MiB)
    p.add_argument("--segment-bytes", type=count(), default=DEFAULT_SEGMENT_BYTES)
    p.add_argument("--fusion-threshold", type=count(0), default=DEFAULT_FUSION_BYTES, metavar="BYTES",
                   help="the engine's DDL_FUSION_THRESHOLD: buckets under 1 MiB ready together share a buffer up to it")
    p.add_argument("--order", metavar="JSON|FILE",
                   help="the gradient order ddl.torch observed (DistributedOptimizer.gradient_order()); its buckets "
                        "are planned in it from the second step on (default: the first step's, last parameter first)")
    p.add_argument("--reduce-rate", metavar="BW", help="local reduction speed, e.g. 50GB/s (default: model's)")
    p.add_argument("--step-overhead-us", type=nonnegative, help="per-message software cost beyond alpha")
    p.add_argument("--optimizer", default="adam", choices=sorted(STATE_PER_PARAMETER),
                   help="prices its state per rank, sharded (shard_optimizer_state=True) and not (default adam)")
    p.add_argument("--update-ms", type=nonnegative, default=0.0,
                   help="of --step-ms, the optimizer update's part (one rank, unsharded): sharding divides it")
    p.add_argument("--bytes", help="also price single allreduces of these sizes, e.g. 8192,1048576")
    p.add_argument("--modes", metavar="LIST",
                   help="with --model and --step-ms, also price training modes side by side: sync, fp16, bf16, "
                        "powersgd:R, auto[:HOOK] (compression where it pays, bucket by bucket), localsgd:H[:HOOK][+overlap], diloco:H[:HOOK][+overlap] (see ddl.tools.plan_hooks)")
    p.add_argument("--flop-rate", type=amount, default=plan_hooks.DEFAULT_FLOP_RATE, metavar="FLOPS",
                   help="multiply-adds per second a rank's core gives PowerSGD's products (--modes)")
    p.add_argument("--memory-rate", type=amount, default=plan_hooks.DEFAULT_MEMORY_RATE, metavar="BYTES",
                   help="bytes per second a rank's element-wise passes move (hooks' errors, DiLoCo's deltas; --modes)")
    p.add_argument("--cast-rate", type=amount, default=None, metavar="BYTES",
                   help="bytes per second a compressor's casts read and write (fp16, bf16; --modes; "
                        "default: --memory-rate)")
    p.add_argument("--cycle-ms", type=nonnegative, default=None, metavar="MS",
                   help="what an engine round costs besides its allreduce (--modes; default: the negotiation's "
                        "records at the link's rate and latency)")
    p.add_argument("--json", metavar="FILE", help="also write the plan as JSON")
    return p


def make_plan(args: argparse.Namespace) -> tuple[list[str], dict[str, Any]]:
    """The printed lines and the JSON record of a plan (no I/O besides reading inputs)."""
    topology = plan_topology(args.topology)
    model, notes = build_cost_model(args, topology)
    lines = [f"ddl plan: topology {topology} ({topology.size} ranks, {topology.cross_size} hosts)", *notes]
    record: dict[str, Any] = {"topology": str(topology), "ranks": topology.size, "notes": notes}
    per_size = [int(b) for b in args.bytes.split(",")] if args.bytes else []
    sizes: list[int] = []
    if args.model:
        sizes, source = gradient_sizes(args.model)
        total = sum(sizes) * args.itemsize
        lines.append(f"model: {source}: {len(sizes)} tensors, {sum(sizes) / 1e6:.2f} M parameters, {human(total)}")
        per_size.append(total)
        more, record["memory"] = memory_lines(sizes, args.itemsize, topology, args.optimizer)
        lines += more
    record["allreduce"] = []
    for nbytes in per_size:
        count = max(1, nbytes // args.itemsize)
        times = {a: price(a, topology, count, args.itemsize, model) for a in ALGORITHMS
                 if a not in SCHEDULED or SCHEDULED[a].unavailable(topology) is None}
        picked = cost.choose(topology, count, args.itemsize, model)
        bound = link_bound(topology, nbytes, model)
        cells = "  ".join(f"{a} {t * 1e3:.3f}" for a, t in times.items())
        lines.append(f"allreduce {human(nbytes)} (ms): {cells}  auto -> {picked}; link bound {bound * 1e3:.3f}")
        record["allreduce"].append({"bytes": nbytes, "seconds": times, "auto": picked, "link_bound_s": bound})
    if sizes and args.step_ms:
        step, update = args.step_ms / 1e3, args.update_ms / 1e3
        if not 0 <= update <= step:
            raise PlanError(f"--update-ms {args.update_ms} must lie between 0 and --step-ms {args.step_ms}")
        # The update runs after the last gradient is reduced: backward ends ``update`` before
        # the step would end on one rank, and the step is the later of that and the last
        # reduction, plus the update (one number, priced alike sharded and not).
        compute = step - update
        order = read_order(args.order, len(sizes)) if args.order else None
        planned = plan_step(sizes, args.itemsize, topology, model, step=compute,
                            backward_fraction=args.backward_fraction,
                            first_cap=int(args.first_bucket_mb * 2**20), cap=int(args.bucket_mb * 2**20), order=order,
                            fusion_threshold=args.fusion_threshold, inline_bytes=engine_inline_bytes(topology))
        runs = bucket_runs(planned)
        where = "in the given order" if order is not None else "reverse parameter order"
        lines.append(f"buckets ({where}, first {args.first_bucket_mb:g} MiB then {args.bucket_mb:g} MiB, 2 presence "
                     f"flags per gradient; backward is the last {args.backward_fraction:.0%} of the step; # = the "
                     "engine's reduction, shared by buckets it fuses):")
        lines.append(f"{'bucket':>6} {'#':>4} {'tensors':>8} {'size':>10} {'ready ms':>9} {'algorithm':>17} "
                     f"{'start ms':>9} {'end ms':>9}")
        for i, r in enumerate(runs):
            lines.append(f"{i:>6} {r.reduction:>4} {r.tensors:>8} {human(r.nbytes):>10} {r.ready * 1e3:9.2f} "
                         f"{r.algorithm:>17} {r.start * 1e3:9.2f} {r.end * 1e3:9.2f}")
        comm = sum(r.end - r.start for r in planned.reductions)
        predicted = max(compute, planned.end) + update
        of_it = f" (the update's {update * 1e3:.1f} ms of it after the last reduction)" if update else ""
        lines.append(f"step: compute {step * 1e3:.1f} ms{of_it}, allreduce {comm * 1e3:.1f} ms in {len(runs)} buckets "
                     f"({len(planned.reductions)} reductions), last done at {planned.end * 1e3:.1f} ms -> step "
                     f"{predicted * 1e3:.1f} ms")
        lines.append(f"scaling efficiency {step / predicted:.1%} (no overlap: {step / (step + comm):.1%}); "
                     f"{topology.size} ranks run {topology.size * step / predicted:.1f}x one rank")
        record["step"] = {"compute_s": step, "allreduce_s": comm, "step_s": predicted, "efficiency": step / predicted,
                          "efficiency_no_overlap": step / (step + comm),
                          "buckets": [dataclasses.asdict(r) for r in runs],
                          "reductions": [dataclasses.asdict(r) for r in planned.reductions]}
        more, record["sharded_step"] = sharded_lines(sizes, args, topology, model, compute, predicted)
        lines += more
    elif args.step_ms and not sizes:
        raise PlanError("--step-ms needs --model (the gradients to reduce)")
    if args.modes:
        if not (args.model and args.step_ms):
            raise PlanError("--modes needs --model and --step-ms (the step's compute)")
        shapes, _ = gradient_shapes(args.model)
        try:
            more, rows = plan_hooks.mode_lines(
                args.modes.split(","), shapes, args.itemsize, topology, model, step=args.step_ms / 1e3,
                backward_fraction=args.backward_fraction, flop_rate=args.flop_rate, memory_rate=args.memory_rate,
                first_cap=int(args.first_bucket_mb * 2**20), cap=int(args.bucket_mb * 2**20),
                fusion_threshold=args.fusion_threshold, cast_rate=args.cast_rate,
                cycle_s=None if args.cycle_ms is None else args.cycle_ms / 1e3)
        except plan_hooks.ModeError as exc:
            raise PlanError(str(exc)) from None
        lines += more
        record["modes"] = rows
    return lines, record


def sharded_lines(sizes: list[int], args: argparse.Namespace, topology: Topology, model: cost.CostModel,
                  compute: float, unsharded_s: float) -> tuple[list[str], dict[str, Any]]:
    """The sharded step beside the unsharded one (``unsharded_s``, the step line's): the update
    divided, the gather added; ``compute``: the step's forward and backward (without the update)."""
    update = args.update_ms / 1e3
    sharded, loads = sharded_step_schedule(sizes, args.itemsize, topology, model, step=compute,
                                           backward_fraction=args.backward_fraction,
                                           first_cap=int(args.first_bucket_mb * 2**20), cap=int(args.bucket_mb * 2**20))
    share = max(loads) / max(1, sum(loads))
    gather = sum(r.gather_s for r in sharded)
    exchange = sum(r.end - r.start for r in sharded)
    sharded_s = max(compute, sharded[-1].end) + update * share + gather
    scattered = sum(1 for r in sharded if r.exchange != ALLREDUCE)
    lines = [f"sharded optimizer state (shard_optimizer_state=True): gradients to their owners in {exchange * 1e3:.1f} ms "
             f"({scattered} of {len(sharded)} buckets by reduce-scatter, the rest by allreduce), update "
             f"{update * share * 1e3:.1f} ms (the largest rank's {share:.1%}), parameters gathered in "
             f"{gather * 1e3:.1f} ms -> step {sharded_s * 1e3:.1f} ms vs {unsharded_s * 1e3:.1f} ms unsharded "
             f"({sharded_s / unsharded_s:.3f}x)"]
    return lines, {"exchange_s": exchange, "update_s": update * share, "gather_s": gather, "step_s": sharded_s,
                   "unsharded_step_s": unsharded_s, "ratio": sharded_s / unsharded_s,
                   "buckets": [dataclasses.asdict(r) for r in sharded]}


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        lines, record = make_plan(args)
    except (PlanError, ModelSpecError, ValueError) as exc:
        print(f"ddl plan: error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
