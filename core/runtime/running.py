"""What ``init`` made and ``shutdown`` unmade: the running context, engine and collectives, read by everything.

Kept apart from :mod:`ddl.runtime.lifecycle` so that the modules ``init`` and
``shutdown`` call (process sets) can read the running runtime without importing
``lifecycle`` back: no two modules import each other.
"""

from __future__ import annotations

from ddl.base.errors import NotInitializedError
from ddl.base.topology import Topology
from ddl.engine.collectives import Collectives
from ddl.engine.context import Context
from ddl.engine.engine import Engine

_context: Context | None = None
_engine: Engine | None = None
_collectives: Collectives | None = None


def set_running(ctx: Context | None, engine: Engine | None, collectives: Collectives | None) -> None:
    """Record what ``init`` made (all three), or that ``shutdown`` undid it (all None)."""
    global _context, _engine, _collectives
    _context, _engine, _collectives = ctx, engine, collectives


def context() -> Context:
    """The running context.

    Raises:
        NotInitializedError: ``ddl.init()`` has not been called.
    """
    if _context is None:
        raise NotInitializedError("ddl is not initialized; call ddl.init() first")
    return _context


def current_context() -> Context | None:
    """The running context, or None before ``init`` and after ``shutdown``."""
    return _context


def engine() -> Engine:
    """The running engine.

    Raises:
        NotInitializedError: ``ddl.init()`` has not been called.
    """
    if _engine is None:
        raise NotInitializedError("ddl is not initialized; call ddl.init() first")
    return _engine


def current_engine() -> Engine | None:
    """The running engine, or None (from threads that may outlive ``shutdown``)."""
    return _engine


def collectives() -> Collectives:
    """The running collectives (the public API's target).

    Raises:
        NotInitializedError: ``ddl.init()`` has not been called.
    """
    if _collectives is None:
        raise NotInitializedError("ddl is not initialized; call ddl.init() first")
    return _collectives


def is_initialized() -> bool:
    return _context is not None


def topology() -> Topology:
    """This job's :class:`~ddl.base.topology.Topology`."""
    return context().topology
