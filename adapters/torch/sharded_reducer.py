"""A sharded optimizer's exchanges: gradients reduced to their owners, parameters gathered back.

Buckets are planned and started exactly as :class:`~ddl.torch.reducer.Reducer`'s (hooks
during backward, a small first bucket, the observed order), but each bucket's buffer is
laid out by owner: rank 0's parameters with their two flags each, then rank 1's, and so
on. Its gradients are reduced by a reduce-scatter over those segments, which leaves every
rank the sum of its own parameters' gradients, or by an allreduce where the cost model
prices that lower (:func:`ddl.reduction.segments.choose_gradient_exchange`). After the
wrapped optimizer has updated this rank's parameters, :meth:`ShardedReducer.gather_parameters`
writes them into their segment of the same buffer and an allgather hands every rank all
of them: no memory beyond the buckets, and the ``.grad`` tensors (views of the buffers)
are released to None.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from ddl.base.ops import ReduceOp
from ddl.reduction.partition import segment_bounds
from ddl.reduction.segments import ALLREDUCE, REDUCE_SCATTER, choose_gradient_exchange
from ddl.runtime import api, lifecycle

from . import staging
from .buckets import Bucket
from .collectives import TorchHandle
from .reducer import _LOCAL, Options, Reducer
from .tensors import host_view


class ShardBucket(Bucket):
    """A bucket whose buffer is cut into one segment per rank: ``[grads | dense flags | sparse
    flags]`` of the parameters that rank owns (``params`` come grouped by owner).

    ``flags``/``sparse_flags`` are this rank's own flags, as :class:`Bucket`'s, kept in a
    small tensor of their own and scattered into the segments just before the exchange.
    """

    def __init__(self, index: int, name: str, params: list[torch.Tensor], owners: list[int], world_size: int,
                 device: staging.Device | None = None) -> None:
        self.index, self.name, self.params, self.owners, self.device = index, name, params, owners, device
        n = len(params)
        self.offsets = [0] * n
        positions = [0] * (2 * n)
        counts, total = [], 0
        for r in range(world_size):
            start = total
            mine = [j for j in range(n) if owners[j] == r]
            for j in mine:
                self.offsets[j] = total
                total += params[j].numel()
            for j in mine:
                positions[j], positions[n + j] = total, total + len(mine)
                total += 1
            total += len(mine)
            counts.append(total - start)
        self.bounds = segment_bounds(counts)
        self.numel = total
        first = params[0]
        self.buffer = torch.zeros(total, dtype=first.dtype, pin_memory=first.device.type == "cuda")
        self._own_flags = torch.zeros(2 * n, dtype=first.dtype)
        self._positions = torch.tensor(positions, dtype=torch.int64)
        self.exchange = REDUCE_SCATTER
        self.ready = 0
        self.handle: object | None = None
        self.copy: staging.Copy | None = None
        self.sparse: dict[int, torch.Tensor] = {}

    @property
    def flags(self) -> torch.Tensor:
        return self._own_flags[: len(self.params)]

    @property
    def sparse_flags(self) -> torch.Tensor:
        return self._own_flags[len(self.params) :]

    def scatter_flags(self) -> None:
        """Put this rank's flags into their places in the segments (before the exchange)."""
        self.buffer.index_copy_(0, self._positions, self._own_flags)

    def reduced_flags(self) -> tuple[list[float], list[float]]:
        """The reduced dense and sparse flags of every parameter (valid in the segments this
        rank holds reduced: its own, or all of them after an allreduce or a gather)."""
        values = self.buffer.index_select(0, self._positions).tolist()
        n = len(self.params)
        return values[:n], values[n:]


