"""The abort hooks: an uncaught exception ends the whole job while ddl runs, and is ordinary after shutdown."""

from __future__ import annotations

import sys
import threading

import pytest

from ddl.runtime.abort_hooks import AbortHooks
from ddl.testing import FakeAbort, run_ranks


def test_installed_hooks_abort_and_uninstall_restores_the_previous_ones() -> None:
    before = (sys.excepthook, threading.excepthook)

    def body(comm: object) -> tuple[bool, bool, bool]:
        if comm.rank != 0:
            return True, True, True
        hooks = AbortHooks()
        hooks.install(comm)  # type: ignore[arg-type]
        replaced = sys.excepthook is not before[0] and threading.excepthook is not before[1]
        hooks.install(comm)  # once: a second install keeps the saved originals
        try:
            sys.excepthook(ValueError, ValueError("boom"), None)
        except FakeAbort:
            aborted = True
        else:
            aborted = False
        hooks.uninstall()
        restored = (sys.excepthook, threading.excepthook) == before and not hooks.installed
        return replaced, aborted, restored

    try:
        results = run_ranks(1, body)
    except FakeAbort:
        pytest.fail("the abort escaped the hook")
    assert results == [(True, True, True)]
    assert (sys.excepthook, threading.excepthook) == before
