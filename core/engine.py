"""The engine: one background thread owns every MPI call after ``init``.

Callers submit named requests and get :class:`~ddl.handle.Handle` objects. Each
*cycle* the ranks agree on what is ready everywhere: one 3-element MIN allreduce of a
hash of each rank's pending list; when the lists differ, the full lists are gathered
and requests are matched by name (unnamed ones by submission order), so ranks may
submit in different orders. Ready allreduces are fused into buffers of one dtype up
to the fusion threshold and run in an order identical on every rank. Requests that
share a name but not a shape/dtype/op fail with a MismatchError on every rank; a
request missing on some ranks for the stall timeout is reported and aborts the job.
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ddl.compression import Compressor
from ddl.context import Context
from ddl.errors import DDLError, MismatchError
from ddl.handle import Handle
from ddl.negotiation import describe_mismatch, digest
from ddl.ops import ReduceOp
from ddl.timeline import Timeline


@dataclasses.dataclass
class Request:
    """One submitted collective. ``run`` executes a non-allreduce request in the engine."""

    kind: str
    name: str
    descriptor: tuple[Any, ...]
    handle: Handle
    run: Callable[[], Any] | None = None
    array: np.ndarray | None = None
    op: ReduceOp = ReduceOp.SUM
    algorithm: str = "auto"
    compression: Compressor | None = None
    inplace: bool = False
    submitted: float = 0.0
    digest: int = 0


class Engine:
    """Background executor of collectives for one :class:`Context`."""

    def __init__(
        self, ctx: Context, *, fusion_threshold: int, stall_timeout: float,
        cycle_time: float = 0.002, timeline: Timeline | None = None,
    ) -> None:
        self.ctx = ctx
        self.fusion_threshold = fusion_threshold
        self.stall_timeout = stall_timeout
        self.cycle_time = cycle_time
        self.timeline = timeline
        self._pending: list[Request] = []
        self._names: set[str] = set()
        self._cond = threading.Condition()
        self._seq = 0
        self._stop = False
        self._waiting_since: dict[str, float] = {}
        self._warned: set[str] = set()
        self._failure: BaseException | None = None
        self.cycles = 0
        self.slow_cycles = 0
        self._thread: threading.Thread | None = None
        if ctx.topology.size > 1:
            self._thread = threading.Thread(target=self._loop, name="ddl-engine", daemon=True)
            self._thread.start()

    # -- submission (any thread) ---------------------------------------------------
    def next_name(self) -> str:
        """A name for an unnamed request: one counter for every kind, so ranks that call
        different collectives at the same point collide on the name and get a MismatchError."""
        with self._cond:
            self._seq += 1
            return f"#{self._seq}"

    def submit(self, req: Request) -> Handle:
        """Queue ``req``; at world size 1 it runs at once in the caller."""
        if self._failure is not None:
            raise DDLError(f"the ddl engine has stopped after an error: {self._failure}")
        req.submitted = time.perf_counter()
        req.digest = digest(req.descriptor)
        if self._thread is None:
            self._execute([req])
            return req.handle
        with self._cond:
            if self._stop:
                raise DDLError("ddl is shutting down; no new collectives are accepted")
            if req.name in self._names:
                raise ValueError(
                    f"a collective named {req.name!r} is already in flight; wait for it or use another name"
                )
            self._names.add(req.name)
            self._pending.append(req)
            self._cond.notify()
        return req.handle

    def stop(self, timeout: float = 30.0) -> None:
        """Finish pending work, agree with all ranks to stop, and join the thread."""
        if self._thread is None:
            return
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join(timeout)

    # -- the loop (engine thread) --------------------------------------------------
    def _loop(self) -> None:
        idle = self.cycle_time / 8
        try:
            while True:
                with self._cond:
                    if not self._pending and not self._stop:
                        self._cond.wait(idle)
                self._settle()
                with self._cond:
                    batch = list(self._pending)
                    stopping = self._stop
                ready, all_stop = self._negotiate(batch, stopping)
                self.cycles += 1
                if ready:
                    idle = self.cycle_time / 8
                    self._execute(ready)
                elif not batch:
                    idle = min(idle * 2, self.cycle_time)
                if all_stop and not batch and not ready:
                    return
        except BaseException as exc:  # noqa: BLE001 - fail every waiter, then the job
            self._failure = exc
            with self._cond:
                for req in self._pending:
                    req.handle.set_error(DDLError(f"ddl engine failed: {exc!r}"))
                self._pending.clear()
            raise

    def _settle(self) -> None:
        """While requests keep arriving (a backward pass), wait a little to batch them."""
        deadline = time.perf_counter() + self.cycle_time
        seen = -1
        while time.perf_counter() < deadline:
            with self._cond:
                n = len(self._pending)
                last = self._pending[-1].submitted if n else 0.0
            if n <= 1 or n == seen or time.perf_counter() - last > 100e-6:
                return
            seen = n
            time.sleep(50e-6)

    def _negotiate(self, batch: list[Request], stopping: bool) -> tuple[list[Request], bool]:
        comm = self.ctx.comm
        h = _combine([r.digest for r in batch])
        buf = np.array([h, -h, 1 if stopping else 0], dtype=np.int64)
        comm.allreduce_native(buf, ReduceOp.MIN)
        all_stop = bool(buf[2])
        if int(buf[0]) == -int(buf[1]):
            self._take(batch)
            return batch, all_stop
        self.slow_cycles += 1
        everyone: list[list[tuple[Any, ...]]] = comm.allgather_object([r.descriptor for r in batch])
        mine = {r.name: r for r in batch}
        tables = [{d[1]: d for d in lst} for lst in everyone]
        ready: list[Request] = []
        failed: list[tuple[Request, str]] = []
        now = time.monotonic()
        seen: set[str] = set()
        for lst in everyone:
            for d in lst:
                name = d[1]
                if name in seen:
                    continue
                seen.add(name)
                have = [r for r, t in enumerate(tables) if name in t]
                if len(have) < len(tables):
                    self._watch_stall(name, have, len(tables), now)
                    continue
                self._waiting_since.pop(name, None)
                descs = [t[name] for t in tables]
                req = mine[name]
                if any(x != descs[0] for x in descs):
                    failed.append((req, describe_mismatch(descs)))
                else:
                    ready.append(req)
        self._take(ready + [r for r, _ in failed])
        for req, message in failed:
            req.handle.set_error(MismatchError(f"tensor {req.name!r}: {message}"))
        return ready, all_stop

    def _take(self, done: list[Request]) -> None:
        if not done:
            return
        with self._cond:
            ids = {id(r) for r in done}
            self._pending = [r for r in self._pending if id(r) not in ids]
            self._names.difference_update(r.name for r in done)

    def _watch_stall(self, name: str, have: list[int], size: int, now: float) -> None:
        first = self._waiting_since.setdefault(name, now)
        waited = now - first
        missing = [r for r in range(size) if r not in have]
        text = (f"tensor {name!r} was submitted by rank(s) {have} but not by rank(s) {missing} "
                f"for {waited:.1f} s")
        if waited >= self.stall_timeout:
            sys.stderr.write(f"ddl: rank {self.ctx.topology.rank}: stall: {text}; aborting the job "
                             f"(DDL_STALL_TIMEOUT={self.stall_timeout:g})\n")
            sys.stderr.flush()
            self.ctx.comm.abort(1)
        elif waited >= self.stall_timeout / 2 and name not in self._warned:
            self._warned.add(name)
            sys.stderr.write(f"ddl: rank {self.ctx.topology.rank}: warning: {text}\n")
            sys.stderr.flush()

    # -- execution -----------------------------------------------------------------
    def _execute(self, ready: list[Request]) -> None:
        buckets: dict[tuple[Any, ...], list[list[Request]]] = {}
        order: list[list[Request] | Request] = []
        for req in ready:
            if req.kind != "allreduce":
                order.append(req)
                continue
            assert req.array is not None and req.compression is not None
            wire = req.compression.wire_dtype(req.array.dtype)
            key = (req.array.dtype, wire, req.op, req.algorithm)
            lanes = buckets.setdefault(key, [])
            nbytes = req.array.size * wire.itemsize
            if lanes and _elements(lanes[-1]) * wire.itemsize + nbytes <= self.fusion_threshold:
                lanes[-1].append(req)
            else:
                lanes.append([req])
                order.append(lanes[-1])
        for item in order:
            if isinstance(item, Request):
                self._run_single(item)
            else:
                self._run_bucket(item)

    def _run_single(self, req: Request) -> None:
        assert req.run is not None
        start = time.perf_counter()
        try:
            req.handle.set_result(req.run())
        except Exception as exc:  # noqa: BLE001 - delivered to the waiter
            req.handle.set_error(exc)
        if self.timeline is not None:
            self.timeline.span(req.name, req.kind, req.submitted, start, time.perf_counter(), {})

    def _run_bucket(self, bucket: list[Request]) -> None:
        first = bucket[0]
        assert first.array is not None and first.compression is not None
        dtype = first.array.dtype
        wire = first.compression.wire_dtype(dtype)
        total = _elements(bucket)
        p = self.ctx.topology.size
        start = time.perf_counter()
        prescale = first.op is ReduceOp.AVERAGE and wire != dtype
        op = ReduceOp.SUM if prescale else first.op
        single = len(bucket) == 1 and wire == dtype
        if single:
            src = first.array
            fused = src.reshape(-1) if first.inplace and src.flags.c_contiguous else np.array(src, order="C").reshape(-1)
        else:
            fused = np.empty(total, dtype=wire)
            offset = 0
            for r in bucket:
                n = r.array.size  # type: ignore[union-attr]
                part = fused[offset : offset + n]
                flat = r.array.reshape(-1)  # type: ignore[union-attr]
                if prescale:
                    np.divide(flat, p, out=part, casting="unsafe")
                else:
                    part[...] = flat
                offset += n
        algorithm = self.ctx.resolve_algorithm(first.algorithm, total, wire.itemsize)
        fused_at = time.perf_counter()
        phases: list[tuple[str, float, float]] = []
        on_phase = phases.append if self.timeline is not None else None
        self.ctx.allreduce_flat(fused, op, algorithm, on_phase=on_phase)
        offset = 0
        for r in bucket:
            arr = r.array
            assert arr is not None
            n = arr.size
            out = fused[offset : offset + n].reshape(arr.shape)
            offset += n
            if out.dtype != dtype:
                out = out.astype(dtype)
            if r.inplace:
                if not (single and arr.flags.c_contiguous):
                    arr[...] = out
                out = arr
            r.handle.set_result(out)
        if self.timeline is not None:
            end = time.perf_counter()
            info = {"bytes": int(total * wire.itemsize), "algorithm": algorithm, "tensors": len(bucket),
                    "dtype": str(wire)}
            for r in bucket:
                self.timeline.tensor(r.name, r.submitted, start, fused_at, phases, end, info)


def _combine(digests: list[int]) -> int:
    """One 62-bit hash of an ordered list of request digests."""
    raw = hashlib.blake2b(np.array(digests, dtype=np.int64).tobytes(), digest_size=8).digest()
    return int.from_bytes(raw, "little") & ((1 << 62) - 1)


def _elements(requests: list[Request]) -> int:
    return sum(0 if r.array is None else int(r.array.size) for r in requests)
