"""Communication hooks in DDP's shape, ``hook(state, bucket) -> Future``, and the one place they are applied.

A *bucket* (:class:`GradBucket`) is one flat buffer of this rank's values (gradients,
or DiLoCo's pseudo-gradients) and the shapes packed in it. A *hook* reduces it over the
ranks and returns a :class:`Future` of the reduced buffer. Two kinds share that shape:

- the wire compressors ``ddl.Compression.none/fp16/bf16``
  (:class:`~ddl.engine.compression.Compressor`): stateless, one allreduce, packed and
  unpacked by :mod:`ddl.engine.fusion` as before;
- *stateful hooks* (:class:`ddl.engine.powersgd.PowerSGD`, or your own): an object with
  ``__call__(state, bucket) -> Future`` and ``new_state()``; the state lives between
  steps (one per optimizer), and the hook issues its own collectives through
  ``bucket.collectives`` (the engine, as every collective).

:func:`apply_hook` is where every framework's buckets meet their hook; :func:`traffic`
says what a hook sends for a bucket of given shapes, which ``ddl plan`` prices.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ddl.base.ops import ReduceOp
from ddl.engine.compression import Compressor, as_compressor
from ddl.engine.handle import Handle

__all__ = ["CommHook", "Future", "GradBucket", "Round", "Submitter", "Traffic", "apply_hook", "as_hook",
           "is_identity", "matrix_shape", "traffic"]


class Submitter(Protocol):
    """What a hook issues its collectives through (:class:`ddl.engine.collectives.Collectives`)."""

    def allreduce_async(self, x: Any, *, op: Any = ..., name: str | None = ..., algorithm: str | None = ...,
                        compression: Any = ..., inplace: bool = ..., wake: bool = ..., prescale: float = ...,
                        postscale: float = ...) -> Handle: ...


def matrix_shape(shape: tuple[int, ...], out_axis: int) -> tuple[int, int] | None:
    """The matrix a tensor of ``shape`` is seen as: (its ``out_axis`` dimension, the product of
    the others), e.g. a torch conv kernel ``(out, in, kh, kw)`` -> ``(out, in*kh*kw)`` and a
    Keras one ``(kh, kw, in, out)`` (``out_axis=-1``) -> ``(kh*kw*in, out)``; None below 2 dims."""
    if len(shape) < 2:
        return None
    rest = math.prod(shape) // max(1, shape[out_axis])
    return (shape[0], rest) if out_axis == 0 else (rest, shape[-1])


@dataclasses.dataclass
class GradBucket:
    """One bucket handed to a hook: this rank's values, flat, and what is packed in them.

    Attributes:
        index: the bucket's position among its reducer's buckets (stable between steps).
        name: a name the same on every rank; the hook names its collectives after it.
        buffer: a contiguous 1-D array of this rank's values; the hook may overwrite it,
            and the reduced values end up in it (:func:`apply_hook` sees to that).
        shapes: the shapes of the tensors packed in ``buffer``, in order (their sizes add
            up to ``buffer.size``).
        op: ``ddl.Average`` or ``ddl.Sum`` over the ranks.
        collectives: where the hook submits its collectives (a process set's, or the world's).
        out_axis: the output dimension of a weight (0 in torch, -1 in Keras), for hooks that
            see tensors as matrices (:func:`matrix_shape`).
        matmul: the matrix product hooks use (``matmul(a, b, out=None)``, numpy's signature):
            numpy's, or the adapter's framework's (``ddl.torch`` passes torch's, which follows
            ``torch.set_num_threads`` as the model does, where numpy's BLAS starts its own
            threads on every core).

    Example:
        >>> b = GradBucket(0, "opt.b0", np.zeros(6, np.float32), ((2, 3),), ddl.Average, collectives)  # doctest: +SKIP
    """

    index: int
    name: str
    buffer: np.ndarray
    shapes: tuple[tuple[int, ...], ...]
    op: ReduceOp
    collectives: Submitter
    out_axis: int = 0
    matmul: Callable[..., Any] = np.matmul

    def __post_init__(self) -> None:
        if self.buffer.ndim != 1 or not self.buffer.flags.c_contiguous:
            raise ValueError(f"bucket {self.name!r}: the buffer must be a contiguous 1-D array, got shape "
                             f"{self.buffer.shape}")
        total = sum(math.prod(s) for s in self.shapes)
        if total != self.buffer.size:
            raise ValueError(f"bucket {self.name!r}: its shapes hold {total} elements but the buffer has "
                             f"{self.buffer.size}")
        if self.op not in (ReduceOp.AVERAGE, ReduceOp.SUM):
            raise ValueError(f"bucket {self.name!r}: hooks reduce with ddl.Average or ddl.Sum, got {self.op!r}")

    @property
    def key(self) -> tuple[Any, ...]:
        """What a stateful hook keys its per-bucket state by: position, dtype and layout."""
        return (self.index, str(self.buffer.dtype), self.shapes)

    def offsets(self) -> list[int]:
        """Where each tensor starts in ``buffer``."""
        out, at = [], 0
        for s in self.shapes:
            out.append(at)
            at += math.prod(s)
        return out

    def tensors(self) -> list[np.ndarray]:
        """Each tensor, as a view of ``buffer`` in its shape."""
        return [self.buffer[o : o + math.prod(s)].reshape(s) for o, s in zip(self.offsets(), self.shapes, strict=True)]


_Step = Callable[[Any], Any]


class Future:
    """A hook's pending result: collectives in flight and the local work that follows each.

    ``then(fn)`` appends a step: once what is pending has finished, ``fn`` gets its result
    and returns the next thing to wait for (a :class:`~ddl.engine.handle.Handle` or another
    Future) or a plain value. ``done()`` moves the chain on without blocking, so a caller
    that polls (``ddl.torch`` polls during backward) starts a hook's next collective as
    soon as the previous one has finished; ``wait()`` runs it to the end.

    Example:
        >>> f = Future(ddl.allreduce_async(p, name="p")).then(lambda p: ddl.allreduce_async(q(p), name="q"))  # doctest: +SKIP
        >>> result = f.wait()  # doctest: +SKIP
    """

    __slots__ = ("_error", "_pending", "_result", "_steps", "_value")

    def __init__(self, pending: Any = None) -> None:
        """``pending``: a Handle or Future to wait for, or a value that is ready now."""
        self._pending = pending
        self._steps: collections.deque[_Step] = collections.deque()
        self._result: Any = None
        self._error: BaseException | None = None
        self._value = False  # the chain has ended (with a result or an error)

    def then(self, fn: _Step) -> Future:
        """Run ``fn(result)`` once the pending part is done; returns this future (chained)."""
        if self._value:
            raise RuntimeError("Future.then() on a future that has already finished")
        self._steps.append(fn)
        return self

    def done(self) -> bool:
        """Advance without blocking; True once the whole chain has finished."""
        self._advance(block=False, timeout=None)
        return self._value

    def wait(self, timeout: float | None = None) -> Any:
        """Run the chain to its end and return the last result (raise its error)."""
        self._advance(block=True, timeout=timeout)
        if self._error is not None:
            raise self._error
        return self._result

    def _advance(self, *, block: bool, timeout: float | None) -> None:
        while not self._value:
            pending = self._pending
            waitable = isinstance(pending, (Handle, Future))
            try:
                if waitable and not block and not pending.done():
                    return
                value = pending.wait(timeout) if waitable else pending
                if not self._steps:
                    self._result, self._value = value, True
                    return
                self._pending = self._steps.popleft()(value)
            except BaseException as exc:  # the chain ends here; wait() raises it
                self._error, self._value = exc, True
                self._steps.clear()
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise


@runtime_checkable
class CommHook(Protocol):
    """A stateful communication hook: what :func:`apply_hook` accepts besides the compressors.

    ``new_state()`` makes the state one reducer keeps between steps; ``__call__(state,
    bucket)`` reduces the bucket over the ranks (its collectives named after
    ``bucket.name``) and returns a :class:`Future` of an array of ``bucket.buffer``'s size
    and dtype; ``traffic(shapes, itemsize, out_axis=...)`` says what it sends for such a
    bucket in steady state, for ``ddl plan``. The result must be identical on every rank.
    """

    @property
    def name(self) -> str: ...

    def new_state(self) -> Any: ...

    def __call__(self, state: Any, bucket: GradBucket) -> Future: ...

    def traffic(self, shapes: Sequence[tuple[int, ...]], itemsize: int, *, out_axis: int = 0) -> Traffic: ...


@dataclasses.dataclass(frozen=True)
class Round:
    """One allreduce a hook sends for a bucket: elements, and bytes per element on the wire."""

    count: int
    itemsize: int

    @property
    def nbytes(self) -> int:
        return self.count * self.itemsize


@dataclasses.dataclass(frozen=True)
class Traffic:
    """What a hook sends for one bucket: its allreduces, one after the other, and the work
    it does around them on this rank: multiply-adds (``flops``) and the bytes its
    element-wise passes read and write (``memory_bytes``, bound by memory, not arithmetic)."""

    rounds: tuple[Round, ...]
    flops: float = 0.0
    memory_bytes: float = 0.0

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for r in self.rounds)


def as_hook(value: Any) -> Compressor | CommHook:
    """A compressor (``None``, ``"fp16"``, ``ddl.Compression.fp16``, Horovod's compressor
    classes) or a stateful hook object, checked.

    Raises:
        ValueError: neither (the message lists what is accepted).
    """
    if isinstance(value, CommHook) and not isinstance(value, Compressor):
        return value
    try:
        return as_compressor(value)
    except ValueError:
        raise ValueError(f"unknown compression or communication hook {value!r}; use ddl.Compression.none, .fp16, "
                         ".bf16, or a hook object such as ddl.PowerSGD(rank=4)") from None


def is_identity(hook: Compressor | CommHook) -> bool:
    """True for ``Compression.none``: at one rank such a bucket needs no reduction at all."""
    return isinstance(hook, Compressor) and hook.wire is None


def apply_hook(hook: Compressor | CommHook, state: Any, bucket: GradBucket) -> Future:
    """Reduce ``bucket`` with ``hook``; the future's result is ``bucket.buffer``, reduced in place.

    Every adapter sends its buckets through here: a compressor becomes one in-place
    allreduce with that wire compression (packed by :mod:`ddl.engine.fusion`), a stateful
    hook is called with ``state`` and its result copied into the buffer if it returned
    another array.

    Raises:
        TypeError: a stateful hook given a bucket of a dtype it cannot reduce (its own message).
    """
    if isinstance(hook, Compressor):
        return Future(bucket.collectives.allreduce_async(bucket.buffer, op=bucket.op, name=bucket.name,
                                                          compression=hook, inplace=True))
    return hook(state, bucket).then(lambda out: _into_buffer(bucket, out))


def _into_buffer(bucket: GradBucket, out: Any) -> np.ndarray:
    arr = np.asarray(out)
    if arr.size != bucket.buffer.size:
        raise ValueError(f"the communication hook returned {arr.size} elements for bucket {bucket.name!r} of "
                         f"{bucket.buffer.size}")
    if not np.shares_memory(arr, bucket.buffer):
        bucket.buffer[...] = arr.reshape(-1)
    return bucket.buffer


def traffic(hook: Compressor | CommHook, shapes: Sequence[tuple[int, ...]], itemsize: int, *,
            out_axis: int = 0) -> Traffic:
    """What ``hook`` sends for one bucket of ``shapes`` (elements of ``itemsize`` bytes)."""
    if isinstance(hook, Compressor):
        count = sum(math.prod(s) for s in shapes)
        wire = hook.wire_dtype(np.dtype(f"f{itemsize}")) if itemsize in (2, 4, 8) else np.dtype(f"V{itemsize}")
        return Traffic((Round(count, wire.itemsize),))
    return hook.traffic(shapes, itemsize, out_axis=out_axis)
