"""Every interval of an elastic job, derived from ``--elastic-timeout`` and ``--start-timeout`` in one place.

Failure is noticed by missed heartbeats: each agent beats every ``T / 20`` seconds
(``T`` = ``--elastic-timeout``, default 5 s: every 0.25 s) and ddlrun declares a host
lost after :data:`MISSED_BEATS` beats in a row went missing (``0.3 T``: 1.5 s by
default), well before the agent's own limit ``T``, after which a host cut off from
ddlrun ends its ranks (it fences itself). Arrival times are taken where messages are
read, not where they are judged, so a supervisor held up for a moment under load sees
the beats that did arrive. A rank's error of its own waits :attr:`Timing.settle` for
news of a lost host before it counts as the program's: a beat period longer than
detection itself.
"""

from __future__ import annotations

import dataclasses

#: Heartbeats per ``--elastic-timeout``.
BEATS_PER_TIMEOUT = 20
#: Beats in a row a host may miss; one more and it is lost.
MISSED_BEATS = 6
#: How long a rank of a world that lost a host may take to leave by itself (its waiting
#: collectives raise HorovodInternalError) before its agent kills it; a rank blocked
#: inside an MPI call cannot leave and costs the recovery this much.
LOST_GRACE_SECONDS = 0.5
#: Ranks report their end through their agents before their stubs end: how long ddlrun
#: waits, once mpiexec has ended, for reports still on their way.
MPIEXEC_GRACE_SECONDS = 2.0
#: The smallest ``--elastic-timeout`` (beats every 50 ms).
MIN_ELASTIC_TIMEOUT = 1.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Timing:
    """The intervals of one job.

    Args:
        elastic_timeout: ``--elastic-timeout`` (seconds, at least :data:`MIN_ELASTIC_TIMEOUT`).
        start_timeout: ``--start-timeout`` (seconds, > 0): hosts to start and import, a
            world's ranks to start and sync.

    Raises:
        ValueError: a value out of range (the message names the flag).

    Example:
        >>> t = Timing()
        >>> t.beat, t.lost_after, t.fence_after
        (0.25, 1.5, 5.0)
    """

    elastic_timeout: float = 5.0
    start_timeout: float = 120.0

    def __post_init__(self) -> None:
        if not self.elastic_timeout >= MIN_ELASTIC_TIMEOUT:
            raise ValueError(f"--elastic-timeout {self.elastic_timeout:g}: give at least {MIN_ELASTIC_TIMEOUT:g} "
                             "second (it sets the heartbeat: a beat every timeout/20 s)")
        if not self.start_timeout > 0:
            raise ValueError(f"--start-timeout {self.start_timeout:g}: give the longest wait for hosts and ranks "
                             "to start, in seconds > 0 (default 120)")

    @property
    def beat(self) -> float:
        """Seconds between an agent's heartbeats (and between ddlrun's pings)."""
        return self.elastic_timeout / BEATS_PER_TIMEOUT

    @property
    def lost_after(self) -> float:
        """Silence after which ddlrun declares a ready host lost (:data:`MISSED_BEATS` beats)."""
        return MISSED_BEATS * self.beat

    @property
    def fence_after(self) -> float:
        """Silence from ddlrun after which an agent ends its host's ranks."""
        return self.elastic_timeout

    @property
    def rank_silent_after(self) -> float:
        """Silence of a linked rank (its own heartbeat thread) after which its agent kills it as frozen:
        twice a host's bound (:attr:`lost_after`; 3 s by default), as a rank's beat needs the
        interpreter's lock, which one long call into a library may hold for a moment. A rank frozen
        with its agent (a whole host stopped) is caught by the agent's beats first."""
        return 2 * self.lost_after

    @property
    def settle(self) -> float:
        """How long a rank's own error waits for news of a lost host (detection, and one beat more)."""
        return self.lost_after + self.beat

    @property
    def ending(self) -> float:
        """How long the ranks of an ending world may take before their mpiexec is killed."""
        return 2 * self.elastic_timeout

    @property
    def restop(self) -> float:
        """Ranks of a world whose others left at a commit, still there after this long, are stopped
        (they all leave at the same commit, agreed by every rank: one still there is stuck)."""
        return self.elastic_timeout

    @property
    def loop_stuck_after(self) -> float:
        """ddlrun's pings (a thread of their own) stop when its loop has not turned for this long:
        nothing the loop does waits (discovery, kills, sends run beside it), so that is a bug, and
        the agents then end their ranks rather than train for a job nobody runs."""
        return max(30.0, 6 * self.elastic_timeout)

    @property
    def lost_grace(self) -> float:
        return LOST_GRACE_SECONDS

    @property
    def mpiexec_grace(self) -> float:
        return MPIEXEC_GRACE_SECONDS
