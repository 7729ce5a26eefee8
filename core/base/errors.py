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


class HorovodInternalError(DDLError):
    """A collective failed in a way the job may recover from (Horovod's name).

    Elastic training catches it to restore the last committed state and go on with
    the ranks that remain.
    """


class HostsUpdatedInterrupt(RuntimeError):
    """The set of hosts in an elastic job changed (Horovod's name).

    ``skip_sync``: True when no state needs restoring before going on (hosts were
    only added).
    """

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("the hosts of this elastic job changed")
        self.skip_sync = skip_sync
