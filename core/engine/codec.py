"""The cycle's one collective: what each rank puts in, and the verdict every rank reads out.

Both exchange modes are written and read here, and nowhere else:

- *gathered records* (fewer than :data:`COMPACT_FROM` ranks): each rank contributes a
  record of :data:`HEADER_WORDS` int64 words (:data:`DIGEST` of its pending list, its
  :data:`LENGTH`, a :data:`STOP` flag, the :data:`INLINE` payload size, whether its stall
  check is :data:`DUE`) and up to :data:`INLINE_BYTES` of payload, so small allreduces
  ride along; one ``Allgather``.
- *compact* (from :data:`COMPACT_FROM` ranks): gathering p records would cost every rank
  O(p) bytes a cycle, so it is one MIN-``Allreduce`` of :data:`COMPACT_WORDS` words
  (each value and its negation give the minimum and maximum): O(1) bytes, no payloads.

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

#: Payload bytes per rank carried by every cycle's record (an Allgather of 4 KiB costs
#: about a 3-int allreduce on shared memory: measured, see the engine docs).
INLINE_BYTES = 4096
#: The header words of a gathered record, by position.
DIGEST, LENGTH, STOP, INLINE, DUE = range(5)
HEADER_WORDS = 5
RECORD_BYTES = HEADER_WORDS * 8 + INLINE_BYTES
STRIDE = RECORD_BYTES // 8
#: From this many ranks on, cycles exchange :data:`COMPACT_WORDS` words (an allreduce),
#: not records (p x 4 KiB gathered by every rank: 64 KiB at 16 ranks, 1 MiB at 256).
COMPACT_FROM = 17
COMPACT_WORDS = 7  # digest, -digest, length, -length, stop, -stop, -(stall check due)


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """What a cycle does next; equal on every rank for equal exchanged words.

    ``action``: ``"run"`` (every rank holds this very list: run it, from the payloads
    when ``inline``), ``"prefix"`` (all hold something: check whether the first
    ``prefix`` requests agree), ``"match"`` (gather the lists and pair them by name) or
    ``"idle"``. ``waiting_to_stop``: the ranks that have not asked to stop while some
    have (``"rank(s) [3, 7]"``, or ``"some ranks"`` where the exchange cannot say which).
    """

    action: str
    all_stop: bool
    inline: bool = False
    prefix: int = 0
    waiting_to_stop: str = ""


def compact(size: int) -> bool:
    """Whether a job of ``size`` ranks negotiates with the compact exchange."""
    return size >= COMPACT_FROM


def compact_vector(digest: int, length: int, stop: bool, due: bool) -> list[int]:
    """This rank's words for the compact exchange (reduced with MIN)."""
    return [digest, -digest, length, -length, int(stop), -int(stop), -int(due)]


def decide(words: Sequence[int], size: int, my_digest: int, my_length: int) -> Verdict:
    """The verdict from the gathered header ``words`` (``size`` records of :data:`STRIDE`)."""
    same, all_stop, everyone_has, check = True, True, True, False
    shortest = my_length
    stopping: list[int] = []
    for q in range(size):
        base = q * STRIDE
        n = words[base + LENGTH]
        same = same and words[base + DIGEST] == my_digest and n == my_length
        if words[base + STOP]:
            stopping.append(q)
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
    if everyone_has:
        return Verdict("prefix", all_stop, prefix=shortest, waiting_to_stop=waiting)
    # A rank with nothing pending (often just a cycle early) makes nothing ready: the
    # lists are gathered only now and then, to watch for stalls.
    return Verdict("match" if check else "idle", all_stop, waiting_to_stop=waiting)


