"""``ddl plan --modes``: the step and the bytes per step of plain, compressed, PowerSGD, local SGD and DiLoCo training.

Every mode is priced from what its hook really sends (:func:`ddl.engine.hooks.traffic`)
on the same cost model as the plain step:

- ``sync``, ``fp16``, ``bf16``: the plain plan (:func:`~ddl.reduction.step_plan.plan_step`)
  with the wire's element size;
- ``powersgd:R``: ``ddl.torch``'s buckets, each, once its gradients have landed, sends
  PowerSGD's two allreduces one after the other on the one engine, with its matrix
  products (at ``flop_rate``) before, between and after them; the products run on the
  rank's core, so they add to the step;
- ``localsgd:H[:HOOK]``, ``diloco:H[:HOOK]`` (``+overlap``: the average travels during
  the next H steps): H steps of compute, then one round of pseudo-gradients through HOOK
  (none, fp16, bf16, powersgd-R) in 25 MiB buckets, spread over the H steps.

Bytes per step are what crosses one host's port: 2(h-1)/h of each allreduce's bytes on
h hosts (the bandwidth-optimal algorithms'), and the engine's negotiation: every cycle,
busy or idle, gathers each rank's 4 KiB record (:func:`cycle_port_bytes`), one cycle per
engine round and the idle ones in the gaps (:func:`idle_cycles`); without packet headers.
On PowerSGD's small rounds the records are a third of the bytes.

Example:
    ddl plan --topology 1x4 --link 100mbit:200us --model 2048x64,2048,2048x2048,2048,10x2048,10 \\
        --step-ms 40 --modes sync,powersgd:4,diloco:20:fp16
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ddl.base.config import DEFAULT_FUSION_BYTES, DEFAULT_SEGMENT_BYTES
from ddl.base.topology import Topology
from ddl.engine import codec
from ddl.engine.auto_compression import (
    DEFAULT_FLOP_RATE,
    DEFAULT_MEMORY_RATE,
    AutoCompression,
    Decision,
    hook_seconds,
)
from ddl.engine.compression import Compression, Compressor
from ddl.engine.hooks import CommHook, Traffic, traffic
from ddl.engine.powersgd import PowerSGD
from ddl.reduction import calibration, cost
from ddl.reduction.buckets import (
    BUCKET_BYTES,
    FIRST_BUCKET_BYTES,
    FLAGS_PER_TENSOR,
    gradient_buckets,
    plan_buckets,
)
from ddl.reduction.step_plan import landing_times, plan_step, price

__all__ = ["DEFAULT_FLOP_RATE", "DEFAULT_MEMORY_RATE", "Mode", "ModeError", "ModePlan", "auto_decisions", "mode_lines",
           "parse_hook", "parse_mode", "plan_mode", "predict_mode"]



class ModeError(ValueError):
    """A ``--modes`` entry that is not one of the forms the module docstring lists."""


@dataclasses.dataclass(frozen=True)
class Mode:
    """One way of training: gradients every step through ``hook`` (``period`` 1), or local
    SGD / DiLoCo every ``period`` steps with pseudo-gradients through ``hook``."""

    label: str
    kind: str  # "step", "localsgd" or "diloco"
    hook: Compressor | CommHook | AutoCompression
    period: int = 1
    overlap: int = 0


def parse_hook(text: str, where: str = "hook") -> Compressor | CommHook | AutoCompression:
    """``none``, ``fp16``, ``bf16``, ``powersgd:R`` (or ``powersgd-R``) as a hook; PowerSGD
    from its first step (``start_iter=0``: the steady state is what is priced and timed);
    ``auto[:HOOK]``: :class:`~ddl.engine.auto_compression.AutoCompression` of HOOK (fp16).

    Raises:
        ModeError: anything else.

    Example:
        >>> parse_hook("powersgd:4")
        ddl.PowerSGD(rank=4, start_iter=0, min_compression_rate=2, error_feedback=True, warm_start=True)
    """
    name, _, arg = text.replace("-", ":").partition(":")
    if name == "auto":
        inner = parse_hook(arg or "fp16", where)
        if isinstance(inner, AutoCompression) or inner is Compression.none:
            raise ModeError(f"{where}: auto takes a hook to use where it pays, e.g. auto:fp16 or auto:powersgd:4; "
                            f"got {text!r}")
        return AutoCompression(inner)
    if name in ("none", "sync"):
        return Compression.none
    if name in ("fp16", "bf16"):
        return getattr(Compression, name)  # type: ignore[no-any-return]
    if name == "powersgd":
        try:
            return PowerSGD(rank=int(arg or 1), start_iter=0)
        except ValueError:
            raise ModeError(f"{where}: powersgd takes a whole rank, e.g. powersgd:4; got {text!r}") from None
    raise ModeError(f"{where}: unknown hook {text!r}; use none, fp16, bf16, powersgd:R or auto[:HOOK]")


def parse_mode(text: str) -> Mode:
    """``sync``, ``fp16``, ``bf16``, ``powersgd:R``, ``auto[:HOOK]``, ``localsgd:H[:HOOK][+overlap]`` or
    ``diloco:H[:HOOK][+overlap]`` (HOOK: none, fp16, bf16, powersgd-R).

    Raises:
        ModeError: anything else (the message shows the forms).

    Example:
        >>> parse_mode("diloco:20:fp16").period
        20
    """
    body, plus, flag = text.strip().partition("+")
    if plus and flag != "overlap":
        raise ModeError(f"mode {text!r}: the only suffix is +overlap")
    name, _, rest = body.partition(":")
    if name in ("sync", "fp16", "bf16", "powersgd", "auto"):
        if plus:
            raise ModeError(f"mode {text!r}: +overlap is for localsgd and diloco")
        return Mode(text, "step", parse_hook(body, f"mode {text!r}"))
    if name in ("localsgd", "diloco"):
        period_text, _, hook_text = rest.partition(":")
        try:
            period = int(period_text)
        except ValueError:
            period = 0
        if period < 1:
            raise ModeError(f"mode {text!r}: give the period, e.g. {name}:20 or {name}:20:fp16")
        hook = parse_hook(hook_text or "none", f"mode {text!r}")
        if isinstance(hook, AutoCompression):
            raise ModeError(f"mode {text!r}: auto chooses per gradient bucket of a step; give {name} its hook")
        return Mode(text, name, hook, period, period if plus else 0)
    raise ModeError(f"unknown mode {text!r}; use sync, fp16, bf16, powersgd:R, auto[:HOOK], "
                    "localsgd:H[:HOOK][+overlap] or diloco:H[:HOOK][+overlap]")


@dataclasses.dataclass(frozen=True)
class ModePlan:
    """A mode's predicted average step: its time, the communication and hook work in it,
    and the bytes that cross one host's port per step (the allreduces' and the engine's
    negotiation: ``cycles`` per step, ``negotiation_bytes`` of them)."""

    label: str
    step_s: float
    comm_s: float
    hook_compute_s: float
    link_bytes: float
    wire_bytes: float
    cycles: float = 0.0
    negotiation_bytes: float = 0.0


def _port_share(topology: Topology) -> float:
    h = topology.cross_size
    return 2 * (h - 1) / h if h > 1 else 0.0


#: The engine's idle cycles (``ddl.engine.engine``): the first this long after work, each
#: next one twice as late, at most :data:`IDLE_MAX` apart.
IDLE_MIN, IDLE_MAX = 0.02, 0.32


def idle_cycles(gap: float) -> int:
    """Cycles the engine runs with nothing to do in ``gap`` seconds after work: each one,
    like a busy one, is a collective on every rank (its record crosses the link)."""
    count, at, wait = 0, 0.0, IDLE_MIN
    while at + wait < gap:
        at += wait
        count += 1
        wait = min(2 * wait, IDLE_MAX)
    return count


def cycle_port_bytes(topology: Topology) -> float:
    """Bytes one engine cycle sends through a host's port: below
    :data:`~ddl.engine.codec.COMPACT_FROM` ranks every rank gathers every rank's record
    (its inline payload, 4 KiB below 17 ranks, and its header words), so p - L records
    leave a host of L ranks (measured on 4 emulated hosts x 1 rank: 12.9 KB a cycle against
    3 x 4136 B); from there, an allreduce of a few words."""
    p, local = topology.size, topology.size // max(1, topology.cross_size)
    if topology.cross_size <= 1:
        return 0.0
    if codec.compact(p):
        return _port_share(topology) * codec.COMPACT_WORDS * 8
    return float((p - local) * codec.record_bytes(p))


def cycle_seconds(topology: Topology, model: cost.CostModel) -> float:
    """What one engine cycle adds before the allreduce it runs, where nobody measured it:
    its records through the host's port (:func:`cycle_port_bytes`) at the outer link's
    rate, and one latency. The calibration prices schedules alone, not the negotiation; a
    measured figure (``emulation.slowlinks`` times a one-element allreduce through the
    engine) also holds the thread hand-offs of a loaded machine."""
    if topology.size == 1:
        return 0.0
    link = model.link(len(topology.dims) - 1 if topology.cross_size > 1 else 0)
    return link.alpha + cycle_port_bytes(topology) * link.beta


def _cycles_in(busy: Sequence[tuple[float, float]], period: float) -> float:
    """Cycles in one ``period`` of a repeating timeline whose engine works in the ``busy``
    (start, end) spans (one cycle each, in time order): those plus the idle ones in the gaps
    between them, the last one's end wrapping round to the first one's start."""
    if not busy:
        return float(idle_cycles(period))
    spans = sorted(busy)
    gaps = [b[0] - a[1] for a, b in zip(spans, spans[1:], strict=False)]
    gaps.append(period - spans[-1][1] + spans[0][0])
    return float(len(spans) + sum(idle_cycles(g) for g in gaps))


def _round_time(topology: Topology, t: Traffic, model: cost.CostModel) -> float:
    return sum(price("auto", topology, max(1, r.count), r.itemsize, model) for r in t.rounds)


def plan_mode(mode: Mode, shapes: Sequence[tuple[int, ...]], itemsize: int, topology: Topology,
              model: cost.CostModel, *, step: float, backward_fraction: float = 2 / 3,
              flop_rate: float = DEFAULT_FLOP_RATE, memory_rate: float = DEFAULT_MEMORY_RATE,
              cast_rate: float | None = None, cycle_s: float | None = None, first_cap: int = FIRST_BUCKET_BYTES,
              cap: int = BUCKET_BYTES, fusion_threshold: int = DEFAULT_FUSION_BYTES) -> ModePlan:
    """The average step of ``mode`` for gradients of ``shapes`` (``step``: the step's compute, seconds).

    ``flop_rate``: PowerSGD's products; ``memory_rate``: element-wise passes; ``cast_rate``
    (default ``memory_rate``): a compressor's casts, in bytes read and written per second
    (:mod:`ddl.tools.plan_rates` measures all three). ``cycle_s``: what each engine round
    costs besides its allreduce (default :func:`cycle_seconds`); a hook's rounds run one
    after another, so PowerSGD pays it twice a bucket.

    Example:
        >>> plan_mode(parse_mode("diloco:20"), [(10, 10)], 4, topo, model, step=0.05).step_s  # doctest: +SKIP
    """
    numels = [math.prod(s) for s in shapes]
    share = _port_share(topology)
    per_cycle = cycle_seconds(topology, model) if cycle_s is None else cycle_s
    if isinstance(mode.hook, AutoCompression):
        chosen = {d.compress for _, _, d in auto_decisions(mode.hook, shapes, itemsize, topology, model,
                                                            first_cap=first_cap, cap=cap)}
        inner = mode.hook.hook
        if chosen == {False} or (chosen == {True} and isinstance(inner, Compressor)):
            # One hook for every bucket: priced as that mode is.
            alone = dataclasses.replace(mode, hook=inner if chosen == {True} else Compression.none)
            return plan_mode(alone, shapes, itemsize, topology, model, step=step, backward_fraction=backward_fraction,
                             flop_rate=flop_rate, memory_rate=memory_rate, cast_rate=cast_rate, cycle_s=cycle_s,
                             first_cap=first_cap, cap=cap, fusion_threshold=fusion_threshold)
    if mode.kind == "step" and isinstance(mode.hook, Compressor):
        wire = traffic(mode.hook, [(1,)], itemsize).rounds[0].itemsize
        planned = plan_step(numels, wire, topology, model, step=step, backward_fraction=backward_fraction,
                            first_cap=first_cap, cap=cap, fusion_threshold=fusion_threshold)
        comm = sum(r.end - r.start for r in planned.reductions)
        sent = float(sum(r.count for r in planned.reductions) * wire)
        # The casts (pack before a bucket's allreduce, unpack after) run in the engine's
        # cycle, in line with the reductions: each adds to the step's end.
        casts = sum(hook_seconds(mode.hook, traffic(mode.hook, [(r.count,)], itemsize), r.count, itemsize,
                                 memory_rate=cast_rate or memory_rate) for r in planned.reductions)
        # Each reduction's cycle negotiates first: in line too.
        took = max(step, planned.end + casts + per_cycle * len(planned.reductions))
        cycles = _cycles_in([(r.start, r.end) for r in planned.reductions], took)
        talk = cycles * cycle_port_bytes(topology)
        return ModePlan(mode.label, took, comm, casts, share * sent + talk, float(sent), cycles, talk)
    if mode.kind == "step":
        return _hooked_step(mode, shapes, itemsize, topology, model, step=step, backward_fraction=backward_fraction,
                            flop_rate=flop_rate, memory_rate=memory_rate, cycle_s=per_cycle, first_cap=first_cap,
                            cap=cap)
    # Local SGD / DiLoCo: one round of pseudo-gradients per period, in HookedBuckets' buckets.
    buckets = plan_buckets([n * itemsize for n in numels], [itemsize] * len(numels), first_cap=BUCKET_BYTES,
                           cap=BUCKET_BYTES, order=list(range(len(numels))))
    comm, hook_s, sent = 0.0, 0.0, 0.0
    # A round's own passes over the weights: the deltas, the copy at its start, the outer
    # update (DiLoCo's optimizer reads and writes more), the weights put back.
    passes = (20.0 if mode.kind == "diloco" else 12.0) * itemsize
    assert not isinstance(mode.hook, AutoCompression)  # parse_mode refuses it here
    for members in buckets:
        t = traffic(mode.hook, [tuple(shapes[i]) for i in members], itemsize)
        comm += _round_time(topology, t, model) + per_cycle * len(t.rounds)
        count = sum(numels[i] for i in members)
        hook_s += (hook_seconds(mode.hook, t, count, itemsize, flop_rate=flop_rate, memory_rate=cast_rate or memory_rate)
                   + passes * count / memory_rate)
        sent += t.nbytes
    hidden = mode.overlap * step  # the inner steps the round travels behind
    per_round = hook_s + max(0.0, comm - hidden)
    # One cycle per bucket of the round, then the engine idles through the period's steps.
    period = mode.period * step + per_round
    cycles = (len(buckets) + idle_cycles(period - comm)) / mode.period
    talk = cycles * cycle_port_bytes(topology)
    return ModePlan(mode.label, step + per_round / mode.period, comm / mode.period, hook_s / mode.period,
                    share * sent / mode.period + talk, sent / mode.period, cycles, talk)


def _hooked_step(mode: Mode, shapes: Sequence[tuple[int, ...]], itemsize: int, topology: Topology,
                 model: cost.CostModel, *, step: float, backward_fraction: float, flop_rate: float,
                 memory_rate: float, cycle_s: float, first_cap: int, cap: int) -> ModePlan:
    """A stateful hook on ``ddl.torch``'s buckets: each bucket's rounds once it has landed."""
    numels = [math.prod(s) for s in shapes]
    buckets = gradient_buckets(numels, [itemsize] * len(numels), first_cap=first_cap, cap=cap)
    lands = landing_times([n * itemsize for n in numels], step=step, backward_fraction=backward_fraction)
    ready = sorted((max(lands[i] for i in b.members), k) for k, b in enumerate(buckets))
    engine_free = end = comm = hook_s = sent = 0.0
    busy: list[tuple[float, float]] = []
    for at, k in ready:
        members = buckets[k].members
        layout = [tuple(shapes[i]) for i in members] + [(FLAGS_PER_TENSOR * len(members),)]
        hook = mode.hook
        if isinstance(hook, AutoCompression):  # this bucket's choice, as ddl.torch makes it
            hook = hook.resolve(layout, _float_dtype(itemsize), topology, model)
        t = traffic(hook, layout, itemsize)
        local = t.flops / flop_rate + t.memory_bytes / memory_rate
        work = local / (len(t.rounds) + 1)  # before, between and after the rounds
        hook_s += local
        clock = at + work
        for r in t.rounds:
            start = max(engine_free, clock)
            took = cycle_s + price("auto", topology, max(1, r.count), r.itemsize, model)
            engine_free = start + took
            busy.append((start, engine_free))
            comm += took
            sent += r.nbytes
            clock = engine_free + work
        end = max(end, clock)
    took = max(step + hook_s, end)
    cycles = _cycles_in(busy, took)
    talk = cycles * cycle_port_bytes(topology)
    return ModePlan(mode.label, took, comm, hook_s, _port_share(topology) * sent + talk, sent, cycles, talk)


def _float_dtype(itemsize: int) -> np.dtype:
    return np.dtype(f"f{itemsize}")


def auto_decisions(auto: AutoCompression, shapes: Sequence[tuple[int, ...]], itemsize: int, topology: Topology,
                   model: cost.CostModel, *, first_cap: int = FIRST_BUCKET_BYTES,
                   cap: int = BUCKET_BYTES) -> list[tuple[int, int, Decision]]:
    """``ddl.torch``'s gradient buckets for ``shapes`` and what ``auto`` decides for each:
    (bucket, elements, decision), the presence flags included as ``ddl.torch`` packs them."""
    numels = [math.prod(s) for s in shapes]
    out = []
    for k, b in enumerate(gradient_buckets(numels, [itemsize] * len(numels), first_cap=first_cap, cap=cap)):
        layout = [tuple(shapes[i]) for i in b.members] + [(FLAGS_PER_TENSOR * len(b.members),)]
        out.append((k, sum(math.prod(s) for s in layout), auto.decide(layout, itemsize, topology, model)))
    return out


def _decision_lines(modes: Sequence[Mode], shapes: Sequence[tuple[int, ...]], itemsize: int, topology: Topology,
                    model: cost.CostModel, *, flop_rate: float, memory_rate: float, first_cap: int,
                    cap: int) -> tuple[list[str], dict[str, Any]]:
    """What each ``auto`` mode decides, bucket by bucket (priced at the given rates)."""
    lines: list[str] = []
    rows: dict[str, Any] = {}
    for mode in modes:
        if not isinstance(mode.hook, AutoCompression):
            continue
        auto = dataclasses.replace(mode.hook, flop_rate=flop_rate, memory_rate=memory_rate)
        found = auto_decisions(auto, shapes, itemsize, topology, model, first_cap=first_cap, cap=cap)
        kept = sum(d.compress for _, _, d in found)
        lines.append(f"{mode.label}: {auto.hook!r} on {kept} of {len(found)} gradient buckets "
                     "(link time saved against the hook's own work, per step):")
        for k, count, d in found:
            lines.append(f"  bucket {k} ({count} elements): {'compress' if d.compress else 'plain'} - {d.reason}")
        rows[mode.label] = [{"bucket": k, "elements": count, **dataclasses.asdict(d)} for k, count, d in found]
    return lines, rows


def mode_lines(modes: Sequence[str], shapes: Sequence[tuple[int, ...]], itemsize: int, topology: Topology,
               model: cost.CostModel, *, step: float, backward_fraction: float, flop_rate: float,
               memory_rate: float, first_cap: int, cap: int,
               fusion_threshold: int, cast_rate: float | None = None,
               cycle_s: float | None = None) -> tuple[list[str], list[dict[str, Any]]]:
    """The printed table of ``--modes`` and its JSON rows."""
    parsed = [parse_mode(m) for m in modes]
    parsed = [dataclasses.replace(m, hook=dataclasses.replace(m.hook, flop_rate=flop_rate, memory_rate=memory_rate))
              if isinstance(m.hook, AutoCompression) else m for m in parsed]
    plans = [plan_mode(m, shapes, itemsize, topology, model, step=step,
                       backward_fraction=backward_fraction, flop_rate=flop_rate, memory_rate=memory_rate,
                       cast_rate=cast_rate, cycle_s=cycle_s, first_cap=first_cap, cap=cap,
                       fusion_threshold=fusion_threshold)
             for m in parsed]
    base = plans[0]
    casts = f"{(cast_rate or memory_rate) / 1e9:.3g}"
    per_cycle = cycle_seconds(topology, model) if cycle_s is None else cycle_s
    lines = [f"modes (average step; bytes a host's port carries per step, the engine's cycles' records included, "
             f"without headers; hooks' products at {flop_rate / 1e9:.3g} GFLOP/s, their passes at "
             f"{memory_rate / 1e9:.3g} GB/s, casts at {casts} GB/s; {per_cycle * 1e3:.3g} ms an engine round "
             "besides its allreduce; first mode = 1x):",
             f"{'mode':<26} {'step ms':>9} {'comm ms':>9} {'hook ms':>8} {'MB/step':>9} {'cycles':>7} {'bytes':>8} "
             f"{'speed':>7}"]
    for p in plans:
        ratio = p.link_bytes / base.link_bytes if base.link_bytes else float("nan")
        lines.append(f"{p.label:<26} {p.step_s * 1e3:9.1f} {p.comm_s * 1e3:9.1f} {p.hook_compute_s * 1e3:8.1f} "
                     f"{p.link_bytes / 1e6:9.3f} {p.cycles:7.2f} {ratio:8.4f} {base.step_s / p.step_s:6.1f}x")
    more, decisions = _decision_lines(parsed, shapes, itemsize, topology, model, flop_rate=flop_rate,
                                      memory_rate=memory_rate, first_cap=first_cap, cap=cap)
    rows = [dataclasses.asdict(p) for p in plans]
    for row in rows:
        if row["label"] in decisions:
            row["auto"] = decisions[row["label"]]
    return lines + more, rows


def predict_mode(mode: str, shapes: Sequence[tuple[int, ...]], *, topology: str, calibration_file: str,
                 step_ms: float, flop_rate: float = DEFAULT_FLOP_RATE, memory_rate: float = DEFAULT_MEMORY_RATE,
                 cast_rate: float | None = None, cycle_s: float | None = None, itemsize: int = 4) -> dict[str, Any]:
    """One mode priced with a calibration file ``init`` wrote (what ``emulation.slowlinks`` compares with).

    Raises:
        ModeError: a bad mode. OSError, ValueError: an unreadable calibration file.
    """
    from ddl.base.topology import build_topology, parse_spec

    dims = parse_spec(topology).dims
    size = math.prod(dims)
    topo = build_topology(0, [f"host{r // dims[0]}" for r in range(size)], topology)
    model, _ = calibration.read_model(calibration_file, segment_bytes=DEFAULT_SEGMENT_BYTES)
    if not model.native_points:
        model = cost.extend_native(model, topo)
    plan = plan_mode(parse_mode(mode), shapes, itemsize, topo, model, step=step_ms / 1e3, flop_rate=flop_rate,
                     memory_rate=memory_rate, cast_rate=cast_rate, cycle_s=cycle_s)
    return dataclasses.asdict(plan)
