"""The cycle's one collective: what each rank puts in, and the verdict every rank reads out.

Both exchange modes are written and read here, and nowhere else:

- *gathered records* (fewer than :data:`COMPACT_FROM` ranks): each rank contributes a
  record of :data:`HEADER_WORDS` int64 words (:data:`DIGEST` of its pending list, its
  :data:`LENGTH`, its :data:`STOP` word (0, or why it is shutting down: :data:`STOP_END`,
  :data:`STOP_FAILED`), the :data:`INLINE` payload size, whether its stall check is
  :data:`DUE`) and up to :func:`inline_capacity` bytes of payload, so small allreduces
  ride along; one ``Allgather``. Up to 16 ranks a record carries :data:`INLINE_BYTES`;
  from :data:`SMALL_RECORDS_FROM` on, :data:`SMALL_INLINE_BYTES`: a record of 128 bytes,
  whose gather costs what the compact allreduce does (measured at 32 and 64 ranks), so a
  small call stays one collective.
- *compact* (from :data:`COMPACT_FROM` ranks): gathering p records would cost every rank
  O(p) bytes and O(p) Python a cycle, so it is one MIN-``Allreduce`` of
  :data:`COMPACT_WORDS` words (each value and its negation give the minimum and maximum,
  and one word the lowest rank that is leaving): O(1) bytes, no payloads.

A rank that is shutting down with nothing pending (*leaving*) will never submit again: a
rank that still holds requests then fails them at once (the ``"abandon"`` verdict, read
alike everywhere) instead of waiting for a stall timeout.

:class:`Exchange` owns the buffers and runs the collective; :func:`decide`,
:func:`decide_compact`, :func:`all_hold` and :func:`compact_all_hold` turn the words into
a verdict that is the same on every rank (they read only exchanged words and this rank's
own digest), so they are tested at hundreds of ranks without MPI.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from ddl.base.ops import ReduceOp
from ddl.wire.comm import Comm

#: Payload bytes per rank carried by every cycle's record below :data:`SMALL_RECORDS_FROM`
#: ranks (an Allgather of 4 KiB costs about a 3-int allreduce on shared memory: measured,
#: see the engine docs).
INLINE_BYTES = 4096
#: The header words of a gathered record, by position.
DIGEST, LENGTH, STOP, INLINE, DUE = range(5)
HEADER_WORDS = 5
#: The record and its stride in words below :data:`SMALL_RECORDS_FROM` ranks.
RECORD_BYTES = HEADER_WORDS * 8 + INLINE_BYTES
STRIDE = RECORD_BYTES // 8
#: From this many ranks on, records carry :data:`SMALL_INLINE_BYTES` (p x 4 KiB gathered
#: by every rank would be 128 KiB at 32 ranks, and its gather took 2.4x the compact
#: allreduce there; a 128-byte record's took the same).
SMALL_RECORDS_FROM = 17
SMALL_INLINE_BYTES = 128 - HEADER_WORDS * 8
#: From this many ranks on, cycles exchange :data:`COMPACT_WORDS` words (an allreduce),
#: not records.
COMPACT_FROM = 65
#: From this many ranks on, one host's records go through shared memory (:func:`shared_records`).
#: At 2 ranks MPI's prepared gather is one C call, and the engine's exchange took 3.0-5.9 us
#: so against 5.1-6.8 us through the window (its copies and Python); at 3 ranks 32-41 against
#: 18-22 us, at 4 ranks on 2 cores 51-64 against 20-39 us (2026-12-07, loops of 20000).
SHARED_RECORDS_FROM = 3
#: digest, -digest, length, -length, stop, -stop, -(stall check due), leaver
COMPACT_WORDS = 8
#: The :data:`STOP` word: why a rank is shutting down (0: it is not). The program ended
#: or called ``shutdown`` (``sys.exit``, its last line), or an uncaught exception.
STOP_END, STOP_FAILED = 1, 2
#: The compact exchange's leaver word of a rank that is not leaving (the MIN then names
#: the lowest leaving rank as ``rank * 4 + its stop word``).
NOBODY = 1 << 62


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """What a cycle does next; equal on every rank for equal exchanged words.

    ``action``: ``"run"`` (every rank holds this very list: run it, from the payloads
    when ``inline``), ``"prefix"`` (all hold something: check whether the first
    ``prefix`` requests agree), ``"match"`` (gather the lists and pair them by name) or
    ``"idle"``, or ``"abandon"``: some rank is leaving (shutting down with nothing
    pending) while others hold requests, which can then never run: each rank fails its
    own. ``waiting_to_stop``: the ranks that have not asked to stop while some have
    (``"rank(s) [3, 7]"``, or ``"some ranks"`` where the exchange cannot say which).
    ``left``: the leaving ranks as (rank, stop word), all of them (gathered) or the
    lowest (compact); set with ``"abandon"`` only.
    """

    action: str
    all_stop: bool
    inline: bool = False
    prefix: int = 0
    waiting_to_stop: str = ""
    left: tuple[tuple[int, int], ...] = ()


def compact(size: int) -> bool:
    """Whether a job of ``size`` ranks negotiates with the compact exchange."""
    return size >= COMPACT_FROM


def _payload_room(size: int, shared: bool) -> int:
    return INLINE_BYTES if shared or size < SMALL_RECORDS_FROM else SMALL_INLINE_BYTES


def inline_capacity(size: int, shared: bool = False) -> int:
    """Payload bytes a cycle's record carries in a job of ``size`` ranks (0: compact, none);
    ``shared``: the records go through shared memory (:func:`shared_records`), where every
    rank reads the others' records where they lie, and 4 KiB records cost 32 ranks on 2
    cores 0.95-1.2 ms against 5.4-6.8 ms for MPI's gather of them."""
    return 0 if compact(size) else _payload_room(size, shared)


