"""The small communicator interface the core needs, and its mpi4py implementation.

Everything above this module speaks :class:`Comm`; the thread-backed fake in
:mod:`ddl.testing.fake_comm` implements the same interface so every algorithm runs in
plain pytest. Point-to-point traffic moves raw bytes, so any dtype travels.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NoReturn, Protocol

import numpy as np

from ddl.base import kernels
from ddl.base.config import Announced
from ddl.base.errors import WorldMismatchError
from ddl.base.ops import ReduceOp
from ddl.wire.shared_memory import MPISharedWindow, SharedRecords, SharedSlots
from ddl.wire.splits import split_shared_group
from ddl.wire.waits import PreparedCollective, polite_wait, yielding_wait, yielding_waitall

#: dtypes the MPI library reduces with its predefined datatypes and ops. The 2-byte floats
#: (float16, bfloat16) have no portable MPI type: :class:`MPIComm` reduces them with a
#: user-defined op on a 2-byte datatype, so they still travel as 2 bytes an element.
NATIVE_REDUCE_DTYPES = tuple(np.dtype(t) for t in (np.float32, np.float64, np.int32, np.int64, np.uint8, np.int8,
                                                    np.int16, np.uint16))


class Comm(Protocol):
    """What the core needs from a communicator."""

    #: Set from outside (an elastic world that lost a peer, ``Engine.interrupt``): a wait
    #: that can be left (a prepared exchange's) raises it instead of waiting on.
    interrupted: BaseException | None
    #: Whether :meth:`persistent_allgather` goes through shared memory (every rank on one
    #: memory node): the engine's records may then carry 4 KiB at any gathered size.
    shared_negotiation: bool

    @property
    def rank(self) -> int: ...

    @property
    def size(self) -> int: ...

    def sendrecv(
        self, send: np.ndarray | None, dest: int | None, recv: np.ndarray | None, source: int | None
    ) -> None:
        """Send ``send`` to ``dest`` while receiving into ``recv`` from ``source`` (None: absent)."""

    def isendrecv(
        self, send: np.ndarray | None, dest: int | None, recv: np.ndarray | None, source: int | None
    ) -> Callable[[], None]:
        """:meth:`sendrecv` started, not waited for: calling the result waits. The buffers
        must stay untouched until then; one such exchange per pair of ranks at a time."""

    def allreduce_native(self, buf: np.ndarray, op: ReduceOp, *, negotiation: bool = False) -> None:
        """The library's own allreduce, in place: a dtype in :data:`NATIVE_REDUCE_DTYPES`,
        or a 2-byte float, which travels as itself (each addition done in float32 by numpy).
        ``negotiation``: the engine's compact exchange, whose first rank in may wait long
        for the others' compute (a wait that may sleep)."""

    def bcast_buffer(self, buf: np.ndarray, root: int) -> None:
        """Broadcast a contiguous array's bytes from ``root`` in place."""

    def allgatherv_buffer(self, send: np.ndarray, recv: np.ndarray, counts: list[int]) -> None:
        """Gather every rank's bytes (``counts[r]`` from rank r) into ``recv`` in rank order."""

    def allgather_buffer(self, send: np.ndarray, recv: np.ndarray) -> None:
        """Gather every rank's equally sized contiguous ``send`` into ``recv`` in rank order."""

    def persistent_allgather(self, send: np.ndarray, recv: np.ndarray) -> Callable[[], None] | None:
        """:meth:`allgather_buffer` of these very buffers, prepared once: calling the result
        runs it (a :class:`PreparedCollective`). None where the communicator has none (then
        every rank gets None). Collective: every rank prepares its own in the same order,
        and runs them in the same order as its other collectives.
        """

    def alltoallv_buffer(self, send: np.ndarray, send_counts: list[int], recv: np.ndarray,
                         recv_counts: list[int]) -> None:
        """Send ``send_counts[r]`` bytes of ``send`` (in rank order) to rank r and receive
        ``recv_counts[r]`` bytes from rank r into ``recv``, in rank order."""

    def shared_slots(self, members: tuple[int, ...], nbytes: int) -> SharedSlots:
        """This rank's view of the shared memory of ``members`` (its host's dim-0 ring).

        Every member calls it at the same step with the same ``nbytes``; the slots are
        made, or grown to at least ``nbytes`` each, collectively over the group (the
        first call may be collective over the world: all ranks reach it together).
        """

    def bcast_object(self, obj: Any, root: int) -> Any: ...

    def allgather_object(self, obj: Any) -> list[Any]: ...

    def barrier(self) -> None: ...

    def abort(self, code: int = 1) -> NoReturn: ...

    def hostname(self) -> str: ...

    def free(self) -> None:
        """Release what this communicator holds (a collective over its ranks)."""


