"""A thread-backed fake of :class:`ddl.wire.comm.Comm`: N ranks as N threads in one process.

Point-to-point messages go through per-pair queues (buffered, FIFO, like MPI's
non-overtaking rule); collectives meet at a shared rendezvous. Every wait has a
timeout, so a broken schedule fails a test instead of hanging it. The prepared
(persistent) allgather that the engine's exchange runs in production is here too, with
the same :class:`~ddl.wire.waits.PreparedCollective` guard, and its wait is left when
:attr:`FakeComm.interrupted` is set, as ``polite_wait`` leaves MPI's. Shared-memory groups
are arrays every member thread sees, kept in a registry of the world keyed by the
group's members, with a barrier of their own.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

import numpy as np

from ddl.base.ops import ReduceOp, ufunc
from ddl.wire.comm import as_bytes
from ddl.wire.shared_memory import SharedSlots
from ddl.wire.waits import PreparedCollective

T = TypeVar("T")
TIMEOUT_S = 30.0


class CollectiveMismatch(AssertionError):
    """Ranks met in different collectives: a broken call sequence (MPI would hang)."""


class FakeAbort(RuntimeError):
    """Raised by :meth:`FakeComm.abort` in place of ending the process."""


class _Barrier:
    """:class:`threading.Barrier` (broken by a timeout or :meth:`abort`) whose wait a
    party can leave before the others arrive, as a rank leaves an interrupted MPI wait."""

    def __init__(self, parties: int, timeout: float) -> None:
        self._cond = threading.Condition()
        self._parties = parties
        self._timeout = timeout
        self._arrived = 0
        self._generation = 0
        self._broken = False

    def wait(self, leave: Callable[[], BaseException | None] | None = None) -> None:
        """Wait for every party; raise what ``leave()`` returns (polled) once it is not None."""
        with self._cond:
            if self._broken:
                raise threading.BrokenBarrierError
            generation = self._generation
            self._arrived += 1
            if self._arrived == self._parties:
                self._arrived = 0
                self._generation += 1
                self._cond.notify_all()
                return
            deadline = time.monotonic() + self._timeout
            while self._generation == generation:
                if self._broken:
                    raise threading.BrokenBarrierError
                reason = leave() if leave is not None else None
                if reason is not None:
                    self._arrived -= 1  # this party never arrived, as far as the others know
                    raise reason
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._broken = True
                    self._cond.notify_all()
                    raise threading.BrokenBarrierError
                self._cond.wait(min(remaining, 0.05) if leave is not None else remaining)

    def abort(self) -> None:
        with self._cond:
            self._broken = True
            self._cond.notify_all()


class _World:
    def __init__(self, size: int, hostnames: Sequence[str], persistent: bool = True) -> None:
        self.size = size
        self.hostnames = list(hostnames)
        #: Whether the fake library offers prepared collectives (MPI-4's persistent ones).
        self.persistent = persistent
        self.queues = {(s, d): queue.Queue[np.ndarray]() for s in range(size) for d in range(size)}
        self.barrier = _Barrier(size, TIMEOUT_S)
        self.slots: list[Any] = [None] * size
        self.aborted = False  # like MPI_Abort: every rank's pending receive ends
        self.groups: dict[tuple[int, ...], _Group] = {}
        self.groups_lock = threading.Lock()

    def group(self, members: tuple[int, ...]) -> _Group:
        with self.groups_lock:
            if members not in self.groups:
                self.groups[members] = _Group(len(members))
            return self.groups[members]

    def abort_barriers(self) -> None:
        self.barrier.abort()
        with self.groups_lock:
            for g in self.groups.values():
                g.barrier.abort()


class _Group:
    """One group's shared slots (replaced as a whole when they grow) and its barrier."""

    def __init__(self, size: int) -> None:
        self.barrier = threading.Barrier(size, timeout=TIMEOUT_S)
        self.slots: list[np.ndarray] = []