def record_bytes(size: int, shared: bool = False) -> int:
    """Bytes of one rank's record in a job of ``size`` ranks (gathered mode)."""
    return HEADER_WORDS * 8 + _payload_room(size, shared)


def gather_blocks(size: int, ranks_fit_cores: bool, elastic: bool) -> bool:
    """Whether a job of ``size`` ranks waits for its record gather in MPI's own wait: from
    :data:`SMALL_RECORDS_FROM` ranks where a host's ranks outnumber its cores (below that a
    gather ends within the polite wait's yielding phase; see ``MPIComm.negotiation_blocks``),
    and never in an elastic world, whose ranks must be able to leave a wait for a lost
    peer (only the polite wait can)."""
    return not ranks_fit_cores and not elastic and size >= SMALL_RECORDS_FROM


def shared_records(size: int, one_node: bool, elastic: bool) -> bool:
    """Whether a job of ``size`` ranks exchanges its records through shared memory
    (``MPIComm.shared_negotiation``): where every rank shares one memory node, outside
    elastic worlds, from :data:`SHARED_RECORDS_FROM` ranks, in gathered mode (the compact
    exchange is an allreduce)."""
    return one_node and not elastic and SHARED_RECORDS_FROM <= size < COMPACT_FROM


def compact_vector(digest: int, length: int, stop: int, due: bool, rank: int = 0) -> list[int]:
    """This rank's words for the compact exchange (reduced with MIN); ``stop``: its
    :data:`STOP` word (True counts as :data:`STOP_END`)."""
    stop = int(stop)
    leaver = rank * 4 + stop if stop and not length else NOBODY
    return [digest, -digest, length, -length, stop, -stop, -int(due), leaver]


