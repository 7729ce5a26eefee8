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

    def attach(self, waiter: Waiter) -> None:
        """Have ``waiter`` (the engine that queued this collective) run cycles for a caller
        that blocks on it."""
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


class GroupHandle(Handle):
    """The pending results of one grouped allreduce: ``wait()`` returns a list in input order.

    The group travels as one request per dtype (a flat private copy of its tensors);
    each result is a view of that request's reduced buffer, in the input's shape.
    """

    __slots__ = ("_count", "_parts")

    def __init__(self, name: str, parts: list[tuple[list[int], list[tuple[int, ...]], list[int], Handle]],
                 count: int) -> None:
        """``parts``: (input positions, their shapes, their element counts, the handle) per request."""
        super().__init__(name)
        self._parts = parts
        self._count = count

    def done(self) -> bool:
        return all(h.done() for *_, h in self._parts)

    def wait(self, timeout: float | None = None) -> Any:
        """Block until every part is done; return the list of results.

        Raises:
            TimeoutError: not done within ``timeout`` seconds.
            MismatchError / DDLError: the collective failed on this rank.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        out: list[Any] = [None] * self._count
        for positions, shapes, sizes, handle in self._parts:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            flat = handle.wait(left)
            offset = 0
            for i, shape, n in zip(positions, shapes, sizes, strict=True):
                part = flat[offset : offset + n]
                out[i] = part if len(shape) == 1 else part.reshape(shape)  # (a 1-D slice is its shape)
                offset += n
        return out
