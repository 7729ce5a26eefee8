"""The hooks that end the whole job when one rank has an uncaught exception, and undo them.

With several ranks, a rank that dies of an exception leaves the others waiting in a
collective it will never join: its traceback is printed and the job is aborted
(``MPI_Abort``) instead. ``shutdown`` puts the previous hooks back, so after it an
exception is an ordinary one again.
"""

from __future__ import annotations

import sys
import threading
import traceback
from types import TracebackType
from typing import Any

from ddl.wire.comm import Comm


class AbortHooks:
    """``sys.excepthook`` and ``threading.excepthook`` that abort the job, while installed."""

    def __init__(self) -> None:
        self._saved: tuple[Any, Any] | None = None

    @property
    def installed(self) -> bool:
        return self._saved is not None

    def install(self, comm: Comm) -> None:
        """Replace the hooks (once); an uncaught exception then aborts ``comm``'s job."""
        if self._saved is not None:
            return
        rank = comm.rank

        def abort(exc_type: type[BaseException], exc: BaseException | None, tb: TracebackType | None,
                  where: str) -> None:
            try:
                text = "".join(traceback.format_exception(exc_type, exc, tb))
                sys.stderr.write(f"{text}ddl: rank {rank}{where} raised {exc_type.__name__}: {exc}; "
                                 "aborting the job\n")
                sys.stderr.flush()
            finally:
                comm.abort(1)

        def excepthook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
            abort(exc_type, exc, tb, "")

        def thread_hook(args: threading.ExceptHookArgs) -> None:
            if args.exc_type is SystemExit:
                return
            name = args.thread.name if args.thread else "a thread"
            abort(args.exc_type, args.exc_value, args.exc_traceback, f" (thread {name})")

        self._saved = (sys.excepthook, threading.excepthook)
        sys.excepthook = excepthook
        threading.excepthook = thread_hook

    def uninstall(self) -> None:
        """Put back the hooks that were there before :meth:`install`."""
        if self._saved is not None:
            sys.excepthook, threading.excepthook = self._saved
            self._saved = None