def decide(words: Sequence[int], size: int, my_digest: int, my_length: int, stride: int = STRIDE) -> Verdict:
    """The verdict from the gathered header ``words`` (``size`` records of ``stride`` words:
    ``record_bytes(size) // 8``)."""
    same, all_stop, everyone_has, check, holding = True, True, True, False, False
    shortest = my_length
    stopping: list[int] = []
    left: list[tuple[int, int]] = []
    for q in range(size):
        base = q * stride
        n = words[base + LENGTH]
        same = same and words[base + DIGEST] == my_digest and n == my_length
        holding = holding or n > 0
        if words[base + STOP]:
            stopping.append(q)
            if not n:
                left.append((q, int(words[base + STOP])))
        else:
            all_stop = False
        everyone_has = everyone_has and n > 0
        check = check or words[base + DUE] != 0
        shortest = min(shortest, n)
    waiting = ""
    if stopping and not all_stop:
        running = [q for q in range(size) if q not in stopping]
        waiting = f"rank(s) {running[:16]}" + (f" ({len(running)} ranks)" if len(running) > 16 else "")
    if same:
        return Verdict("run", all_stop, inline=my_length > 0 and words[INLINE] > 0, waiting_to_stop=waiting)
    if left and holding:
        return Verdict("abandon", all_stop, waiting_to_stop=waiting, left=tuple(left))
    if everyone_has:
        return Verdict("prefix", all_stop, prefix=shortest, waiting_to_stop=waiting)
    # A rank with nothing pending (often just a cycle early) makes nothing ready: the
    # lists are gathered only now and then, to watch for stalls.
    return Verdict("match" if check else "idle", all_stop, waiting_to_stop=waiting)


