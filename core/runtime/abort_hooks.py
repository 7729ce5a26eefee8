"""The hooks that end a rank's part in the job when it has an uncaught exception, and undo them.

With several ranks, a rank that dies of an exception would leave the others waiting in
a collective it will never join. The hook prints its traceback and *leaves*: it shuts
ddl down at once, telling the others (they raise :class:`~ddl.base.errors.RankLeftError`
naming it, at their next wait), and the process then ends with status 1 as any Python
program does. Only when the others do not let it leave in time (busy outside ddl), or
for an exception in another thread (the main thread may still run), is the job aborted.
Under ``ddlrun`` the rank's keeper is told the exception first, so ``ddlrun``'s report
names it. ``shutdown`` puts the previous hooks back: after it, an exception is an
ordinary one again.
"""

from __future__ import annotations

import sys
import threading
import traceback
from collections.abc import Callable
from types import TracebackType
from typing import Any

from ddl.base import notes
from ddl.base.errors import RankLeftError
from ddl.wire.comm import Comm


class AbortHooks:
    """``sys.excepthook`` and ``threading.excepthook`` that end this rank's part, while installed."""

    def __init__(self) -> None:
        self._saved: tuple[Any, Any] | None = None

    @property
    def installed(self) -> bool:
        return self._saved is not None

    def install(self, comm: Comm, leave: Callable[[], bool] | None = None) -> None:
        """Replace the hooks (once). ``leave``: shut ddl down, telling the others, within a
        bounded time (True: done); without it, or when it fails, ``comm``'s job is aborted."""
        if self._saved is not None:
            return
        rank = comm.rank

        def report(exc_type: type[BaseException], exc: BaseException | None, tb: TracebackType | None,
                   where: str, then: str) -> None:
            text = "".join(traceback.format_exception(exc_type, exc, tb))
            sys.stderr.write(f"{text}ddl: rank {rank}{where} raised {exc_type.__name__}: {exc}; {then}\n")
            sys.stderr.flush()
            blame = exc.ranks[0] if isinstance(exc, RankLeftError) and exc.ranks else None
            notes.send(notes.FAILING, f"{exc_type.__name__}: {exc}", blame=blame)

        def excepthook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
            try:
                report(exc_type, exc, tb, "", "leaving the job (the other ranks stop waiting for it)")
                if leave is not None and leave():
                    return  # the interpreter now ends with status 1, as after any uncaught exception
                sys.stderr.write(f"ddl: rank {rank}: the other ranks did not let it leave in time; aborting the job\n")
            finally:
                if leave is None or self._saved is not None:  # still installed: leaving failed
                    comm.abort(1)

        def thread_hook(args: threading.ExceptHookArgs) -> None:
            if args.exc_type is SystemExit:
                return
            name = args.thread.name if args.thread else "a thread"
            try:
                report(args.exc_type, args.exc_value, args.exc_traceback, f" (thread {name})", "aborting the job")
            finally:
                comm.abort(1)

        self._saved = (sys.excepthook, threading.excepthook)
        sys.excepthook = excepthook
        threading.excepthook = thread_hook

    def uninstall(self) -> None:
        """Put back the hooks that were there before :meth:`install`."""
        if self._saved is not None:
            sys.excepthook, threading.excepthook = self._saved
            self._saved = None