class FakeComm:
    """One rank's view of a :class:`_World`."""

    def __init__(self, world: _World, rank: int) -> None:
        self._world = world
        self._rank = rank
        self._views: dict[tuple[int, ...], SharedSlots] = {}
        #: Bytes this rank handed to the network: point-to-point sends, and each
        #: collective's contribution (what an allreduce of that buffer must move at least).
        self.wire_bytes = 0
        #: Set from outside (``Engine.interrupt``): a prepared collective's wait raises it.
        self.interrupted: BaseException | None = None
        #: Whether the engine's records are sized as for shared memory (MPIComm's
        #: SharedRecords): the fake's prepared allgather stands in for it either way.
        self.shared_negotiation = False
        self._prepared = 0  # prepared collectives so far: the k-th of every rank meet
        #: Runs of this rank's prepared collectives that completed.
        self.prepared_runs = 0

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._world.size

    def sendrecv(
        self, send: np.ndarray | None, dest: int | None, recv: np.ndarray | None, source: int | None
    ) -> None:
        if dest is not None and send is not None:
            self.wire_bytes += send.nbytes
            self._world.queues[(self._rank, dest)].put(as_bytes(send).copy())
        if source is not None and recv is not None:
            data = self._receive(source)
            target = as_bytes(recv)
            if data.size != target.size:
                raise ValueError(f"rank {self._rank}: got {data.size} bytes from {source}, expected {target.size}")
            target[...] = data

    def isendrecv(
        self, send: np.ndarray | None, dest: int | None, recv: np.ndarray | None, source: int | None
    ) -> Callable[[], None]:
        # The send is queued at once (as MPI's eager and buffered sends); the receive waits for the call.
        self.sendrecv(send, dest, None, None)
        return lambda: self.sendrecv(None, None, recv, source)

    def _receive(self, source: int) -> np.ndarray:
        q, waited = self._world.queues[(source, self._rank)], 0.0
        while True:
            if self._world.aborted:
                raise FakeAbort(f"rank {self._rank}: the job was aborted while it waited for rank {source}")
            try:
                return q.get(timeout=0.05)
            except queue.Empty:
                waited += 0.05
                if waited >= TIMEOUT_S:
                    raise TimeoutError(f"rank {self._rank}: no message from rank {source}") from None

    def _exchange(self, obj: Any, kind: str, *, leavable: bool = False) -> list[Any]:
        """Every rank's ``obj``, once all have called the collective ``kind``.

        Ranks that meet in different collectives fail here, on every rank, naming them:
        under MPI they would hang or mix up data, which breaks the engine's contract.
        ``leavable``: until every rank has arrived, raise :attr:`interrupted` once set.
        """
        w = self._world
        w.barrier.wait((lambda: self.interrupted) if leavable else None)
        w.slots[self._rank] = (kind, obj)
        w.barrier.wait()
        out = list(w.slots)
        w.barrier.wait()
        kinds = [k for k, _ in out]
        if any(k != kind for k in kinds):
            raise CollectiveMismatch(f"rank {self._rank}: ranks met in different collectives: "
                                     + ", ".join(f"rank {r} {k}" for r, k in enumerate(kinds)))
        return [o for _, o in out]

    def allreduce_native(self, buf: np.ndarray, op: ReduceOp, *, negotiation: bool = False) -> None:
        self.wire_bytes += buf.nbytes
        parts = self._exchange(buf.copy(), f"allreduce {op.name}")
        acc = parts[0].copy()
        for part in parts[1:]:
            ufunc(op)(acc, part, out=acc)
        buf[...] = acc

    def bcast_buffer(self, buf: np.ndarray, root: int) -> None:
        self.wire_bytes += buf.nbytes if self._rank == root else 0
        parts = self._exchange(as_bytes(buf).copy() if self._rank == root else None, "bcast")
        as_bytes(buf)[...] = parts[root]

    def allgatherv_buffer(self, send: np.ndarray, recv: np.ndarray, counts: list[int]) -> None:
        self.wire_bytes += send.nbytes
        parts = self._exchange(as_bytes(send).copy(), "allgatherv")
        out = as_bytes(recv)
        offset = 0
        for part, n in zip(parts, counts, strict=True):
            out[offset : offset + n] = part[:n]
            offset += n

    def alltoallv_buffer(self, send: np.ndarray, send_counts: list[int], recv: np.ndarray,
                         recv_counts: list[int]) -> None:
        self.wire_bytes += send.nbytes
        src = as_bytes(send)
        starts = np.concatenate([[0], np.cumsum(send_counts)]).astype(int)
        pieces = [src[starts[r] : starts[r + 1]].copy() for r in range(len(send_counts))]
        parts = self._exchange(pieces, "alltoallv")
        out = as_bytes(recv)
        offset = 0
        for r, n in enumerate(recv_counts):
            out[offset : offset + n] = parts[r][self.rank][:n]
            offset += n

    def allgather_buffer(self, send: np.ndarray, recv: np.ndarray) -> None:
        self.wire_bytes += send.nbytes
        parts = self._exchange(as_bytes(send).copy(), "allgather")
        as_bytes(recv)[...] = np.concatenate(parts)

    def persistent_allgather(self, send: np.ndarray, recv: np.ndarray) -> Callable[[], None] | None:
        if not self._world.persistent:
            return None
        kind = f"prepared allgather #{self._prepared}"
        self._prepared += 1

        def run() -> None:
            self.wire_bytes += send.nbytes
            parts = self._exchange(as_bytes(send).copy(), kind, leavable=True)
            as_bytes(recv)[...] = np.concatenate(parts)
            self.prepared_runs += 1

        return PreparedCollective(lambda: None, run)

    def shared_slots(self, members: tuple[int, ...], nbytes: int) -> SharedSlots:
        view = self._views.get(members)
        if view is not None and view.capacity >= nbytes:
            return view
        index = members.index(self._rank)
        group = self._world.group(members)

        def barrier() -> None:
            start = time.monotonic()
            try:
                group.barrier.wait()
            except threading.BrokenBarrierError:
                if self._world.aborted:
                    raise FakeAbort(f"rank {self._rank}: the job was aborted in group {members}'s barrier") from None
                if time.monotonic() - start >= TIMEOUT_S:
                    raise TimeoutError(f"rank {self._rank}: a member of group {members} did not reach its "
                                       f"barrier within {TIMEOUT_S:.0f} s") from None
                raise  # another rank failed and broke it: that rank's error is the one to report

        barrier()  # every member has finished with the old slots
        if index == 0:
            group.slots = [np.zeros(nbytes, np.uint8) for _ in members]
        barrier()
        view = self._views[members] = SharedSlots(index, list(group.slots), barrier)
        return view

    def bcast_object(self, obj: Any, root: int) -> Any:
        return self._exchange(obj, "bcast_object")[root]

    def allgather_object(self, obj: Any) -> list[Any]:
        return self._exchange(obj, "allgather_object")

    def barrier(self) -> None:
        self._exchange(None, "barrier")

    def abort(self, code: int = 1) -> NoReturn:
        self._world.aborted = True
        self._world.abort_barriers()
        raise FakeAbort(f"rank {self._rank} aborted the job with code {code}")

    def hostname(self) -> str:
        return self._world.hostnames[self._rank]

    def free(self) -> None:
        return None


