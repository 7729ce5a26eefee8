"""Shared memory of one host's dim-0 group: each rank's view, and the MPI window behind it.

A group's memory is one byte slot per member, all the same size, that every member
can read and write. :class:`SharedSlots` is the view the executor uses; the
communicator makes it (``Comm.shared_slots``): over MPI an ``Allocate_shared`` window
on the group's communicator, in the fake a registry of arrays shared by its threads.

The window's barrier is a flag per member in the window itself, not ``MPI_Ibarrier``:
each member fences, writes its barrier count into its own flag, and waits until every
flag has reached it. A member arrives with one store and leaves after one pass over the
flags, where MPI's barrier takes log2(members) rounds of messages that each need their
ranks scheduled: 2.0-2.1 against 5.5-5.6 us at 2 ranks, 11-14 against 39-49 us at 4 and
0.78-0.81 against 2.5-3.0 ms at 32 (on 2 cores, yielding waits both).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np


@dataclasses.dataclass(eq=False)
class SharedSlots:
    """This rank's view of its group's shared memory.

    Attributes:
        index: this rank's position among the members.
        slots: one uint8 array per member (by position), of ``capacity`` bytes each.
        barrier: returns once every member has called it; orders the writes before it
            before the reads after it on every member.
        turn: how many pieces this group has exchanged through these slots; the
            executor alternates slot halves by it (the same count on every member).
    """

    index: int
    slots: list[np.ndarray]
    barrier: Callable[[], None]
    turn: int = 0

    @property
    def capacity(self) -> int:
        return int(self.slots[0].size) if self.slots else 0


#: Bytes after each member's slot that hold its barrier flag (a cache line of its own).
FLAG_BYTES = 64


class Arrivals:
    """The barrier's wait, as a request whose ``Test`` is true once every member's flag
    has reached :attr:`turn` (the waits in :mod:`ddl.wire.waits` poll requests). It resumes
    at the first member it last found behind: the others' flags only grow."""

    __slots__ = ("flags", "turn", "_next")

    def __init__(self, flags: list[memoryview]) -> None:
        self.flags = flags
        self.turn = 0
        self._next = 0

    def start(self, turn: int) -> None:
        self.turn, self._next = turn, 0

    def Test(self) -> bool:  # noqa: N802 (an MPI request's method name)
        flags, turn, i = self.flags, self.turn, self._next
        while i < len(flags):
            if flags[i][0] < turn:
                self._next = i
                return False
            i += 1
        self._next = i
        return True


class MPISharedWindow:
    """An ``MPI.Win.Allocate_shared`` window of one group communicator, grown on demand."""

    def __init__(self, group_comm: Any, wait: Callable[[Any], None]) -> None:
        """``wait``: completes a request (the barrier's :class:`Arrivals`) by polling its ``Test``."""
        self.comm = group_comm
        self._wait = wait
        self._win: Any = None
        self._turn = 0
        self._mine = memoryview(bytearray(8)).cast("q")  # this member's flag (a placeholder until ensure)
        self._arrivals = Arrivals([])
        self.view = SharedSlots(group_comm.Get_rank(), [], self.barrier)

    def barrier(self) -> None:
        # MPI's unified model for shared windows: a Sync (a memory fence) orders this
        # member's stores to the slots before its flag's, and another the others' flags
        # (seen reached) before this member's loads from their slots.
        win, arrivals = self._win, self._arrivals
        self._turn = turn = self._turn + 1
        win.Sync()
        self._mine[0] = turn
        arrivals.start(turn)
        if not arrivals.Test():
            self._wait(arrivals)
        win.Sync()

    def ensure(self, nbytes: int) -> SharedSlots:
        """The view, with slots of at least ``nbytes`` (a collective over the group when it grows).

        Every member asks for the same size at the same step, so all grow together.
        The new window is disjoint from the old, and no member returns from the
        allocation before every member has entered it, i.e. finished with the old one.
        Its flags start at zero, as does the barrier's count, on every member.
        """
        if self.view.capacity >= nbytes:
            return self.view
        win, slots, flags = _allocate(self.comm, nbytes)
        self._release()
        self._win = win
        self._turn = 0
        self._mine = flags[self.comm.Get_rank()]
        self._mine[0] = 0
        self._arrivals = Arrivals(flags)
        self.view = SharedSlots(self.comm.Get_rank(), slots, self.barrier)
        win.Sync()
        self.comm.Barrier()
        return self.view

    def _release(self) -> None:
        if self._win is not None:
            _free(self._win, self.view.slots, self._arrivals)
            self._mine = memoryview(bytearray(8)).cast("q")
            self._win = None

    def free(self) -> None:
        """Free the window and the group communicator (collective over the group)."""
        self._release()
        self.comm.Free()


