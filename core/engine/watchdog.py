"""The stall watchdog: names the ranks and tensors a job waits for, then ends it.

A tensor that some ranks submitted and others did not is reported as a warning at
half the stall timeout and aborts the job at the timeout (a rank that never submits
would otherwise hold every other rank forever). Ranks that wait in ``shutdown`` for
others are only reported: a slow rank (saving a checkpoint) is not an error.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from typing import NoReturn

from ddl.engine.naming import described


class StallWatch:
    """Tracks how long each name has been missing somewhere; one per engine."""

    def __init__(self, rank: int, size: int, timeout: float, abort: Callable[[int], NoReturn]) -> None:
        self.rank = rank
        self.size = size
        self.timeout = timeout
        self._abort = abort
        #: The names being timed, and since when (empty: nothing to time; the lean path
        #: tests it directly, a property costs a small call 1 %).
        self.timed: dict[str, float] = {}
        self._warned: set[str] = set()
        self._stop_since: float | None = None
        self._stop_warned = 0.0
        self.next_check = 0.0

    @property
    def watching(self) -> bool:
        """Whether some name is being timed (only then does :meth:`done` have work)."""
        return bool(self.timed)

    def due(self, now: float) -> bool:
        """Whether this rank wants the full lists gathered this cycle (rate-limited)."""
        return now >= self.next_check

    def checked(self, now: float) -> None:
        self.next_check = now + min(1.0, self.timeout / 8)

    def missing(self, name: str, have: list[int], now: float, doing: dict[int, list[str]] | None = None,
                describe: Callable[[int], str] | None = None) -> None:
        """``name`` is held by ``have`` only; warn, or abort the job once it is too late.

        ``doing``: what each rank holds instead (its pending names, from the same gather),
        so the report says what the missing ranks were doing; ``describe``: a rank as
        ``"rank 1 (host h2)"``.
        """
        waited = now - self.timed.setdefault(name, now)
        absent = [r for r in range(self.size) if r not in have]
        text = (f"tensor {described(name)} was submitted by rank(s) {_short(have)} but not by rank(s) "
                f"{_short(absent)} for {waited:.1f} s")
        if waited >= self.timeout:
            said = "; ".join(_doing(q, (doing or {}).get(q, []), describe) for q in absent[:4])
            _say(f"ddl: rank {self.rank}: stall: {text} ({said}); aborting the job "
                 f"(DDL_STALL_TIMEOUT={self.timeout:g}; raise it if a rank legitimately works that long "
                 "between collectives)")
            self._abort(1)
        elif waited >= self.timeout / 2 and name not in self._warned:
            self._warned.add(name)
            _say(f"ddl: rank {self.rank}: warning: {text}")

    def present(self, name: str) -> None:
        self.timed.pop(name, None)
        self._warned.discard(name)

    def done(self, names: Iterable[str]) -> None:
        """These names ran (on any path): a later request that reuses one starts a new clock."""
        if self.timed:
            for name in names:
                self.present(name)

    def waiting_to_stop(self, ranks: str) -> None:
        """This rank is in shutdown and ``ranks`` (a description) are not: say so now and then."""
        now = time.monotonic()
        if not ranks:
            self._stop_since = None
            return
        if self._stop_since is None:
            self._stop_since = self._stop_warned = now
        if now - self._stop_warned >= max(self.timeout / 2, 1.0):
            self._stop_warned = now
            _say(f"ddl: rank {self.rank}: waiting in shutdown for {ranks} for {now - self._stop_since:.0f} s")


def _doing(q: int, names: list[str], describe: Callable[[int], str] | None) -> str:
    who = describe(q) if describe is not None else f"rank {q}"
    if not names:
        return (f"{who} holds no collective: alive, but busy outside ddl (computing, loading data, "
                "or waiting on something else)")
    shown = ", ".join(described(n) for n in names[:2]) + (f" and {len(names) - 2} more" if len(names) > 2 else "")
    return f"{who} waits in {shown} instead"


def _short(ranks: list[int]) -> str:
    return str(ranks) if len(ranks) <= 16 else f"[{ranks[0]}..{ranks[-1]}] ({len(ranks)} ranks)"


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