def as_bytes(a: np.ndarray) -> np.ndarray:
    """A uint8 view of a contiguous array (no copy)."""
    return a.reshape(-1).view(np.uint8)


class MPIComm:
    """:class:`Comm` over an mpi4py communicator (a private duplicate of the world's)."""

    def __init__(self, comm: Any) -> None:
        from mpi4py import MPI

        self._MPI = MPI
        self._comm = comm
        #: Seconds a wait for the engine's exchange polls before it starts yielding the core
        #: (:func:`polite_wait`); set at init, 0 where ranks outnumber the cores.
        self.busy_wait = 20e-6
        #: Set from outside (an elastic world that lost a peer): polite waits raise it.
        self.interrupted: BaseException | None = None
        #: The ranks on other hosts (set at init): exchanges with them wait yielding the
        #: core between polls (:func:`yielding_waitall`), not in MPI's busy wait.
        self.remote: frozenset[int] = frozenset()
        #: Seconds a wait for the other ranks (the negotiation, a shared-memory barrier, a
        #: message from another host) may last before it raises StalledWaitError: set at
        #: init to the stall timeout outside elastic worlds (whose heartbeats find a frozen
        #: rank first); MPI's own blocking calls are not bounded.
        self.stall_limit = math.inf
        #: Whether the library's own allreduce, broadcast, allgatherv and alltoallv are
        #: started nonblocking and polled (bounded by ``stall_limit``; set at init where each
        #: rank has a core: at 2 ranks they cost what the blocking calls do, the allreduce
        #: 1.6 against 1.3 us at 8 B and equal from 256 KiB, the broadcast equal from 64 KiB
        #: to 64 MiB). At 32 ranks on 2 cores MPI's own yielding wait was faster (1.13-1.26x
        #: for the allreduce): blocking there.
        self.poll_native = False
        #: Whether the negotiation's record gather waits in MPI's own (yielding) wait instead
        #: of :func:`polite_wait` (set at init from 17 ranks where ranks outnumber cores,
        #: outside elastic worlds: a gather of 32 ranks on 2 cores takes over a millisecond,
        #: past polite_wait's yielding phase, and a sleeping rank holds up every later round
        #: of it: a 4 KiB call took 1.3-1.4x as long so).
        self.negotiation_blocks = False
        #: Whether :meth:`persistent_allgather` (the negotiation's records) goes through a
        #: shared window (:class:`SharedRecords`): set at init where every rank shares one
        #: memory node, outside elastic worlds (whose ranks come and go between windows).
        self.shared_negotiation = False
        self._shared_records: list[tuple[PreparedCollective, SharedRecords]] = []
        self._null = MPI.PROC_NULL
        self._empty = np.empty(0, np.uint8)
        self._ops = {
            ReduceOp.SUM: MPI.SUM, ReduceOp.AVERAGE: MPI.SUM,
            ReduceOp.MIN: MPI.MIN, ReduceOp.MAX: MPI.MAX, ReduceOp.PRODUCT: MPI.PROD,
        }
        self._windows: dict[tuple[int, ...], MPISharedWindow] = {}
        self._user_ops: dict[tuple[np.dtype, ReduceOp], tuple[Any, Any]] = {}
        # Prepared collectives and their MPI requests, freed before the communicator.
        self._persistent: list[tuple[PreparedCollective, Any]] = []

    @property
    def rank(self) -> int:
        return int(self._comm.Get_rank())

    @property
    def size(self) -> int:
        return int(self._comm.Get_size())

    @property
    def mpi_comm(self) -> Any:
        return self._comm

    def sendrecv(
        self, send: np.ndarray | None, dest: int | None, recv: np.ndarray | None, source: int | None
    ) -> None:
        if dest in self.remote or source in self.remote:  # waited yielding the core (isendrecv)
            self.isendrecv(send, dest, recv, source)()
            return
        # Contiguous uint8 arrays go as they are: mpi4py maps them to MPI_BYTE-sized items.
        empty, null = self._empty, self._null
        if send is None or dest is None:
            sbuf, dest = empty, null
        else:
            sbuf = send if send.dtype == np.uint8 else as_bytes(send)
        if recv is None or source is None:
            rbuf, source = empty, null
        else:
            rbuf = recv if recv.dtype == np.uint8 else as_bytes(recv)
        self._comm.Sendrecv(sbuf, dest, 0, rbuf, source, 0)

    def isendrecv(
        self, send: np.ndarray | None, dest: int | None, recv: np.ndarray | None, source: int | None
    ) -> Callable[[], None]:
        requests = []
        if recv is not None and source is not None:
            requests.append(self._comm.Irecv(recv if recv.dtype == np.uint8 else as_bytes(recv), source, 0))
        if send is not None and dest is not None:
            requests.append(self._comm.Isend(send if send.dtype == np.uint8 else as_bytes(send), dest, 0))
        if dest in self.remote or source in self.remote:
            peers = sorted({q for q in (dest, source) if q is not None})
            what = f"a message of rank {' or '.join(map(str, peers))}"

            def wait() -> None:
                yielding_waitall(requests, self, what)
        else:
            def wait() -> None:
                self._MPI.Request.Waitall(requests)
        return wait

    def allreduce_native(self, buf: np.ndarray, op: ReduceOp, *, negotiation: bool = False) -> None:
        target: Any
        if buf.dtype in NATIVE_REDUCE_DTYPES:
            target, mpi_op = buf, self._ops[op]
        else:
            datatype, mpi_op = self._half_op(buf.dtype, op)
            target = [as_bytes(buf), buf.size, datatype]
        if not self.poll_native or target is not buf:
            # (Half types stay blocking: MPICH's nonblocking allreduce with a user-defined op
            # sent twice the bytes across emulated hosts, 24 MiB for 3 x 8 MiB of float16.)
            self._comm.Allreduce(self._MPI.IN_PLACE, target, op=mpi_op)
        elif negotiation:
            polite_wait(self._comm.Iallreduce(self._MPI.IN_PLACE, target, op=mpi_op), owner=self, busy=self.busy_wait)
        else:
            self._collective(self._comm.Allreduce, self._comm.Iallreduce, "the other ranks in MPI's allreduce",
                             self._MPI.IN_PLACE, target, op=mpi_op)

    def _collective(self, blocking: Callable[..., Any], nonblocking: Callable[..., Any], what: str,
                    *args: Any, **kwargs: Any) -> None:
        """One of MPI's collectives: started nonblocking and polled, bounded by
        ``stall_limit``, where :attr:`poll_native`; else its blocking call."""
        if self.poll_native:
            yielding_wait(nonblocking(*args, **kwargs), self.busy_wait, self, what)
        else:
            blocking(*args, **kwargs)

    def _half_op(self, dtype: np.dtype, op: ReduceOp) -> tuple[Any, Any]:
        """A 2-byte MPI datatype and a user-defined op that combines ``dtype`` values with numpy."""
        key = (dtype, op)
        found = self._user_ops.get(key)
        if found is None:
            if dtype.itemsize != 2:
                raise TypeError(f"MPI cannot reduce {dtype} here; reduce it in a type MPI knows")
            def reduce(inbuf: Any, outbuf: Any, datatype: Any) -> None:
                a = np.frombuffer(inbuf, dtype=dtype)
                b = np.frombuffer(outbuf, dtype=dtype)
                kernels.combiner(op, dtype)(b, a, out=b)  # a half sum by the kernels installed now

            found = self._user_ops[key] = (self._MPI.UINT16_T, self._MPI.Op.Create(reduce, commute=True))
        return found

    def bcast_buffer(self, buf: np.ndarray, root: int) -> None:
        self._collective(self._comm.Bcast, self._comm.Ibcast, f"rank {root}'s broadcast",
                         [as_bytes(buf), self._MPI.BYTE], root=root)

    def allgatherv_buffer(self, send: np.ndarray, recv: np.ndarray, counts: list[int]) -> None:
        displs = np.concatenate([[0], np.cumsum(counts[:-1])]).astype(int).tolist()
        self._collective(self._comm.Allgatherv, self._comm.Iallgatherv, "the other ranks' allgather",
                         [as_bytes(send), self._MPI.BYTE], [as_bytes(recv), (counts, displs), self._MPI.BYTE])

    def allgather_buffer(self, send: np.ndarray, recv: np.ndarray) -> None:
        # The engine's negotiation: often the first rank in waits for the others to finish
        # computing, so the wait yields, then sleeps (polite_wait), where MPI's would busy-poll.
        if self.negotiation_blocks:
            self._comm.Allgather(send, recv)
        else:
            polite_wait(self._comm.Iallgather(send, recv), owner=self, busy=self.busy_wait)

    def persistent_allgather(self, send: np.ndarray, recv: np.ndarray) -> Callable[[], None] | None:
        """:meth:`allgather_buffer` of these very buffers, prepared once: calling the
        result runs it. MPI-4's persistent collectives skip the per-call set-up of a
        nonblocking one (at 2 ranks a 4 KiB record took 1.3 us against 2.5 us). None
        where the library has none. Collective: every rank prepares its own in the same
        order, and every rank either gets one (the same library everywhere) or not.
        """
        if self.shared_negotiation:
            return self._shared_allgather(send, recv)
        try:
            request = self._comm.Allgather_init(send, recv)
        except (NotImplementedError, AttributeError, self._MPI.Exception):
            return None

        def wait() -> None:
            if self.negotiation_blocks:
                request.Wait()
            else:
                polite_wait(request, owner=self, busy=self.busy_wait)

        prepared = PreparedCollective(request.Start, wait, request.Test)
        self._persistent.append((prepared, request))
        return prepared

    def _shared_allgather(self, send: np.ndarray, recv: np.ndarray) -> PreparedCollective:
        # The records through the node's shared memory (SharedRecords): its waits poll
        # flags, which the polite wait does as it polls a request.
        records = SharedRecords(self._comm, send, recv)

        def wait() -> None:
            polite_wait(records.arrivals, owner=self, busy=self.busy_wait)
            records.finish()

        prepared = PreparedCollective(records.start, wait, records.test)
        self._shared_records.append((prepared, records))
        return prepared

    def alltoallv_buffer(self, send: np.ndarray, send_counts: list[int], recv: np.ndarray,
                         recv_counts: list[int]) -> None:
        sd = np.concatenate([[0], np.cumsum(send_counts[:-1])]).astype(int).tolist()
        rd = np.concatenate([[0], np.cumsum(recv_counts[:-1])]).astype(int).tolist()
        self._collective(self._comm.Alltoallv, self._comm.Ialltoallv, "the other ranks' alltoall",
                         [as_bytes(send), (send_counts, sd), self._MPI.BYTE],
                         [as_bytes(recv), (recv_counts, rd), self._MPI.BYTE])

    def shared_slots(self, members: tuple[int, ...], nbytes: int) -> SharedSlots:
        window = self._windows.get(members)
        if window is None:
            # Each rank has one dim-0 group, and every rank runs its first group step
            # in the same cycle (at init, when calibration measures it): a world collective.
            window = self._windows[members] = MPISharedWindow(split_shared_group(self._comm, members, self.rank),
                                                              self._wait_in_host)
        return window.ensure(nbytes)

    def _wait_in_host(self, request: Any) -> None:
        yielding_wait(request, self.busy_wait, self, "the ranks of this host in a shared-memory step")

    def bcast_object(self, obj: Any, root: int) -> Any:
        return self._comm.bcast(obj, root=root)

    def allgather_object(self, obj: Any) -> list[Any]:
        return list(self._comm.allgather(obj))

    def barrier(self) -> None:
        self._comm.Barrier()

    def abort(self, code: int = 1) -> NoReturn:
        import os
        import sys
        import time

        from ddl.base import notes

        sys.stdout.flush()
        sys.stderr.flush()
        if notes.active():
            # Under ddlrun the rank's keeper reports this exit and ddlrun ends the others
            # gently; MPI_Abort would have every keeper killed before it cleans up.
            notes.send(notes.ABORT, code=code)
            os._exit(code)
        # The launcher forwards output asynchronously; give it a moment before the kill.
        time.sleep(0.3)
        self._MPI.COMM_WORLD.Abort(code)
        raise SystemExit(code)  # not reached: Abort does not return

    def hostname(self) -> str:
        return str(self._MPI.Get_processor_name())

    def free(self) -> None:
        for window in self._windows.values():  # shared windows and group comms go first
            window.free()
        self._windows.clear()
        for prepared, request in self._persistent:
            if not prepared.active:  # freeing an active persistent collective is erroneous; the world is over
                request.Free()
        self._persistent.clear()
        for prepared, records in self._shared_records:
            if not prepared.active:  # (an interrupted run: the others may never free theirs)
                records.free()
        self._shared_records.clear()
        for _, user_op in self._user_ops.values():
            user_op.Free()
        self._user_ops.clear()
        if self._comm != self._MPI.COMM_WORLD and self._comm != self._MPI.COMM_SELF:
            self._comm.Free()