def decide_compact(v: Sequence[int], my_digest: int, my_length: int) -> Verdict:
    """The verdict from the MIN-reduced :func:`compact_vector` of every rank."""
    all_stop, any_stop, due = v[4] >= 1, -v[5] >= 1, -v[6] == 1
    waiting = "some ranks" if any_stop and not all_stop else ""
    if compact_all_hold(v, my_digest, my_length):
        return Verdict("run", all_stop, waiting_to_stop=waiting)
    if v[7] != NOBODY and -v[3] > 0:  # someone is leaving while someone holds requests
        return Verdict("abandon", all_stop, waiting_to_stop=waiting, left=((v[7] // 4, v[7] % 4),))
    if v[2] > 0:
        return Verdict("prefix", all_stop, prefix=int(v[2]), waiting_to_stop=waiting)
    return Verdict("match" if due else "idle", all_stop, waiting_to_stop=waiting)


def all_hold(words: Sequence[int], size: int, digest: int, length: int, stride: int = STRIDE) -> bool:
    """Whether every gathered record holds ``digest`` over ``length`` requests: the
    ``"run"`` verdict's test without building one (the lean path's common case), and the
    answer of a prefix round."""
    for base in range(0, size * stride, stride):
        if words[base + DIGEST] != digest or words[base + LENGTH] != length:
            return False
    return True


def compact_all_hold(v: Sequence[int], digest: int, length: int) -> bool:
    """:func:`all_hold` for the compact exchange."""
    return v[0] == -v[1] == digest and v[2] == -v[3] == length


class Exchange:
    """One rank's side of the cycle's collective, with its buffers (allocated once)."""

    def __init__(self, comm: Comm) -> None:
        self.comm = comm
        p = comm.size
        self.size = p
        self.compact = compact(p)
        self._vec = np.zeros(COMPACT_WORDS, np.int64)
        self._vec_words = memoryview(self._vec.view(np.uint8).data).cast("q")
        self._words: list[int] = []
        #: Payload bytes a record carries (0 in the compact exchange), and a record's size.
        self.inline_capacity = inline_capacity(p, comm.shared_negotiation)
        self.record_bytes = rb = record_bytes(p, comm.shared_negotiation)
        self._stride = rb // 8
        self._peer = (self._stride + DIGEST, self._stride + LENGTH)  # rank 1's words, at two ranks
        self._send = np.zeros(rb, np.uint8)
        self._recv = np.zeros((1 if self.compact else p) * rb, np.uint8)
        # Header words through memoryviews: numpy calls on tiny arrays cost microseconds.
        self._send_words = memoryview(self._send.data).cast("q")
        self._recv_words = memoryview(self._recv.data).cast("q")
        #: This rank's outgoing inline payload, and every rank's incoming one (gathered mode).
        self.payload_out = self._send[HEADER_WORDS * 8 :]
        self.payloads = [self._recv[q * rb + HEADER_WORDS * 8 : (q + 1) * rb]
                         for q in range(0 if self.compact else p)]
        # Every cycle gathers these same two buffers: prepared once where MPI can (MPI-4).
        self._gather = comm.persistent_allgather(self._send, self._recv) if not self.compact and p > 1 else None
        self._one_header = False  # whether the header's LENGTH and STOP words are run_one's (1, 0)

    def stacked_payloads(self, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """Every rank's payload, typed and shaped, as one array with the rank first: a view
        of the gathered records (each row a record apart), no copy."""
        inner = np.empty(shape, dtype).strides  # C order, as the payload was staged
        view: np.ndarray = np.ndarray((self.size, *shape), dtype, buffer=self._recv, offset=HEADER_WORDS * 8,
                                      strides=(self.record_bytes, *inner))
        return view

    def run(self, digest: int, length: int, *, stop: int = 0, inline: int = 0, due: bool = False) -> None:
        """Exchange this rank's header (its payload must already be in :attr:`payload_out`);
        ``stop``: this rank's :data:`STOP` word."""
        if self.compact:
            v = self._vec_words
            stop = int(stop)
            v[0], v[1], v[2], v[3], v[4], v[5], v[6] = digest, -digest, length, -length, stop, -stop, -int(due)
            v[7] = self.comm.rank * 4 + stop if stop and not length else NOBODY
            self.comm.allreduce_native(self._vec, ReduceOp.MIN, negotiation=True)
            self._words = self._vec.tolist()
            return
        head = self._send_words
        head[DIGEST], head[LENGTH], head[STOP], head[INLINE], head[DUE] = digest, length, int(stop), inline, int(due)
        self._one_header = False
        if self._gather is not None:
            self._gather()
        else:
            self.comm.allgather_buffer(self._send, self._recv)

    def run_one(self, digest: int, inline: int, due: bool) -> bool:
        """:meth:`run` for one request in gathered mode, then :meth:`all_hold`: the lean
        path's whole exchange in one call (its per-call Python is most of a small call)."""
        head = self._send_words
        head[DIGEST], head[INLINE], head[DUE] = digest, inline, due
        if not self._one_header:  # LENGTH 1 and STOP 0 stay until a run() writes others
            head[LENGTH], head[STOP] = 1, 0
            self._one_header = True
        if self._gather is not None:
            self._gather()
        else:
            self.comm.allgather_buffer(self._send, self._recv)
        words = self._recv_words
        if self.size == 2:
            peer_digest, peer_length = self._peer
            return words[DIGEST] == words[peer_digest] == digest and words[LENGTH] == words[peer_length] == 1
        return all_hold(words, self.size, digest, 1, self._stride)

    def verdict(self, digest: int, length: int) -> Verdict:
        """The verdict of the last :meth:`run` for a rank holding ``digest`` over ``length`` requests."""
        if self.compact:
            return decide_compact(self._words, digest, length)
        return decide(self._recv_words, self.size, digest, length, self._stride)

    def all_hold(self, digest: int, length: int) -> bool:
        """Whether every rank sent ``digest`` over ``length`` requests in the last :meth:`run`."""
        if self.compact:
            return compact_all_hold(self._words, digest, length)
        return all_hold(self._recv_words, self.size, digest, length, self._stride)

    def bytes_per_cycle(self) -> int:
        """Bytes one rank sends plus receives in a steady-state cycle."""
        if self.size == 1:
            return 0
        if self.compact:
            return 2 * COMPACT_WORDS * 8
        return self.record_bytes * (1 + self.size)
