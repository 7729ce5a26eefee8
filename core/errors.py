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
