"""PowerSGD (Vogels et al. 2019, arXiv:1905.13727) as a stateful communication hook, in numpy.

Each weight of a bucket is seen as a matrix M (n x m: its output dimension by the rest,
:func:`~ddl.engine.hooks.matrix_shape`) and sent as two thin ones. With this rank's
error added first (error feedback) and Q (m x r) kept from the last step (warm start):

1. P = M Q, averaged over the ranks (one allreduce, with every tensor left
   uncompressed: biases, small weights);
2. P is orthogonalised (a reduced QR), then Q = Mᵀ P, averaged (a second allreduce);
3. the bucket gets P Qᵀ — the same bits on every rank — and this rank keeps
   M - P Qᵀ as its error for the next step.

A weight is compressed only where it pays: n·m > ``min_compression_rate`` · (n+m)·r
(PyTorch's rule). For the first ``start_iter`` calls of a bucket it is reduced plainly.
With r ≥ min(n, m) and no error feedback the result is the plain average (P spans
every column of the averaged M), up to rounding.

Every step is linear in the ranks' M: the average of the P's is (mean M) Q, and of the Q's
(mean M)ᵀ P. So N ranks with error feedback apply what one process applies to the mean
gradient with the ranks' mean error, and a resume at another world size that gives each
rank the mean error continues that run. What the state keeps across steps, scale changes
and skipped steps is :class:`PowerSGDState`'s.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from ddl.base.dtypes import is_floating
from ddl.engine.hooks import Future, GradBucket, Round, Traffic, matrix_shape

__all__ = ["PowerSGD", "PowerSGDState"]


@dataclasses.dataclass(frozen=True)
class _Part:
    """One tensor of a bucket: where it lies and, if compressed, its matrix and rank."""

    offset: int
    size: int
    rows: int = 0
    cols: int = 0
    rank: int = 0  # 0: sent uncompressed


def _layout(hook: PowerSGD, shapes: Sequence[tuple[int, ...]], out_axis: int) -> list[_Part]:
    parts, at = [], 0
    for shape in shapes:
        size = math.prod(shape)
        matrix = matrix_shape(tuple(shape), out_axis)
        part = _Part(at, size)
        if matrix is not None:
            n, m = matrix
            r = min(hook.rank, n, m)
            if n * m > hook.min_compression_rate * (n + m) * r:
                part = _Part(at, size, n, m, r)
        parts.append(part)
        at += size
    return parts


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    """Half types are multiplied in float32 (the engine's accumulator rule); others as they are."""
    return np.dtype(np.float32) if dtype.itemsize < 4 else dtype


@dataclasses.dataclass
class _Update:
    """What one call of a bucket changes, kept apart until the step that used it is taken:
    the call count, Q (None for a plain call) and, with error feedback, the new error (left in
    the memory's scratch buffers), in units of ``scale``."""

    qs: list[np.ndarray] | None
    scale: float


class _BucketMemory:
    """What PowerSGD keeps for one bucket between steps: calls, Q per weight, this rank's errors.

    ``errors`` are in units of the loss scale ``errors_scale`` (1: unscaled gradients);
    ``scratch`` holds a call's M and then its new error until the call's update is applied
    (``pending``, see :class:`PowerSGDState`).
    """

    def __init__(self, hook: PowerSGD, bucket: GradBucket) -> None:
        self.calls = 0
        self.parts = _layout(hook, bucket.shapes, bucket.out_axis)
        self.compressed = [p for p in self.parts if p.rank]
        self.plain = [p for p in self.parts if not p.rank]
        self.dtype = _compute_dtype(bucket.buffer.dtype)
        self.qs: list[np.ndarray] = [_random_q(hook.seed, bucket.index, j, 0, p, self.dtype)
                                     for j, p in enumerate(self.compressed)]
        self.errors: list[np.ndarray] | None = None
        self.errors_scale = 1.0
        self.scratch: list[np.ndarray] | None = None
        self.pending: _Update | None = None
        p_count = sum(p.rows * p.rank for p in self.compressed) + sum(p.size for p in self.plain)
        self.p_buffer = np.empty(p_count, self.dtype)
        self.q_buffer = np.empty(sum(p.cols * p.rank for p in self.compressed), self.dtype)
        self.uncompressed = bucket.buffer.size
        self.sent = self.p_buffer.size + self.q_buffer.size

    def matrices(self) -> list[np.ndarray]:
        """Zeroed matrices, one per compressed weight (error buffers)."""
        return [np.zeros((p.rows, p.cols), self.dtype) for p in self.compressed]


def _random_q(seed: int, bucket: int, j: int, call: int, part: _Part, dtype: np.dtype) -> np.ndarray:
    """The starting Q of a weight: the same on every rank (seeded by its place, not by the rank)."""
    rng = np.random.default_rng([seed, bucket, j, call])
    return rng.standard_normal((part.cols, part.rank)).astype(dtype)


class PowerSGDState:
    """One reducer's PowerSGD memory: per bucket, Q (the warm start) and this rank's error.

    - **Shared and own.** :meth:`state_dict` holds what every rank shares (call counts and
      Q); :meth:`errors_state_dict` this rank's errors. :meth:`load_state_dict` takes the
      first and, if given, errors (a checkpoint's resume at the same world size gives each
      rank its own; at another the ranks' mean, which keeps what the ranks still owe the
      average), else starts them at zero, losing at most one step's compression error.
    - **A step that is not taken** (``deferred``). An adapter that knows when the step using a
      reduction is applied sets ``deferred = True`` and calls :meth:`commit` then; a call
      whose update was not committed by the bucket's next call is dropped, so a step that a
      ``GradScaler`` skips leaves the state as it was.
      Otherwise each call's update applies when it finishes.
    - **Non-finite gradients** (an overflow on any rank) give a non-finite result on every
      rank (the scaler's cue to skip the step) and change nothing: no inf or NaN is ever
      kept in Q or in an error. ``skipped`` counts the calls that changed nothing, either way.
    - **A loss scale.** ``loss_scale`` is the factor the bucket's values carry this step
      (an adapter sets it from the loss scaler); errors kept at another scale are brought
      to it first, so the error memory follows a scale that grows or backs off. With powers
      of two (``GradScaler``'s, Keras's) this is exact: the run equals the unscaled one.

    Example:
        >>> opt = ddl.torch.DistributedOptimizer(sgd, compression=ddl.PowerSGD(rank=4))  # doctest: +SKIP
        >>> opt.compression_stats()["compression_rate"]                                # doctest: +SKIP
    """

    def __init__(self, hook: PowerSGD) -> None:
        self.hook = hook
        self.buckets: dict[tuple[Any, ...], _BucketMemory] = {}
        self.deferred = False  # updates wait for commit() (the adapter commits when the step is taken)
        self.loss_scale = 1.0  # the factor this step's values carry (a loss scaler's)
        self.skipped = 0  # calls that changed nothing: values not finite, or their step not taken
        self._before = 0  # elements of the buckets reduced by PowerSGD so far
        self._after = 0  # elements PowerSGD sent for them
        self._compressed_calls = 0
        # From load_state_dict, for buckets not seen yet: the shared part, and this rank's errors.
        self._loaded: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._loaded_errors: dict[tuple[Any, ...], list[np.ndarray]] = {}

    @property
    def iteration(self) -> int:
        """Steps seen: the most calls of any bucket."""
        return max((b.calls for b in self.buckets.values()), default=0)

    def memory(self, bucket: GradBucket) -> _BucketMemory:
        """The memory of ``bucket`` (made on its first call, from a loaded state where there is one)."""
        mem = self.buckets.get(bucket.key)
        if mem is None:
            mem = self.buckets[bucket.key] = _BucketMemory(self.hook, bucket)
            saved = self._loaded.pop(bucket.key, None)
            if saved is not None:
                self._load_into(mem, saved, self._loaded_errors.pop(bucket.key, None))
        return mem

    def count(self, mem: _BucketMemory) -> None:
        """Count one compressed call of ``mem``'s bucket in the statistics."""
        self._before += mem.uncompressed
        self._after += mem.sent
        self._compressed_calls += 1

    def compression_stats(self) -> dict[str, float]:
        """Elements before and after compression over the compressed steps so far, their
        ratio, and the steps seen.

        Example:
            >>> state.compression_stats()  # doctest: +SKIP
            {'iteration': 120, 'compressed_calls': 220, 'elements_before': ..., 'elements_after': ..., 'compression_rate': 117.3}
        """
        rate = self._before / self._after if self._after else 1.0
        return {"iteration": self.iteration, "compressed_calls": self._compressed_calls,
                "elements_before": self._before, "elements_after": self._after, "compression_rate": rate}

    # -- updates: applied when a call finishes, or when the adapter commits its step ----------
    def stage(self, mem: _BucketMemory, update: _Update) -> None:
        """Keep ``update`` until :meth:`commit` (deferred), or apply it now."""
        if self.deferred:
            mem.pending = update
        else:
            self._apply(mem, update)

    def relabel(self, scale: float) -> None:
        """The values reduced since the last commit carried ``scale`` (an adapter learnt of
        its loss scaler only now): their updates' errors are in its units; so are the next
        steps' values until told otherwise."""
        self.loss_scale = scale
        for mem in self.buckets.values():
            if mem.pending is not None:
                mem.pending.scale = scale

    def commit(self) -> None:
        """The step that used the reductions since the last commit is taken: apply their updates."""
        for mem in self.buckets.values():
            if mem.pending is not None:
                self._apply(mem, mem.pending)

    def rollback(self) -> None:
        """The step that used the reductions since the last commit is not taken: drop their updates."""
        for mem in self.buckets.values():
            self.drop(mem)

    def drop(self, mem: _BucketMemory) -> None:
        """Forget ``mem``'s uncommitted update: the step that used it was not taken."""
        if mem.pending is not None:
            mem.pending = None
            self.skipped += 1

    @staticmethod
    def _apply(mem: _BucketMemory, update: _Update) -> None:
        mem.calls += 1
        if update.qs is not None:
            mem.qs = update.qs
            if mem.scratch is not None and mem.errors is not None:
                mem.errors, mem.scratch = mem.scratch, mem.errors
                mem.errors_scale = update.scale
        mem.pending = None

    # -- saving and loading ----------------------------------------------------------------
    def reset_errors(self) -> None:
        """Forget every rank-local error (kept Q and call counts stay)."""
        for mem in self.buckets.values():
            mem.errors, mem.scratch, mem.pending = None, None, None
        self._loaded_errors = {}

    def state_dict(self) -> dict[str, Any]:
        """What every rank shares: each bucket's call count and Q (copies), and the loss scale
        (the next step's, where the adapter has set it: a resume's first step needs it before
        its loss scaler is seen)."""
        return {"buckets": {key: {"calls": m.calls, "qs": [q.copy() for q in m.qs]} for key, m in self.buckets.items()},
                "loss_scale": self.loss_scale}

    def errors_state_dict(self) -> dict[str, Any]:
        """This rank's own part: each bucket's errors in unscaled units (copies; buckets
        without errors yet are left out)."""
        out = {key: [e / m.errors_scale for e in m.errors] for key, m in self.buckets.items() if m.errors is not None}
        return {"buckets": out}

    def load_state_dict(self, state: dict[str, Any], errors: dict[str, Any] | None = None) -> None:
        """Take call counts and Q from :meth:`state_dict`, and errors from
        :meth:`errors_state_dict` if given (else they start at zero).

        Buckets not yet seen here take theirs when they first come (same key: same layout).
        """
        self.reset_errors()
        self.loss_scale = float(state.get("loss_scale", 1.0))
        self._loaded = dict(state.get("buckets", {}))
        self._loaded_errors = dict((errors or {}).get("buckets", {}))
        for key, mem in self.buckets.items():
            saved = self._loaded.pop(key, None)
            if saved is not None:
                self._load_into(mem, saved, self._loaded_errors.pop(key, None))

    @staticmethod
    def _load_into(mem: _BucketMemory, saved: dict[str, Any], errors: list[np.ndarray] | None) -> None:
        if len(saved["qs"]) == len(mem.qs):
            mem.calls = int(saved["calls"])
            mem.qs = [np.array(q, mem.dtype) for q in saved["qs"]]
            shapes = [(p.rows, p.cols) for p in mem.compressed]
            if errors is not None and [tuple(np.shape(e)) for e in errors] == shapes:
                mem.errors, mem.errors_scale = [np.array(e, mem.dtype) for e in errors], 1.0


@dataclasses.dataclass(frozen=True)
class PowerSGD:
    """PowerSGD gradient compression as a communication hook (its state: :class:`PowerSGDState`).

    Args:
        rank: r, the rank of the approximation (1 in PyTorch's hook; Vogels et al. used 2 on
            ResNet-18/CIFAR-10 and 4 on an LSTM). A weight's own rank is at most min(n, m).
        start_iter: plain allreduce for a bucket's first ``start_iter`` steps (PowerSGD
            after the model's first fast-moving steps).
        min_compression_rate: compress a weight only if n·m > rate · (n+m)·r; others travel
            uncompressed with the P matrices. 0: compress every matrix.
        error_feedback: add the part left out last step (this rank's error) to the gradient.
        warm_start: start from last step's Q (one power iteration per step keeps improving it);
            False draws a new one each step.
        seed: the seed of the random starting Q (the same on every rank).

    Raises:
        ValueError: a rank below 1, a negative ``start_iter`` or ``min_compression_rate``.

    Example:
        >>> opt = ddl.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
        ...                                      compression=ddl.PowerSGD(rank=4))  # doctest: +SKIP
    """

    rank: int = 1
    start_iter: int = 10
    min_compression_rate: float = 2.0
    error_feedback: bool = True
    warm_start: bool = True
    seed: int = 0
    name: ClassVar[str] = "powersgd"

    def __post_init__(self) -> None:
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 1:
            raise ValueError(f"PowerSGD rank must be an integer >= 1, got {self.rank!r}")
        if not isinstance(self.start_iter, int) or self.start_iter < 0:
            raise ValueError(f"PowerSGD start_iter must be an integer >= 0, got {self.start_iter!r}")
        if not self.min_compression_rate >= 0:
            raise ValueError(f"PowerSGD min_compression_rate must be >= 0, got {self.min_compression_rate!r}")

    def new_state(self) -> PowerSGDState:
        return PowerSGDState(self)

    def __repr__(self) -> str:
        return (f"ddl.PowerSGD(rank={self.rank}, start_iter={self.start_iter}, min_compression_rate="
                f"{self.min_compression_rate:g}, error_feedback={self.error_feedback}, warm_start={self.warm_start})")

    # -- the hook ---------------------------------------------------------------------
    def __call__(self, state: PowerSGDState, bucket: GradBucket) -> Future:
        """Start reducing ``bucket``; the future's result is the reduced buffer.

        Raises:
            TypeError: the bucket does not hold floating-point values.
        """
        if not is_floating(bucket.buffer.dtype):
            raise TypeError(f"PowerSGD compresses floating-point values; bucket {bucket.name!r} holds "
                            f"{bucket.buffer.dtype}: reduce it with ddl.Compression.none")
        mem = state.memory(bucket)
        state.drop(mem)  # an update still uncommitted: the step that used it was not taken
        call = mem.calls + 1
        if call <= self.start_iter or not mem.compressed:
            state.stage(mem, _Update(None, state.loss_scale))
            return Future(bucket.collectives.allreduce_async(bucket.buffer, op=bucket.op, name=bucket.name,
                                                              inplace=True))
        state.count(mem)
        scale = state.loss_scale
        matrices = self._start(mem, bucket, call, scale)
        first = bucket.collectives.allreduce_async(mem.p_buffer, op=bucket.op, name=f"{bucket.name}.powersgd.p",
                                                   inplace=True)
        ortho: list[np.ndarray] = []
        return (Future(first)
                .then(lambda _: self._middle(mem, bucket, matrices, ortho))
                .then(lambda _: self._finish(state, mem, bucket, matrices, ortho, scale)))

    def _start(self, mem: _BucketMemory, bucket: GradBucket, call: int, scale: float) -> list[np.ndarray]:
        """M per compressed weight (this rank's error added, brought to this step's loss scale),
        P = M Q into the first buffer, the uncompressed tensors after them."""
        buf, dtype = bucket.buffer, mem.dtype
        if self.error_feedback:
            if mem.errors is None:
                mem.errors, mem.errors_scale = mem.matrices(), scale
            elif mem.errors_scale != scale:  # the same errors in this step's units (exact for powers of 2)
                for e in mem.errors:
                    e *= dtype.type(scale / mem.errors_scale)
                mem.errors_scale = scale
            if mem.scratch is None:
                mem.scratch = mem.matrices()
        qs = ([_random_q(self.seed, bucket.index, j, call, p, dtype) for j, p in enumerate(mem.compressed)]
              if not self.warm_start else mem.qs)
        matrices, at = [], 0
        for j, part in enumerate(mem.compressed):
            grad = buf[part.offset : part.offset + part.size].reshape(part.rows, part.cols)
            if mem.errors is not None and mem.scratch is not None:
                m = mem.scratch[j]
                np.add(mem.errors[j], grad, out=m)  # the scratch holds M until _finish takes the approximation off
            else:
                m = grad.astype(dtype, copy=False)
            with np.errstate(invalid="ignore", over="ignore"):  # an overflowed gradient: _middle sees it in P
                bucket.matmul(m, qs[j], out=mem.p_buffer[at : at + part.rows * part.rank].reshape(part.rows, part.rank))
            at += part.rows * part.rank
            matrices.append(m)
        for part in mem.plain:
            mem.p_buffer[at : at + part.size] = buf[part.offset : part.offset + part.size]
            at += part.size
        return matrices

    def _middle(self, mem: _BucketMemory, bucket: GradBucket, matrices: list[np.ndarray],
                ortho: list[np.ndarray]) -> Any:
        """Orthogonalise each averaged P, send Q = Mᵀ P. A non-finite P (some rank's values
        overflowed; the same bits on every rank) ends the call here on every rank."""
        if not np.isfinite(mem.p_buffer).all():
            return None
        at = q_at = 0
        for part, m in zip(mem.compressed, matrices, strict=True):
            p = mem.p_buffer[at : at + part.rows * part.rank].reshape(part.rows, part.rank)
            basis = np.linalg.qr(p)[0]
            ortho.append(basis)
            bucket.matmul(m.T, basis, out=mem.q_buffer[q_at : q_at + part.cols * part.rank].reshape(part.cols, part.rank))
            at += part.rows * part.rank
            q_at += part.cols * part.rank
        return bucket.collectives.allreduce_async(mem.q_buffer, op=bucket.op, name=f"{bucket.name}.powersgd.q",
                                                  inplace=True)

    def _finish(self, state: PowerSGDState, mem: _BucketMemory, bucket: GradBucket, matrices: list[np.ndarray],
                ortho: list[np.ndarray], scale: float) -> np.ndarray:
        """The approximation P Qᵀ into the bucket, and the update (the new error, Q) staged;
        after a non-finite round, NaN in the compressed weights and nothing staged."""
        buf = bucket.buffer
        at = sum(p.rows * p.rank for p in mem.compressed)
        for part in mem.plain:
            buf[part.offset : part.offset + part.size] = mem.p_buffer[at : at + part.size]
            at += part.size
        if len(ortho) < len(mem.compressed) or not np.isfinite(mem.q_buffer).all():
            for part in mem.compressed:
                buf[part.offset : part.offset + part.size] = np.nan
            state.skipped += 1
            return buf
        q_at, qs = 0, []
        for j, (part, basis) in enumerate(zip(mem.compressed, ortho, strict=True)):
            q = mem.q_buffer[q_at : q_at + part.cols * part.rank].reshape(part.cols, part.rank)
            q_at += part.cols * part.rank
            target = buf[part.offset : part.offset + part.size].reshape(part.rows, part.cols)
            if target.dtype == basis.dtype:  # P Qᵀ made in place: no temporary, one pass fewer
                approx = bucket.matmul(basis, q.T, out=target)
            else:
                approx = bucket.matmul(basis, q.T)
                target[...] = approx
            if mem.errors is not None:
                matrices[j] -= approx  # the scratch: M - P Qᵀ, the error this call leaves
            qs.append(q.copy())
        state.stage(mem, _Update(qs, scale))
        return buf

    # -- what it sends ------------------------------------------------------------------
    def products(self, shapes: Sequence[tuple[int, ...]], *, out_axis: int = 0) -> list[tuple[int, int, int]]:
        """(n, m, r) of each weight of a bucket of ``shapes`` that is compressed: its matrix and
        rank, the shapes of the three products M Q, Mᵀ P and P Qᵀ (what ``ddl plan`` times)."""
        return [(p.rows, p.cols, p.rank) for p in _layout(self, shapes, out_axis) if p.rank]

    def traffic(self, shapes: Sequence[tuple[int, ...]], itemsize: int, *, out_axis: int = 0) -> Traffic:
        """The two allreduces of a bucket of ``shapes`` in steady state (one, plain, where nothing
        is compressed), the multiply-adds around them (M Q, Mᵀ P, P Qᵀ, the QR) and the
        element-wise passes (the error added and taken off, P Qᵀ made and written back; the
        uncompressed tensors copied out and back)."""
        parts = _layout(self, shapes, out_axis)
        compressed = [p for p in parts if p.rank]
        wire = max(itemsize, 4)  # half types are multiplied and sent in float32
        if not compressed:
            return Traffic((Round(sum(p.size for p in parts), wire),))
        first = sum(p.rows * p.rank for p in compressed) + sum(p.size for p in parts if not p.rank)
        second = sum(p.cols * p.rank for p in compressed)
        flops = sum(6.0 * p.rows * p.cols * p.rank + 4.0 * p.rows * p.rank * p.rank for p in compressed)
        # Passes besides the products (which read M twice and write P Qᵀ over the bucket):
        # the error added (read two, write one) and the approximation taken off (the same);
        # a half bucket's values cast to float32 and P Qᵀ cast back.
        per = (6.0 if self.error_feedback else 0.0) + (3.0 if itemsize < 4 else 0.0)
        passes = sum(per * p.rows * p.cols for p in compressed) + sum(4.0 * p.size for p in parts if not p.rank)
        return Traffic((Round(first, wire), Round(second, wire)), flops, passes * wire)
