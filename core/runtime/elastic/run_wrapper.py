"""``run``: the training function of an elastic job, synced at the start of each world, and how a rank leaves its world."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from ddl.base.errors import HorovodInternalError, HostsUpdatedInterrupt
from ddl.runtime.elastic.link import agent_link, world_number
from ddl.runtime.elastic.protocol import Reason, Step
from ddl.runtime.elastic.state import State
from ddl.runtime.elastic.wire import RESET_EXIT
from ddl.runtime.lifecycle import shutdown

F = TypeVar("F", bound=Callable[..., Any])


def _leave_broken_world() -> None:
    """End this process at once with status 75 after a collective failed (a peer lost, or
    the program raised :class:`HorovodInternalError`).

    Unlike :func:`_leave_for_next_world` there is no ``shutdown``: it waits for every
    rank to agree, and a lost or departed peer never would. ``ddlrun`` stops the world's
    other ranks and the next world resumes from the last commit.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(RESET_EXIT)


def _leave_for_next_world() -> None:
    """End this process at once with status 75, for ``ddlrun`` to start the next world.

    Every rank gets here at the same commit, so ``ddl.shutdown`` agrees with all of them;
    then ``os._exit``: the interpreter's own teardown of a process that imported PyTorch
    or TensorFlow takes seconds on a busy host, and the next world waits for the slowest
    rank to leave. (So ``finally`` blocks around the training call and ``atexit``
    handlers do not run; the next world starts the program afresh.)
    """
    sys.stdout.flush()
    sys.stderr.flush()
    shutdown()
    os._exit(RESET_EXIT)


def _leave_now(code: object) -> None:
    """End this process at once with the status ``sys.exit(code)`` would give, without ``shutdown``."""
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if code is None else code if isinstance(code, int) else 1)


def run(func: F) -> F:
    """Decorate the training function ``func(state, ...)`` of an elastic job (``hvd.elastic.run``).

    Each world first syncs ``state`` (the newest commit among the hosts), runs the reset
    callbacks when this world follows a change of hosts, then calls ``func``. When a
    commit raises :class:`HostsUpdatedInterrupt`, the process ends with status 75 so that
    ``ddlrun --elastic`` starts the next world, which resumes from that commit. A
    :class:`HorovodInternalError` (a collective failed: ddl raises it when a host of the
    world was lost; the program may raise it too) restores the last commit and ends the
    process at once, without the agreeing ``shutdown`` (a departed peer would never
    agree); ``ddlrun`` then stops the other ranks and starts the next world from that
    commit. Outside ``ddlrun --elastic`` it syncs and calls ``func`` once.

    Do not call collectives between building the state and calling the decorated function
    that the next world would not call in the same order (as with Horovod).
    """

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        link = agent_link()
        state.sync()
        if world_number() > 1:
            state.on_reset()
        if link is not None:
            link.report(Step.SYNCED, serial=state.commits)
        try:
            result = func(state, *args, **kwargs)
        except (HostsUpdatedInterrupt, HorovodInternalError) as exc:
            if link is None:
                raise
            if isinstance(exc, HorovodInternalError):
                state.restore()
                link.report(Step.RESET, serial=state.commits, reason=Reason.COLLECTIVE_FAILED)
                _leave_broken_world()
            link.report(Step.RESET, serial=state.commits, reason=Reason.HOSTS_UPDATED)
            _leave_for_next_world()
        except SystemExit as exc:
            if link is None:
                raise
            # The program leaves mid-training (sys.exit): the others wait for it in a collective, and the
            # agreeing shutdown at exit would wait for them; so it leaves at once, and ddlrun takes it
            # for a lost rank (its world ends, its host is left out).
            _leave_now(exc.code)
        except Exception as exc:
            # The program's own error: ddlrun ends the job with it (W14) rather than take this
            # rank's exit for a lost one (W21); the exception goes on to the interpreter's hook.
            if link is not None:
                link.report(Step.FAILED, serial=state.commits, reason=Reason.EXCEPTION,
                            detail=f"{type(exc).__name__}: {exc}"[:300])
            raise
        if link is not None:
            link.report(Step.DONE, serial=state.commits)
        return result

    return wrapper  # type: ignore[return-value]
