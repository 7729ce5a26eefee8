"""Gradients on an accelerator reach host memory and come back: the reducer's device seam.

ddl reduces in host memory (MPI moves host buffers). CPU gradients are reduced where
they lie. For CUDA ones each bucket owns a pinned host buffer, made once: when the
bucket is ready its gradients are copied device→host on a side stream, ordered after
the compute stream's work so far by an event (never a device-wide synchronize), and the
allreduce is submitted once that copy has landed, which the reducer checks without
blocking while backward runs on. After the reduction the result is copied back on the
side stream and the compute stream waits on that copy's event, so the copy back of one
bucket overlaps the wait for the next.

The CUDA calls sit behind :class:`Device`, so the overlap logic is tested on CPU with a
device whose copies land late (:class:`LateCopies`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Protocol

import torch


class Copy(Protocol):
    """An asynchronous copy in flight."""

    def done(self) -> bool:
        """Whether it has landed (never blocks)."""

    def wait(self) -> None:
        """Block this thread (not the device) until it has landed."""


class Device(Protocol):
    """Moves one bucket's tensors between an accelerator and pinned host memory."""

    def to_host(self, dsts: Sequence[torch.Tensor], srcs: Sequence[torch.Tensor]) -> Copy:
        """Start copying ``srcs`` (device) into ``dsts`` (host) after the compute stream's work so far."""

    def to_device(self, dsts: Sequence[torch.Tensor], srcs: Sequence[torch.Tensor]) -> None:
        """Start copying ``srcs`` (host) into ``dsts`` (device); later compute waits for it."""


class _Event:
    """A CUDA event as a :class:`Copy`."""

    def __init__(self, event: torch.cuda.Event) -> None:
        self.event = event

    def done(self) -> bool:
        return bool(self.event.query())  # type: ignore[no-untyped-call]

    def wait(self) -> None:
        self.event.synchronize()


class CudaStreams:
    """:class:`Device` on one CUDA device: a side stream for copies, events for ordering."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.side = torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]

    def to_host(self, dsts: Sequence[torch.Tensor], srcs: Sequence[torch.Tensor]) -> Copy:
        compute = torch.cuda.current_stream(self.device)
        ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
        ready.record(compute)  # the gradients so far exist once the compute stream reaches here
        with torch.cuda.stream(self.side):
            self.side.wait_event(ready)
            for dst, src in zip(dsts, srcs, strict=True):
                dst.copy_(src, non_blocking=True)
                src.record_stream(self.side)  # the allocator keeps src until the copy has read it
            landed = torch.cuda.Event()  # type: ignore[no-untyped-call]
            landed.record(self.side)
        return _Event(landed)

    def to_device(self, dsts: Sequence[torch.Tensor], srcs: Sequence[torch.Tensor]) -> None:
        compute = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self.side):
            self.side.wait_stream(compute)  # the compute stream may still read the old .grad
            for dst, src in zip(dsts, srcs, strict=True):
                dst.copy_(src, non_blocking=True)
                dst.record_stream(self.side)
            landed = torch.cuda.Event()  # type: ignore[no-untyped-call]
            landed.record(self.side)
        compute.wait_event(landed)  # the optimizer's kernels run after the copy, on the device


class LateCopies:
    """A :class:`Device` for tests on CPU: each copy lands ``delay`` seconds after it starts,
    on a thread of its own, as an accelerator's DMA would; what it has not copied yet is
    still the old values, so a reducer that reads too early gets wrong sums."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.started = 0
        self.landed_early: list[bool] = []  # per to_host: whether it had landed when to_host returned

    def to_host(self, dsts: Sequence[torch.Tensor], srcs: Sequence[torch.Tensor]) -> Copy:
        copy = _LateCopy([s.detach().clone() for s in srcs], list(dsts), self.delay)
        self.started += 1
        self.landed_early.append(copy.done())
        return copy

    def to_device(self, dsts: Sequence[torch.Tensor], srcs: Sequence[torch.Tensor]) -> None:
        with torch.no_grad():
            for dst, src in zip(dsts, srcs, strict=True):
                dst.copy_(src)


class _LateCopy:
    def __init__(self, values: list[torch.Tensor], dsts: list[torch.Tensor], delay: float) -> None:
        self._landed = threading.Event()

        def land() -> None:
            with torch.no_grad():
                for dst, value in zip(dsts, values, strict=True):
                    dst.copy_(value)
            self._landed.set()

        self._timer = threading.Timer(delay, land)
        self._timer.daemon = True
        self._timer.start()

    def done(self) -> bool:
        return self._landed.is_set()

    def wait(self) -> None:
        self._landed.wait()


def device_for(params: Sequence[torch.Tensor]) -> Device | None:
    """The staging for a bucket of ``params``: None for CPU (reduced in place), CUDA streams otherwise.

    Raises:
        TypeError: a device type ddl cannot stage (only CPU and CUDA are known).
    """
    kind = params[0].device.type
    if kind == "cpu":
        return None
    if kind == "cuda":
        return CudaStreams(params[0].device)
    raise TypeError(f"ddl.torch reduces CPU and CUDA tensors; a {kind} parameter has no staging path "
                    "(move the model to CPU or CUDA)")
