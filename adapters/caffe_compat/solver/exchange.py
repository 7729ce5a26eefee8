"""How a Caffe net's diffs reach the other ranks: bucket by bucket while backward runs (``layer_wise_reduce``), or
all at once after it, averaged as Caffe's multi-GPU solver averages them; and rank 0's weights given to every rank.

The path from a layer's Backward to the wire, with ``layer_wise_reduce: true`` (caffe.proto's default, and what
Caffe's ``parallel.cpp`` does on GPUs):

1. ``Net.forward`` ran each Caffe layer as torch operations on its blobs; ``loss.backward()`` runs them in
   reverse, as Caffe's ``Net::Backward`` does, top layer first.
2. When autograd has written a learnable blob's diff (its ``.grad``), the blob's post-accumulate-grad hook hands it
   to :class:`ddl.torch.reducer.Reducer`, ``ddl.torch``'s own: the bucket holding the blob counts it.
3. A bucket's last blob in, its flat buffer is filled and its allreduce (``op=Average``) is queued on ddl's engine
   thread, which reduces it while backward goes on with the layers below. Buckets are ``ddl.torch``'s plan (the
   planner ``ddl plan`` prices with): a small first bucket, then ~25 MiB ones, in the order the diffs arrive (the
   ranks agree on that order after the first iteration).
4. ``Solver.apply_update`` calls :meth:`DiffExchange.averaged_diffs`: the buckets still waiting start, each is
   waited for, and every blob's ``.grad`` now holds the average over the ranks; clipping, normalization,
   regularization and the update follow, as in Caffe's ``ApplyUpdate``.

With ``layer_wise_reduce: false`` step 2 only accumulates and step 4 starts every bucket (Caffe's one allreduce
over all diffs after backward). With ``iter_size`` > 1 the diffs of the first ``iter_size - 1`` sub-iterations
accumulate locally and only the last one's backward reduces (Caffe reduces on every sub-iteration; the sum is the
same). Both settings reduce the same buckets, so they give the same weights bit for bit; only the timing differs.

Unlike Caffe, which refuses ``layer_wise_reduce`` for nets with shared weights, a shared blob is one tensor whose
diff autograd sums before its hook runs, so shared weights reduce layer-wise too.
"""

from __future__ import annotations

import dataclasses
import time

import torch

import ddl
import ddl.torch as dt
from ddl.caffe.net.net import Param
from ddl.reduction.buckets import BUCKET_BYTES, FIRST_BUCKET_BYTES, MiB
from ddl.torch.reducer import Options, Reducer


@dataclasses.dataclass
class ExchangeTimes:
    """Where the reduction's time went, summed over iterations (seconds).

    ``span``: from the first bucket's start to the last result back. ``exposed``: the part of it after backward
    ended (what the step waits for). The rest ran behind backward.
    """

    iterations: int = 0
    span: float = 0.0
    exposed: float = 0.0

    @property
    def hidden_share(self) -> float:
        """The share of the reduction's span that ran while backward was still computing (0 to 1)."""
        return 1.0 - self.exposed / self.span if self.span > 0 else 0.0


class _ClockedReducer(Reducer):
    """``ddl.torch``'s Reducer, noting when the first bucket of an iteration starts."""

    first_start: float | None = None

    def _launch(self, bucket: object) -> None:  # type: ignore[override]
        if self.first_start is None:
            self.first_start = time.perf_counter()
        super()._launch(bucket)  # type: ignore[arg-type]


