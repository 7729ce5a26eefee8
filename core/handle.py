"""Handles returned by asynchronous collectives."""

from __future__ import annotations

import threading
from typing import Any


class Handle:
    """The pending result of one collective; ``wait()`` returns it (or raises its error).

    Example:
        >>> h = ddl.allreduce_async(x)  # doctest: +SKIP
        >>> y = h.wait()                # doctest: +SKIP
    """

    __slots__ = ("_done", "_error", "_result", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._done = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None

    def done(self) -> bool:
        """True once the collective has finished (successfully or not)."""
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> Any:
        """Block until done and return the result.

        Raises:
            TimeoutError: not done within ``timeout`` seconds.
            MismatchError / DDLError: the collective failed on this rank.
        """
        if not self._done.wait(timeout):
            raise TimeoutError(f"collective {self.name!r} not done after {timeout} s")
        if self._error is not None:
            raise self._error
        return self._result

    def set_result(self, value: Any) -> None:
        self._result = value
        self._done.set()

    def set_error(self, error: BaseException) -> None:
        self._error = error
        self._done.set()

    def __repr__(self) -> str:
        return f"<ddl.Handle {self.name!r} {'done' if self.done() else 'pending'}>"
