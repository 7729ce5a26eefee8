"""Process sets in a world of one: the names their calls meet by start again with each ``init``."""

from __future__ import annotations

from typing import Any

import pytest

import ddl
from ddl.engine.collectives import Collectives


def test_process_set_calls_are_counted_afresh_after_shutdown(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every rank names its n-th add/remove ``ddl.add_process_set.n``; a count kept across
    ``shutdown`` would name the first call of the next world otherwise than a rank that
    starts afresh (a new process joining an elastic world), and they would never meet."""
    names: list[str] = []
    real = Collectives._call

    def recording(self: Collectives, kind: str, name: str, *args: Any, **kwargs: Any) -> Any:
        if kind == "process_set":
            names.append(name)
        return real(self, kind, name, *args, **kwargs)

    monkeypatch.setattr(Collectives, "_call", recording)
    ddl.shutdown()
    ddl.init()
    first = ddl.add_process_set([0])
    ddl.remove_process_set(first)
    ddl.shutdown()
    ddl.init()
    again = ddl.add_process_set([0])
    assert again.process_set_id == 1
    assert names == ["ddl.add_process_set.1", "ddl.remove_process_set.2", "ddl.add_process_set.1"]