class SelfComm:
    """A world of one process, for ``ddl.init()`` without ``mpiexec`` or without MPI.

    The collectives never reach it with a peer (size 1 short-cuts them), so the data
    movement methods only check that they are not asked for another rank.
    """

    rank = 0
    size = 1

    def __init__(self, load_error: str | None = None) -> None:
        self.interrupted: BaseException | None = None
        self.shared_negotiation = False
        #: Why there is no MPI world (mpi4py could not load an MPI library), or None when
        #: MPI itself said the world is this one process.
        self.load_error = load_error

    def sendrecv(
        self, send: np.ndarray | None, dest: int | None, recv: np.ndarray | None, source: int | None
    ) -> None:
        if dest not in (None, 0) or source not in (None, 0):
            raise ValueError("a world of one process has no other rank")
        if recv is not None and send is not None and source == 0:
            as_bytes(recv)[...] = as_bytes(send)

    def isendrecv(
        self, send: np.ndarray | None, dest: int | None, recv: np.ndarray | None, source: int | None
    ) -> Callable[[], None]:
        self.sendrecv(send, dest, recv, source)
        return lambda: None

    def allreduce_native(self, buf: np.ndarray, op: ReduceOp, *, negotiation: bool = False) -> None:
        return None

    def bcast_buffer(self, buf: np.ndarray, root: int) -> None:
        return None

    def allgatherv_buffer(self, send: np.ndarray, recv: np.ndarray, counts: list[int]) -> None:
        as_bytes(recv)[...] = as_bytes(send)

    def allgather_buffer(self, send: np.ndarray, recv: np.ndarray) -> None:
        as_bytes(recv)[...] = as_bytes(send)

    def persistent_allgather(self, send: np.ndarray, recv: np.ndarray) -> Callable[[], None] | None:
        return None  # nothing to prepare: a world of one gathers by copying

    def alltoallv_buffer(self, send: np.ndarray, send_counts: list[int], recv: np.ndarray,
                         recv_counts: list[int]) -> None:
        as_bytes(recv)[...] = as_bytes(send)

    def shared_slots(self, members: tuple[int, ...], nbytes: int) -> SharedSlots:
        if members != (0,):
            raise ValueError(f"a world of one process has no group {members}")
        return SharedSlots(0, [np.zeros(nbytes, np.uint8)], lambda: None)

    def bcast_object(self, obj: Any, root: int) -> Any:
        return obj

    def allgather_object(self, obj: Any) -> list[Any]:
        return [obj]

    def barrier(self) -> None:
        return None

    def abort(self, code: int = 1) -> NoReturn:
        raise SystemExit(code)

    def hostname(self) -> str:
        import socket

        return socket.gethostname()

    def free(self) -> None:
        return None


