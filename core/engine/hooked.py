"""A fixed list of arrays reduced through one communication hook, bucket by bucket, in the background if wanted.

What an adapter uses when it reduces a whole list at once rather than gradient by
gradient during backward: Keras's gradients under a stateful hook, and the
pseudo-gradients of local SGD and DiLoCo in both frameworks. The arrays are planned
into buckets once (by the planner ``ddl.torch`` uses, one dtype per bucket), each with
its own flat buffer; every call writes the values into :meth:`HookedBuckets.views`,
:meth:`~HookedBuckets.start` hands each bucket to :func:`~ddl.engine.hooks.apply_hook`,
and the returned :class:`Pending` is polled or waited on.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ddl.base.ops import ReduceOp
from ddl.engine.compression import Compressor
from ddl.engine.hooks import CommHook, Future, GradBucket, Submitter, apply_hook, as_hook
from ddl.reduction.buckets import BUCKET_BYTES, plan_buckets

__all__ = ["HookedBuckets", "Pending"]


class Pending:
    """The reductions of one :meth:`HookedBuckets.start`; ``wait()`` returns the reduced views.

    ``done()`` moves every bucket's hook on (a PowerSGD bucket starts its second
    allreduce once its first is done), so polling it between training steps keeps the
    reduction going in the background.
    """

    def __init__(self, futures: list[Future], views: list[np.ndarray]) -> None:
        self._futures = futures
        self._views = views

    def done(self) -> bool:
        """Advance every bucket without blocking; True once all are reduced."""
        return all([f.done() for f in self._futures])  # a list: every future polled, not the first pending only

    def wait(self) -> list[np.ndarray]:
        """Finish every bucket; the reduced values, one view per array (valid until the next start)."""
        for f in self._futures:
            f.wait()
        return self._views


class HookedBuckets:
    """Arrays of fixed shapes and dtypes, reduced through ``hook`` in buckets of up to ``cap_bytes``.

    Args:
        shapes, dtypes: one per array, in order (the adapter's parameters).
        hook: a compressor or a stateful hook (``ddl.PowerSGD``); ``state`` is its state
            (default: a new one; the object keeps it as :attr:`state`).
        name: the collectives' name stem, the same on every rank.
        op: ``ddl.Average`` (default) or ``ddl.Sum``.
        out_axis: a weight's output dimension (0 in torch, -1 in Keras), for PowerSGD.
        cap_bytes: the bucket cap (default 25 MiB, DDP's).
        matmul: the matrix product a hook uses (:attr:`GradBucket.matmul`; ``ddl.torch`` passes torch's).

    Raises:
        ValueError: shapes and dtypes of different lengths, or an unknown hook.

    Example:
        >>> hb = HookedBuckets([(3, 4), (4,)], [np.float32] * 2, hook=ddl.Compression.fp16, name="deltas")  # doctest: +SKIP
        >>> for view, d in zip(hb.views(), deltas): view[...] = d          # doctest: +SKIP
        >>> averaged = hb.start(collectives).wait()                       # doctest: +SKIP
    """

    def __init__(self, shapes: Sequence[tuple[int, ...]], dtypes: Sequence[Any], *, hook: Any, name: str,
                 op: ReduceOp = ReduceOp.AVERAGE, out_axis: int = 0, cap_bytes: int = BUCKET_BYTES,
                 state: Any = None, matmul: Callable[..., Any] = np.matmul) -> None:
        if len(shapes) != len(dtypes):
            raise ValueError(f"{len(shapes)} shapes but {len(dtypes)} dtypes")
        self.hook: Compressor | CommHook = as_hook(hook)
        self.state = state if state is not None or isinstance(self.hook, Compressor) else self.hook.new_state()
        self.name, self.op, self.out_axis, self.matmul = name, op, out_axis, matmul
        kinds = [np.dtype(d) for d in dtypes]
        sizes = [math.prod(s) for s in shapes]
        plan = plan_buckets([n * k.itemsize for n, k in zip(sizes, kinds, strict=True)], kinds,
                            first_cap=cap_bytes, cap=cap_bytes, order=list(range(len(shapes))))
        self._buckets: list[tuple[np.ndarray, tuple[tuple[int, ...], ...]]] = []
        self._views: list[np.ndarray] = [np.empty(0)] * len(shapes)
        for members in plan:
            buffer = np.zeros(sum(sizes[i] for i in members), kinds[members[0]])
            at = 0
            for i in members:
                self._views[i] = buffer[at : at + sizes[i]].reshape(shapes[i])
                at += sizes[i]
            self._buckets.append((buffer, tuple(tuple(shapes[i]) for i in members)))
        self._pending: Pending | None = None

    def views(self) -> list[np.ndarray]:
        """Where to write each array's values before :meth:`start` (and where the results are after)."""
        return self._views

    def start(self, collectives: Submitter) -> Pending:
        """Reduce what the views hold, every bucket through the hook; returns at once.

        Raises:
            RuntimeError: the last reduction is still in flight (wait for it first).
        """
        if self._pending is not None and not self._pending.done():
            raise RuntimeError(f"{self.name}: a reduction is still in flight; wait() for it before the next start()")
        futures = [apply_hook(self.hook, self.state,
                              GradBucket(k, f"{self.name}.b{k}", buffer, shapes, self.op, collectives, self.out_axis,
                                         self.matmul))
                   for k, (buffer, shapes) in enumerate(self._buckets)]
        self._pending = Pending(futures, self._views)
        return self._pending

    @property
    def nbytes(self) -> int:
        """Bytes of all arrays."""
        return sum(b.nbytes for b, _ in self._buckets)