def decide_compact(v: Sequence[int], my_digest: int, my_length: int) -> Verdict:
    """The verdict from the MIN-reduced :func:`compact_vector` of every rank."""
    all_stop, any_stop, due = v[4] == 1, -v[5] == 1, -v[6] == 1
    waiting = "some ranks" if any_stop and not all_stop else ""
    if compact_all_hold(v, my_digest, my_length):
        return Verdict("run", all_stop, waiting_to_stop=waiting)
    if v[2] > 0:
        return Verdict("prefix", all_stop, prefix=int(v[2]), waiting_to_stop=waiting)
    return Verdict("match" if due else "idle", all_stop, waiting_to_stop=waiting)


def all_hold(words: Sequence[int], size: int, digest: int, length: int) -> bool:
    """Whether every gathered record holds ``digest`` over ``length`` requests: the
    ``"run"`` verdict's test without building one (the lean path's common case), and the
    answer of a prefix round."""
    for base in range(0, size * STRIDE, STRIDE):
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
        self._send = np.zeros(RECORD_BYTES, np.uint8)
        self._recv = np.zeros((1 if self.compact else p) * RECORD_BYTES, np.uint8)
        # Header words through memoryviews: numpy calls on tiny arrays cost microseconds.
        self._send_words = memoryview(self._send.data).cast("q")
        self._recv_words = memoryview(self._recv.data).cast("q")
        #: This rank's outgoing inline payload, and every rank's incoming one (gathered mode).
        self.payload_out = self._send[HEADER_WORDS * 8 :]
        self.payloads = [self._recv[q * RECORD_BYTES + HEADER_WORDS * 8 : (q + 1) * RECORD_BYTES]
                         for q in range(0 if self.compact else p)]
        # Every cycle gathers these same two buffers: prepared once where MPI can (MPI-4).
        self._gather = comm.persistent_allgather(self._send, self._recv) if not self.compact and p > 1 else None

    def run(self, digest: int, length: int, *, stop: bool = False, inline: int = 0, due: bool = False) -> None:
        """Exchange this rank's header (its payload must already be in :attr:`payload_out`)."""
        if self.compact:
            v = self._vec_words
            v[0], v[1], v[2], v[3], v[4], v[5], v[6] = digest, -digest, length, -length, int(stop), -int(stop), -int(due)
            self.comm.allreduce_native(self._vec, ReduceOp.MIN)
            self._words = self._vec.tolist()
            return
        head = self._send_words
        head[DIGEST], head[LENGTH], head[STOP], head[INLINE], head[DUE] = digest, length, int(stop), inline, int(due)
        if self._gather is not None:
            self._gather()
        else:
            self.comm.allgather_buffer(self._send, self._recv)

    def run_one(self, digest: int, inline: int, due: bool) -> bool:
        """:meth:`run` for one request in gathered mode, then :meth:`all_hold`: the lean
        path's whole exchange in one call (its per-call Python is most of a small call)."""
        head = self._send_words
        head[DIGEST], head[LENGTH], head[STOP], head[INLINE], head[DUE] = digest, 1, 0, inline, int(due)
        if self._gather is not None:
            self._gather()
        else:
            self.comm.allgather_buffer(self._send, self._recv)
        words = self._recv_words
        if self.size == 2:
            return words[DIGEST] == words[STRIDE + DIGEST] == digest and words[LENGTH] == words[STRIDE + LENGTH] == 1
        return all_hold(words, self.size, digest, 1)

    def verdict(self, digest: int, length: int) -> Verdict:
        """The verdict of the last :meth:`run` for a rank holding ``digest`` over ``length`` requests."""
        if self.compact:
            return decide_compact(self._words, digest, length)
        return decide(self._recv_words, self.size, digest, length)

    def all_hold(self, digest: int, length: int) -> bool:
        """Whether every rank sent ``digest`` over ``length`` requests in the last :meth:`run`."""
        if self.compact:
            return compact_all_hold(self._words, digest, length)
        return all_hold(self._recv_words, self.size, digest, length)

    def bytes_per_cycle(self) -> int:
        """Bytes one rank sends plus receives in a steady-state cycle."""
        if self.size == 1:
            return 0
        if self.compact:
            return 2 * COMPACT_WORDS * 8
        return RECORD_BYTES * (1 + self.size)