def world_comm(announced: Announced | None = None) -> Comm:
    """This process's world: a private duplicate of ``MPI_COMM_WORLD``, or a world of one
    (no ``mpiexec``, a singleton, or no loadable MPI library: the caller decides whether
    a world of one is what the launcher meant; see ``ddl.runtime.world_check``).
    ``announced``: what the launcher told this process (``ddl.base.config.job_from_env``).

    MPI is initialised here rather than by importing ``mpi4py.MPI``, so that a process
    that Open MPI's launcher started for an MPICH-built mpi4py is refused with ddl's
    message instead of MPICH's abort inside ``MPI_Init``.

    Raises:
        WorldMismatchError: Open MPI's launcher started this process but mpi4py uses an
            MPICH-family library, which cannot join its world.
    """
    import sys

    try:
        import mpi4py

        if "mpi4py.MPI" not in sys.modules:
            mpi4py.rc.initialize = False
            mpi4py.rc.finalize = True  # at exit, as when mpi4py initialises itself
        from mpi4py import MPI
    except Exception as exc:  # no MPI library loadable
        return SelfComm(load_error=f"{type(exc).__name__}: {exc}")
    if not MPI.Is_initialized():
        refuse_foreign_launcher(str(MPI.Get_library_version()), announced)
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
    if MPI.COMM_WORLD.Get_size() == 1:
        return SelfComm()
    return MPIComm(MPI.COMM_WORLD.Dup())


