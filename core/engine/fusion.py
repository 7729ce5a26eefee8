"""Runs what a cycle matched: fused allreduce buckets, inline small ones, other collectives.

Ready allreduces are fused into buffers of one (dtype, wire dtype, op, algorithm) up to
the fusion threshold, in the order the cycle agreed (identical on every rank), and the
results are split back as views of the fused buffer (no copy). A batch small enough to
travel inside the cycle's own negotiation record (:func:`~ddl.engine.codec.inline_capacity`) is reduced from
that record locally, in rank order, so every rank gets the same bits.

One numeric rule for half types (float16, bfloat16) on every path: they are
*accumulated in float32* — the fused buffer (or the inline sum) is float32, reduced by
whichever algorithm, divided for Average, and rounded to the half type once at the
end. So precision does not depend on a tensor's size or the algorithm, and an Average
of large half values cannot overflow. Compression (fp16/bf16 *on the wire*, also on
half-type tensors) is the stated exception: partial sums then travel, and are rounded,
in the wire type at each hop (each addition itself done in float32 by numpy); Average
divides before casting.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ddl.base import dtypes
from ddl.base.dtypes import accumulator
from ddl.base.ops import ReduceOp, ufunc
from ddl.engine.compression import Compression, Compressor
from ddl.engine.context import Context
from ddl.engine.handle import Handle
from ddl.engine.negotiation import Descriptor
from ddl.engine.timeline import Timeline
from ddl.reduction.buckets import SOLO_BYTES, FusionItem, fuse
from ddl.reduction.scattered import Scattered, Source

__all__ = ["SOLO_BYTES", "Request", "execute", "finish_inline", "inline_bytes", "pack_inline", "reduce_payloads", "reduce_with",
           "trace_inline"]


@dataclasses.dataclass(slots=True, eq=False)
class Request:
    """One submitted collective. ``run`` executes a non-allreduce request in the engine;
    ``error`` is set on a request of kind ``"error"``: a call whose arguments this rank
    refused, which still takes part in the negotiation so the other ranks end it too."""

    kind: str
    name: str
    descriptor: Descriptor
    handle: Handle
    run: Callable[[], Any] | None = None
    array: np.ndarray | None = None
    op: ReduceOp = ReduceOp.SUM
    algorithm: str = "auto"
    compression: Compressor = Compression.none
    inplace: bool = False
    submitted: float = 0.0
    digest: int = 0
    error: BaseException | None = None
    prescale: float = 1.0  # Horovod's prescale_factor/postscale_factor, around the sum
    postscale: float = 1.0
    divisor: int = 0  # what Average divides by; 0: the world size (join() lowers it)


def inline_bytes(batch: list[Request], capacity: int) -> int:
    """Payload size if ``batch`` can ride in the negotiation record (``capacity`` bytes:
    the exchange's :attr:`~ddl.engine.codec.Exchange.inline_capacity`), else 0.

    Depends only on the descriptors, so ranks that agree on them agree on this.
    """
    if not batch or not capacity or batch[0].array is None:
        return 0
    first = batch[0]
    dtype, op, total = first.array.dtype, first.op, 0  # type: ignore[union-attr]
    for r in batch:
        a, comp = r.array, r.compression
        if a is None or r.algorithm != "auto" or comp is not Compression.none or r.op is not op:
            return 0
        if r.prescale != 1.0 or r.postscale != 1.0 or r.divisor:
            return 0
        if a.dtype != dtype:
            return 0
        total += a.nbytes
        if total > capacity:
            return 0
    return total


def pack_inline(batch: list[Request], payload: np.ndarray) -> None:
    """Copy the batch's arrays, in order, into the uint8 ``payload``."""
    offset = 0
    for r in batch:
        a = r.array
        assert a is not None
        n = a.size * a.itemsize
        if a.flags.c_contiguous:
            payload[offset : offset + n] = a.reshape(-1).view(np.uint8)
        else:
            payload[offset : offset + n].view(a.dtype).reshape(a.shape)[...] = a
        offset += n


def finish_inline(ctx: Context, batch: list[Request], payloads: list[np.ndarray], nbytes: int,
                  timeline: Timeline | None, span: tuple[float, float]) -> None:
    """Reduce every rank's payload (uint8, in rank order) and deliver the results."""
    first = batch[0]
    assert first.array is not None
    dtype, op = first.array.dtype, first.op
    first_part = payloads[0][:nbytes].view(dtype).astype(accumulator(dtype))
    out = reduce_payloads([first_part, *(q[:nbytes].view(dtype) for q in payloads[1:])], op, first_part)
    if len(batch) == 1 and not first.inplace and out.dtype == dtype:
        first.handle.set_result(out.reshape(first.array.shape))
    else:
        _deliver(batch, out, dtype)
    if timeline is not None:
        trace_inline(timeline, batch, nbytes, span)


def trace_inline(timeline: Timeline, batch: list[Request], nbytes: int, span: tuple[float, float]) -> None:
    """Record a batch reduced from the exchanged records: queued, then the exchange."""
    first = batch[0]
    assert first.array is not None
    info = {"bytes": nbytes, "algorithm": "inline", "tensors": len(batch), "dtype": str(first.array.dtype)}
    for r in batch:
        timeline.tensor(r.name, r.submitted, span[0], span[0], [("inline allgather", *span)], span[1], info)


#: From this many ranks on, a lane reads every rank's payload through one strided array.
STACKED_FROM = 8


def reduce_payloads(parts: list[np.ndarray], op: ReduceOp, into: np.ndarray | None) -> np.ndarray:
    """Every rank's part (two or more) reduced in rank order, into ``into`` or a new array,
    divided for Average: the one order both the inline and the lean path use, so every
    rank gets the same bits on either."""
    return reduce_with(parts, ufunc(op), op is ReduceOp.AVERAGE, into)


def reduce_with(parts: list[np.ndarray] | np.ndarray, combine: Callable[..., np.ndarray], average: bool,
                into: np.ndarray | None, scale: tuple[np.ufunc, np.generic] | None = None) -> np.ndarray:
    """:func:`reduce_payloads` with the op's ufunc already looked up (the lean path's);
    ``scale``: an Average's division already prepared (:func:`ddl.base.dtypes.float_division`).

    ``parts`` may also be one array of every rank's part along its first axis (a lane's
    view of the gathered records, from :data:`STACKED_FROM` ranks): its ufunc's
    ``accumulate`` then adds them in the same order, each row to the sum of those before
    it, so the same bits, in one call instead of p - 1 (10-15 us at 32 ranks, each
    microsecond of which their cores' sharing multiplies)."""
    if type(parts) is np.ndarray:
        last = combine.accumulate(parts, axis=0)[-1, ...]  # type: ignore[attr-defined]
        if into is None:
            out = last
        else:
            into[...] = last
            out = into
    else:
        if into is None:  # an array even for 0-d parts (a ufunc would return a scalar)
            into = np.empty(parts[0].shape, np.result_type(parts[0].dtype, parts[1].dtype))
        out = combine(parts[0], parts[1], out=into)
        if len(parts) > 2:  # (a slice of two costs a small call more than the test)
            for part in parts[2:]:
                combine(out, part, out=out)
    if scale is not None:
        scale[0](out, scale[1], out)
    elif average:
        dtypes.divide(out, len(parts))
    return out  # type: ignore[no-any-return]


def execute(ctx: Context, ready: list[Request], fusion_threshold: int, timeline: Timeline | None, *,
            solo: bool = True, digest: int = 0) -> None:
    """Run ``ready`` in order: allreduces fused into buckets by :func:`ddl.reduction.buckets.fuse`
    (the rule ``ddl plan`` prices with), the rest one by one.

    ``solo=False``: large in-place tensors are fused like the rest (a cycle with joined
    ranks, whose stand-ins are not in place, must bucket exactly as the others do).
    ``digest``: the negotiation's combined digest of exactly ``ready``, in order (0: none).
    """
    if len(ready) == 1 and ready[0].kind == "allreduce":  # one call alone: its own bucket, nothing to plan
        _run_bucket(ctx, ready, timeline)
        return
    for group in _groups(ready, fusion_threshold, solo, digest):
        first = ready[group[0]]
        if first.kind != "allreduce":
            _run_single(first, timeline)
        else:
            _run_bucket(ctx, [ready[i] for i in group], timeline)


#: The last few batches' groups, by what :func:`fuse` reads of them: a training step
#: submits the same requests every step, and building 256 items costs more than a key.
_plans: dict[tuple[Any, ...], list[list[int]]] = {}


def _groups(ready: list[Request], fusion_threshold: int, solo: bool, digest: int = 0) -> list[list[int]]:
    """:func:`fuse` of ``ready``, remembered for a batch seen before (``digest``: the
    combined digest of ``ready``, when the negotiation computed one)."""
    if len(ready) < 8:
        return fuse([_fusion_item(req, solo) for req in ready], fusion_threshold)
    # A digest fixes kind, shape, dtype, op, algorithm, compression and scaling; the rest
    # of an item is whether it is in place and contiguous, and what Average divides by
    # (which only join() sets). The batch's combined digest stands for all of its requests'
    # in order, so then only the requests in place or with a divisor need a word of their own.
    if digest:
        key: tuple[Any, ...] = (fusion_threshold, solo, digest, len(ready), *[
            (i, r.divisor, r.inplace and r.array is not None and r.array.flags.c_contiguous)
            for i, r in enumerate(ready) if r.inplace or r.divisor])
    else:
        if not all(r.digest for r in ready):  # a stand-in (join) has none: plan it afresh
            return fuse([_fusion_item(req, solo) for req in ready], fusion_threshold)
        key = (fusion_threshold, solo, *[(r.digest, r.inplace, r.divisor,
                                          r.array is not None and r.array.flags.c_contiguous) for r in ready])
    plan = _plans.get(key)
    if plan is None:
        if len(_plans) >= 16:
            _plans.clear()
        plan = _plans[key] = fuse([_fusion_item(req, solo) for req in ready], fusion_threshold)
    return plan


def _fusion_item(req: Request, solo: bool) -> FusionItem | None:
    if req.kind != "allreduce":
        return None
    a, comp = req.array, req.compression
    assert a is not None
    wire = comp.wire_dtype(a.dtype)
    key = (a.dtype, wire, req.op, req.algorithm, req.prescale, req.postscale, req.divisor)
    return FusionItem(key, a.size * wire.itemsize,
                      solo and req.inplace and wire == a.dtype and bool(a.flags.c_contiguous))


def reduce_in_place(ctx: Context, flat: np.ndarray, op: ReduceOp, algorithm: str) -> None:
    """What :func:`_run_bucket` does for a bucket of one in-place, contiguous, unscaled
    request of a dtype that is its own accumulator (the same calls, so the same bits and
    the same trials), without the bucket: the engine's direct path for such a call."""
    chosen, trial = ctx.algorithm_for_run(algorithm, flat.size, flat.itemsize)
    start = time.perf_counter()
    ctx.allreduce_flat(flat, op, chosen, divisor=ctx.topology.size)
    if trial is not None:
        ctx.trials.observe(trial, chosen, time.perf_counter() - start)  # type: ignore[union-attr]


def _run_single(req: Request, timeline: Timeline | None) -> None:
    # No try here: a failure after the ranks agreed to run this leaves the others in
    # the collective; the engine turns it into a job abort (see its contract).
    assert req.run is not None
    start = time.perf_counter()
    req.handle.set_result(req.run())
    if timeline is not None:
        timeline.span(req.name, req.kind, req.submitted, start, time.perf_counter(), {})


def _run_bucket(ctx: Context, bucket: list[Request], timeline: Timeline | None) -> None:
    """Pack the bucket through its compressor, reduce it with its algorithm, unpack it."""
    first = bucket[0]
    assert first.array is not None
    dtype, comp = first.array.dtype, first.compression
    wire = comp.wire_dtype(dtype)
    total = _elements(bucket)
    start = time.perf_counter()
    divisor = first.divisor or ctx.topology.size
    # Compressed: each rank divides before the cast down, so the half sum cannot overflow.
    prescale = first.op is ReduceOp.AVERAGE and comp.compresses(dtype)
    op = ReduceOp.SUM if prescale else first.op
    single = len(bucket) == 1 and wire == dtype and not prescale
    given: Source | None = None  # the input, where the algorithm may read it instead of a copy in ``fused``
    if single:
        src = first.array
        if first.inplace and src.flags.c_contiguous:
            fused = src.reshape(-1)
        elif src.flags.c_contiguous and first.prescale == 1.0:
            fused, given = np.empty(total, dtype=dtype), src.reshape(-1)
        else:
            fused = np.array(src, order="C").reshape(-1)
    else:
        fused = np.empty(total, dtype=wire)
        arrays = [r.array for r in bucket if r.array is not None]
        if wire == dtype and not prescale and first.prescale == 1.0:
            given = Scattered(arrays)  # read where they lie: no pack pass (ddl.reduction.scattered)
        else:
            comp.compress(arrays, fused, divisor=divisor if prescale else None)
    dtypes.scale(fused, first.prescale)
    algorithm, trial = ctx.algorithm_for_run(first.algorithm, total, wire.itemsize)
    fused_at = time.perf_counter()
    phases: list[tuple[str, float, float]] = []
    ctx.allreduce_flat(fused, op, algorithm, on_phase=phases.append if timeline is not None else None,
                       divisor=divisor, src=given)
    if trial is not None:
        ctx.trials.observe(trial, algorithm, time.perf_counter() - fused_at)  # type: ignore[union-attr]
    dtypes.scale(fused, first.postscale)
    _deliver(bucket, fused, dtype, comp, single=single)
    if timeline is not None:
        end = time.perf_counter()
        info = {"bytes": int(total * wire.itemsize), "algorithm": algorithm, "tensors": len(bucket), "dtype": str(wire)}
        for r in bucket:
            timeline.tensor(r.name, r.submitted, start, fused_at, phases, end, info)


def _deliver(bucket: list[Request], fused: np.ndarray, dtype: np.dtype, comp: Compressor = Compression.none, *,
             single: bool = False) -> None:
    """Split ``fused`` back into each request's result (views; copies only in place or to cast)."""
    offset = 0
    cast = fused.dtype != dtype  # else each result is a view of ``fused`` (one line per tensor per step)
    for r in bucket:
        arr = r.array
        assert arr is not None
        n = arr.size
        out = fused[offset : offset + n]
        if arr.ndim != 1:
            out = out.reshape(arr.shape)
        offset += n
        if cast and r.inplace:  # straight into the caller's array: one pass, nothing allocated
            out = comp.decompress(out, dtype, into=arr)
        elif cast:
            out = comp.decompress(out, dtype)
        if r.inplace:
            if not cast and not (single and arr.flags.c_contiguous):
                arr[...] = out
            out = arr
        r.handle.set_result(out)


def _elements(requests: list[Request]) -> int:
    return sum(0 if r.array is None else int(r.array.size) for r in requests)