def run_ranks(
    size: int, fn: Callable[[FakeComm], T], *, hostnames: Sequence[str] | None = None,
    persistent: bool = True,
) -> list[T]:
    """Run ``fn(comm)`` on ``size`` fake ranks in threads; return the results by rank.

    An exception on any rank is re-raised here (the first one, by rank), after the
    other ranks are released from any collective they wait in. ``persistent``: whether
    the fake library offers prepared collectives (as MPI-4 libraries do; without them
    the engine's exchange runs a plain allgather each cycle).

    Example:
        >>> run_ranks(2, lambda c: c.rank)
        [0, 1]
    """
    world = _World(size, hostnames or ["fakehost"] * size, persistent)
    results: list[Any] = [None] * size
    errors: list[BaseException | None] = [None] * size

    def body(rank: int) -> None:
        try:
            results[rank] = fn(FakeComm(world, rank))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            errors[rank] = exc
            world.abort_barriers()

    # Each rank plays one process's main thread: unnamed collectives are named per
    # thread name (ddl.engine.naming), alike on every rank only if the threads' names are.
    threads = [threading.Thread(target=body, args=(r,), daemon=True, name="MainThread") for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S * 2)
    if any(t.is_alive() for t in threads):
        raise TimeoutError(f"fake ranks still running after {TIMEOUT_S * 2:.0f} s")
    primary = [e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)]
    first = primary[0] if primary else next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    return results
