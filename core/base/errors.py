"""Exception types raised by ddl; every message says what was wrong and what to do."""

from __future__ import annotations


class DDLError(RuntimeError):
    """Base class for ddl's runtime errors."""


class NotInitializedError(DDLError):
    """A collective was called before ``ddl.init()`` or after ``ddl.shutdown()``."""


class TopologyError(ValueError):
    """A topology spec is malformed or does not match the world size."""


class MismatchError(DDLError):
    """Ranks submitted collectives that do not agree (name, shape, dtype, op, kind)."""


class RemoteError(DDLError):
    """Another rank could not start a collective this rank called, so every rank ends it.

    The message names the failing rank and its own error; that rank raised the original
    exception (a ``TypeError`` for an unsupported dtype, say). The runtime stays usable.
    """


class SettingsMismatchError(DDLError):
    """Ranks were started with settings that change the sequence of MPI calls."""


class WorldMismatchError(DDLError):
    """The launcher started N processes but MPI connected a different number of them
    (mpi4py could not load its MPI, or loaded another MPI than the launcher's)."""


# Elastic training (``ddlrun --elastic``). The names are Horovod's, so that code written for
# ``hvd.elastic`` catches the same exceptions; the Horovod API issue defines them too.
class HorovodInternalError(DDLError):
    """A collective failed (Horovod's meaning): under ``ddlrun --elastic`` ddl raises it in
    the collectives a rank is waiting for when ``ddlrun`` ends the world because a host was
    lost; a program may raise it too. ``elastic.run`` then restores the last commit and the
    process leaves at once (no agreeing ``shutdown``: the lost peer would never agree), and
    the next world resumes from that commit. A rank blocked inside an MPI call when its
    world ends cannot raise; ``ddlrun`` stops it, with the same outcome."""


class RankLeftError(HorovodInternalError):
    """Another rank left the job (its program ended, by its last line, ``sys.exit``, an
    uncaught exception or ``ddl.shutdown``) while this rank waited for it in a collective,
    which can then never complete. Raised at once on every rank that holds such a call;
    the message names the rank that left, its host and the call.

    A :class:`HorovodInternalError`, as Horovod raises for a peer's failure: under
    ``ddlrun --elastic``, ``elastic.run`` treats the leaving rank as lost and resumes.

    Attributes:
        ranks: the ranks seen leaving (all of them, or the lowest one at 17+ ranks).
    """

    def __init__(self, message: str, *, ranks: list[int] | tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.ranks = tuple(ranks)


class StalledWaitError(DDLError):
    """No other rank answered a wait inside ddl for ``DDL_STALL_TIMEOUT`` seconds: a rank
    stopped taking part without leaving (its process stopped or frozen, a hung file
    system, its host unreachable). Raised inside the engine, which then ends the job with
    its message, since the others may be waiting for this rank as well."""


class HostsUpdatedInterrupt(DDLError):
    """The hosts changed (one joined, or one is leaving); raised by ``state.commit()`` on every rank
    at the same commit, after the state was saved, so nothing is lost.

    Attributes:
        skip_sync: the state was just committed on every rank, so the next world need not
            broadcast it again (Horovod's attribute; ddl's next world syncs anyway, it is cheap).
    """

    def __init__(self, skip_sync: bool = False, message: str = "the hosts of the elastic job changed") -> None:
        super().__init__(message)
        self.skip_sync = skip_sync