class DiffExchange:
    """Averages the learnable blobs' diffs across the ranks, layer by layer during backward or after it.

    Args:
        params: the train net's learnable blobs (``Net.params``, Caffe's ``learnable_params`` order).
        layer_wise: start each bucket as soon as backward has produced its diffs (Caffe's ``layer_wise_reduce``).
        bucket_cap_mb, first_bucket_mb: ``ddl.torch``'s bucket sizes.

    Use: :meth:`begin_backward` before each sub-iteration's forward/backward (``last`` on the last of
    ``iter_size``), :meth:`averaged_diffs` in the update, :meth:`zero_diffs` before the next iteration.
    """

    def __init__(self, params: list[Param], *, layer_wise: bool, bucket_cap_mb: float = BUCKET_BYTES / MiB,
                 first_bucket_mb: float = FIRST_BUCKET_BYTES / MiB) -> None:
        self.params = params
        self.layer_wise = layer_wise
        tensors = [p.tensor for p in params]
        names = {p.tensor: f"{p.layer}.{p.index}" for p in params}
        options = Options(compression=ddl.Compression.none, backward_passes_per_step=1, op=ddl.Average,
                          gradient_predivide_factor=1.0, bucket_cap_mb=bucket_cap_mb,
                          first_bucket_mb=first_bucket_mb, sparse_as_dense=False)
        self.reducer = _ClockedReducer(tensors, names, options, "ddl_caffe.diffs", no_sync=True)
        if not layer_wise:
            # Diffs never arrive through the hooks, so there is no arrival order to agree on: keep the planned one
            # (an agreement would cost an allgather every iteration).
            self.reducer.stop_observing()
        self.times = ExchangeTimes()

    def begin_backward(self, *, last: bool) -> None:
        """Before a sub-iteration's backward: its diffs start buckets only on the last one, and only layer-wise."""
        self.reducer.no_sync = not (last and self.layer_wise)
        self.reducer.synchronized = False  # every iteration reduces, whether or not a diff arrives here

    def averaged_diffs(self) -> list[torch.Tensor]:
        """Wait for every bucket (starting those still waiting) and return each blob's averaged diff."""
        backward_end = time.perf_counter()
        self.reducer.synchronize()
        done = time.perf_counter()
        first = self.reducer.first_start if self.reducer.first_start is not None else backward_end
        self.reducer.first_start = None
        self.times.iterations += 1
        self.times.span += done - min(first, backward_end)
        self.times.exposed += done - backward_end
        out = []
        for p in self.params:
            if p.tensor.grad is None:  # no rank computed this diff (lr_mult 0, or not under a loss)
                p.tensor.grad = torch.zeros_like(p.tensor)
            out.append(p.tensor.grad)
        return out

    def zero_diffs(self) -> None:
        """Clear the diffs for the next iteration, in the bucket buffers they are views of (no allocation, no copy
        at the next launch); a diff held elsewhere is dropped."""
        for bucket in self.reducer.buckets:
            bucket.buffer.zero_()
            for j, t in enumerate(bucket.params):
                if t.grad is not None and t.grad.data_ptr() != bucket.grad_slice(j).data_ptr():
                    t.grad = None
        for p in self.params:
            if not p.tensor.requires_grad:
                p.tensor.grad = None

    def close(self) -> None:
        """Remove the hooks (before the solver builds an exchange for another world)."""
        self.reducer.close()


def average_statistics(blobs: list[torch.Tensor]) -> None:
    """Average BatchNorm's running statistics across the ranks, in place, so that every rank holds the same model.

    Each rank's forward updates them from its own batch; Caffe leaves them apart (they are no diffs, and its
    snapshots come from rank 0). The mean over ranks of the moving means is the moving mean of the ranks' batch
    means; the moving variances averaged lack the spread between the ranks' means, as Caffe's per-rank ones do.
    """
    if blobs:
        with torch.no_grad():
            for t, avg in zip(blobs, dt.grouped_allreduce(blobs, op=ddl.Average, name="ddl_caffe.statistics"),
                              strict=True):
                t.copy_(avg)


def broadcast_parameters(params: list[Param], root_rank: int = 0) -> None:
    """Give every rank ``root_rank``'s blobs (weights and BatchNorm statistics) in one fused broadcast, after a check
    that every rank built the same blobs (a clear error on every rank otherwise)."""
    dt.broadcast_parameters([(f"{p.layer}.{p.index}", p.tensor) for p in params], root_rank=root_rank)


def agree_seed(seed: int) -> int:
    """Rank 0's ``seed``, on every rank."""
    return int(ddl.broadcast_object(seed, 0, name="ddl_caffe.seed"))