def refuse_foreign_launcher(library_version: str, announced: Announced | None) -> None:
    """Raise before ``MPI_Init`` when Open MPI's launcher started an MPICH-family process.

    MPICH (the pip wheel included) aborts inside ``MPI_Init`` under Open MPI's PMIx
    ("unsupported PMI version PMIx") with no word of the fix. The reverse case (an Open
    MPI library under hydra) starts as a world of one, which ``world_check`` refuses.

    Example:
        >>> from ddl.base.config import announced_world
        >>> refuse_foreign_launcher("Open MPI v4.1.4", announced_world({"OMPI_COMM_WORLD_SIZE": "2"}))
        >>> refuse_foreign_launcher("MPICH Version: 5.0.2", announced_world({"PMI_SIZE": "2"}))
    """
    if announced is None or not announced.source.startswith("OMPI_COMM_WORLD_SIZE=") \
            or "Open MPI" in library_version:
        return
    size = announced.size
    text = library_version.strip()
    first = " ".join(text.splitlines()[0].split()) if text else "an MPICH-family MPI"
    raise WorldMismatchError(
        f"Open MPI's launcher started this process (OMPI_COMM_WORLD_SIZE={size}) but mpi4py uses {first}, "
        "which cannot join an Open MPI world: MPI would abort in MPI_Init and nothing would train. Start the "
        "job with the mpiexec of the MPI mpi4py uses (`ddlrun -np N ...` finds it), or reinstall mpi4py "
        "against Open MPI (DDL_MPI=system, see the install guide)"
    )
