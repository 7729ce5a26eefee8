"""Shared memory of one host's dim-0 group: each rank's view, and the MPI window behind it.

A group's memory is one byte slot per member, all the same size, that every member
can read and write. :class:`SharedSlots` is the view the executor uses; the
communicator makes it (``Comm.shared_slots``): over MPI an ``Allocate_shared`` window
on the group's communicator, in the fake a registry of arrays shared by its threads.
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


class MPISharedWindow:
    """An ``MPI.Win.Allocate_shared`` window of one group communicator, grown on demand."""

    def __init__(self, group_comm: Any, wait: Callable[[Any], None]) -> None:
        """``wait``: completes the barrier's ``Ibarrier`` request."""
        from mpi4py import MPI

        self._MPI = MPI
        self.comm = group_comm
        self._wait = wait
        self._win: Any = None
        self.view = SharedSlots(group_comm.Get_rank(), [], self.barrier)

    def barrier(self) -> None:
        # MPI's unified model for shared windows: Sync, then Barrier, then Sync makes
        # every member's stores before the barrier visible to every load after it.
        win = self._win
        win.Sync()
        self._wait(self.comm.Ibarrier())
        win.Sync()

    def ensure(self, nbytes: int) -> SharedSlots:
        """The view, with slots of at least ``nbytes`` (a collective over the group when it grows).

        Every member asks for the same size at the same step, so all grow together.
        The new window is disjoint from the old, and no member returns from the
        allocation before every member has entered it, i.e. finished with the old one.
        """
        if self.view.capacity >= nbytes:
            return self.view
        MPI = self._MPI
        win = MPI.Win.Allocate_shared(nbytes, 1, comm=self.comm)
        win.Lock_all(MPI.MODE_NOCHECK)
        slots = []
        for member in range(self.comm.Get_size()):
            buf, _ = win.Shared_query(member)
            slots.append(np.frombuffer(buf, dtype=np.uint8, count=nbytes))
        self._release()
        self._win = win
        self.view = SharedSlots(self.comm.Get_rank(), slots, self.barrier)
        self.comm.Barrier()
        return self.view

    def _release(self) -> None:
        if self._win is not None:
            self.view.slots.clear()  # no array may outlive the memory it points into
            self._win.Unlock_all()
            self._win.Free()
            self._win = None

    def free(self) -> None:
        """Free the window and the group communicator (collective over the group)."""
        self._release()
        self.comm.Free()