class ShardedReducer(Reducer):
    """Reduces each parameter's gradient to the rank that owns it, and gathers the updated
    parameters back (see the module docstring).

    Args:
        owners: each trainable parameter's owning rank (a partition of the manifest).
        rank: this rank.
        others as :class:`~ddl.torch.reducer.Reducer`.
    """

    def __init__(self, params: Sequence[torch.Tensor], names: dict[torch.Tensor, str], options: Options, prefix: str,
                 *, owners: dict[torch.Tensor, int], rank: int, order: list[int] | None = None,
                 no_sync: bool = False) -> None:
        self.owners = owners
        self.rank = rank
        #: Gradients wanted on every rank at the next synchronize (the user called it).
        self.full_gradients = False
        super().__init__(params, names, options, prefix, order=order, no_sync=no_sync)

    def _bucket(self, index: int, name: str, params: list[torch.Tensor], device: staging.Device | None) -> Bucket:
        world = self.options.size()
        ordered = sorted(params, key=lambda p: self.owners[p])  # stable: plan order within an owner
        bucket = ShardBucket(index, name, ordered, [self.owners[p] for p in ordered], world, device)
        if world > 1:
            ctx = lifecycle.collectives().ctx
            bucket.exchange = choose_gradient_exchange(ctx.topology, bucket.bounds, ordered[0].element_size(),
                                                       ctx.model)
        return bucket

    def owns(self, p: torch.Tensor) -> bool:
        return self.owners.get(p) == self.rank

    # -- the gradient exchange ---------------------------------------------------------
    def _submit(self, bucket: Bucket) -> None:
        assert isinstance(bucket, ShardBucket)
        opts = self.options
        op, factor = opts.op, opts.gradient_predivide_factor
        with torch.no_grad():
            bucket.scatter_flags()
            if factor != 1.0:
                bucket.buffer.div_(factor)
                op = ReduceOp.SUM
        view = host_view(bucket.buffer)
        if bucket.exchange == ALLREDUCE:
            bucket.handle = api.allreduce_async(view, op=op, name=bucket.name, inplace=True)
        else:
            bucket.handle = api.reduce_segments_async(view, bucket.bounds, op=op, name=bucket.name)

    def _start_sparse(self, buckets: Sequence[Bucket]) -> list[tuple[torch.Tensor, TorchHandle]]:
        return []  # sparse gradients travel densified (sparse_as_dense): their owner makes them sparse again

    def _unpack(self, bucket: Bucket, post: float | None) -> None:
        assert isinstance(bucket, ShardBucket)
        if bucket.handle is _LOCAL:
            return  # one rank: .grad holds the gradient already
        full = bucket.exchange == ALLREDUCE or self.full_gradients
        if self.full_gradients and bucket.exchange == REDUCE_SCATTER:
            # The user wants every gradient (clipping, logging): complete the allreduce.
            api.allgather_segments_async(host_view(bucket.buffer), bucket.bounds, name=f"{bucket.name}.grads").wait()
        with torch.no_grad():
            if post is not None:
                bucket.buffer.mul_(post)
            dense, sparse = bucket.reduced_flags()
            flags = []
            for j, p in enumerate(bucket.params):
                if not (full or bucket.owners[j] == self.rank):
                    p.grad = None  # its sum is on its owner only
                    flags.append(0.0)
                elif sparse[j] > 0 and dense[j] > 0:
                    p.grad = bucket.grad_slice(j).to(p.device).to_sparse(1)  # sparse somewhere: sparse again
                    flags.append(0.0)
                else:
                    flags.append(dense[j])
            if bucket.device is not None:
                self._unpack_to_device(bucket, flags)
                return
            for j, p in enumerate(bucket.params):
                if flags[j] > 0:
                    p.grad = bucket.grad_slice(j)

    def synchronize(self, extra: Sequence[Bucket] = ()) -> None:
        try:
            super().synchronize(extra)
        finally:
            self.full_gradients = False

    def release_foreign_gradients(self) -> None:
        """Set ``.grad`` of the parameters other ranks own to None, so that the wrapped
        optimizer (which holds every parameter) updates and keeps state for this rank's only."""
        for b in self.buckets:
            for p in b.params:
                if not self.owns(p):
                    p.grad = None

    # -- the parameter exchange ----------------------------------------------------------
    def gather_parameters(self) -> None:
        """Hand every rank the parameters their owners just updated, through the buckets'
        buffers (all ``.grad`` become None: the buffers now carry parameters)."""
        with torch.no_grad():
            for b in self.buckets:
                for p in b.params:
                    p.grad = None
            if self.options.size() == 1:
                return
            handles = []
            for b in self.buckets:
                assert isinstance(b, ShardBucket)
                for j, p in enumerate(b.params):
                    if b.owners[j] == self.rank:
                        b.grad_slice(j).copy_(p.detach())
                handles.append(api.allgather_segments_async(host_view(b.buffer), b.bounds, name=f"{b.name}.params"))
            for b, h in zip(self.buckets, handles, strict=True):
                h.wait()
                assert isinstance(b, ShardBucket)
                for j, p in enumerate(b.params):
                    if b.owners[j] != self.rank:
                        p.copy_(b.grad_slice(j))
