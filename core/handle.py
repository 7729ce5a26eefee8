"""Handles returned by asynchronous collectives."""

from __future__ import annotations

import time
from typing import Any, Protocol


class Waiter(Protocol):
    """What a pending handle blocks on: the engine, which may run a cycle for it."""

    def wait_for(self, handle: Handle, timeout: float | None) -> bool: ...


class Handle:
    """The pending result of one collective; ``wait()`` returns it (or raises its error).

    A plain flag, not an Event per handle: the engine wakes all waiters once per cycle,
    and a waiting caller may run the engine's cycle itself (no thread hand-off).

    Example:
        >>> h = ddl.allreduce_async(x)  # doctest: +SKIP
        >>> y = h.wait()                # doctest: +SKIP
    """

    __slots__ = ("_done", "_error", "_result", "_waiter", "name")

    def __init__(self, name: str, waiter: Waiter | None = None) -> None:
        self.name = name
        self._done = False
        self._result: Any = None
        self._error: BaseException | None = None
        self._waiter = waiter

    def done(self) -> bool:
        """True once the collective has finished (successfully or not)."""
        return self._done

    def wait(self, timeout: float | None = None) -> Any:
        """Block until done and return the result.

        Raises:
            TimeoutError: not done within ``timeout`` seconds.
            MismatchError / DDLError: the collective failed on this rank.
        """
        if not self._done and not self._block(timeout):
            raise TimeoutError(f"collective {self.name!r} not done after {timeout} s")
        if self._error is not None:
            raise self._error
        return self._result

    def _block(self, timeout: float | None) -> bool:
        if self._waiter is not None:
            return self._waiter.wait_for(self, timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._done:  # a handle no engine owns: completed by whoever holds it
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(1e-4)
        return True

    def set_result(self, value: Any) -> None:
        self._result = value
        self._done = True

    def set_error(self, error: BaseException) -> None:
        self._error = error
        self._done = True

    def __repr__(self) -> str:
        return f"<ddl.Handle {self.name!r} {'done' if self.done() else 'pending'}>"