class SharedRecords:
    """An allgather of one fixed-size record per rank through a shared window, for a
    world whose ranks all share one memory node (the engine's negotiation exchange).

    Each rank owns two record slots and a flag in its segment. A run writes this rank's
    record into the slot of the run's parity, fences, and sets its flag to the run's count;
    once every flag has reached the count it fences again and copies every rank's record
    of that parity into ``recv``. Two slots suffice: a rank rewrites a parity's slot only
    two runs later, after every rank set its flag for the run in between, which each sets
    only after it copied out the earlier one. Like MPI's allgather, but a rank takes part
    with one store and leaves after one pass over the flags: no rounds that each need
    their ranks scheduled (a 4 KiB record at 4 ranks on 2 cores: 11 against 42-48 us for
    MPI's persistent allgather; at 32 ranks, 128-byte records, 0.58-0.65 against 1.9 ms).
    """

    def __init__(self, comm: Any, send: np.ndarray, recv: np.ndarray) -> None:
        """Collective over ``comm``: every rank allocates its part of the window."""
        n, me = comm.Get_size(), comm.Get_rank()
        rb = send.nbytes
        win, both, flags = _allocate(comm, 2 * rb)
        self._win = win
        self._slots: list[tuple[np.ndarray, np.ndarray]] = [(b[:rb], b[rb:]) for b in both]
        self._send = send.reshape(-1).view(np.uint8)
        self._rows = [recv.reshape(-1).view(np.uint8)[m * rb : (m + 1) * rb] for m in range(n)]
        self._mine = flags[me]
        self._mine[0] = 0
        self._own = self._slots[me]
        self.arrivals = Arrivals(flags)
        self._turn = 0
        win.Sync()
        comm.Barrier()

    def start(self) -> None:
        """Publish this rank's record for the next run."""
        self._turn = turn = self._turn + 1
        self._own[turn & 1][...] = self._send
        self._win.Sync()
        self._mine[0] = turn
        self.arrivals.start(turn)

    def test(self) -> bool:
        """Whether every rank has published this run's record (then ``recv`` holds them all)."""
        if not self.arrivals.Test():
            return False
        self.finish()
        return True

    def finish(self) -> None:
        """Copy every rank's record of this run into ``recv`` (once :attr:`arrivals` passed)."""
        self._win.Sync()
        half = self._turn & 1
        for row, slots in zip(self._rows, self._slots, strict=True):
            row[...] = slots[half]

    def free(self) -> None:
        """Free the window (collective: every rank, after its last run)."""
        _free(self._win, self._slots, self.arrivals)
        self._mine = memoryview(bytearray(8)).cast("q")


def _allocate(comm: Any, nbytes: int) -> tuple[Any, list[np.ndarray], list[memoryview]]:
    """A shared window over ``comm`` (collective): every member's ``nbytes`` of data, and
    its flag in a cache line of its own after them, as arrays and int64 views."""
    from mpi4py import MPI

    at = -(-nbytes // FLAG_BYTES) * FLAG_BYTES  # the flag's offset in each member's segment
    win: Any = MPI.Win.Allocate_shared(at + FLAG_BYTES, 1, comm=comm)
    win.Lock_all(MPI.MODE_NOCHECK)
    data, flags = [], []
    for member in range(comm.Get_size()):
        buf, _ = win.Shared_query(member)
        data.append(np.frombuffer(buf, dtype=np.uint8, count=nbytes))
        flags.append(memoryview(buf)[at : at + 8].cast("q"))
    return win, data, flags


def _free(win: Any, views: list[Any], arrivals: Arrivals) -> None:
    """Free a shared window after dropping every view into it: no array or flag may
    outlive the memory it points into (collective over the window's group)."""
    views.clear()
    for flag in arrivals.flags:
        flag.release()
    arrivals.flags.clear()
    win.Unlock_all()
    win.Free()
