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


# Elastic training (``ddlrun --elastic``). The names are Horovod's, so that code written for
# ``hvd.elastic`` catches the same exceptions; the Horovod API issue defines them too.
class HorovodInternalError(DDLError):
    """A collective failed because a rank was lost; ``elastic.run`` restores the last commit."""


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
