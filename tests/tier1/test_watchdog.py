"""The stall watchdog measures each wait from when the name went missing this time."""

from __future__ import annotations

from typing import NoReturn

import pytest

from ddl.engine.watchdog import StallWatch


class Aborted(Exception):
    pass


def _abort(code: int) -> NoReturn:
    raise Aborted(code)


def test_a_reused_name_that_ran_starts_a_new_clock(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    watch = StallWatch(rank=0, size=2, timeout=60.0, abort=_abort)
    watch.missing("grads.0", [0], now=0.0)  # step 1: rank 1 a moment late
    watch.done(["grads.0"])  # ... then both ran it (on the fast path, no match)
    watch.missing("grads.0", [0], now=100.0)  # step 500: late again, briefly
    assert capsys.readouterr().err == ""  # not "missing for 100 s", and no abort
    with pytest.raises(Aborted):
        watch.missing("grads.0", [0], now=161.0)  # a real stall still ends the job


def test_done_without_missing_names_is_a_no_op() -> None:
    watch = StallWatch(rank=0, size=2, timeout=60.0, abort=_abort)
    watch.done(["x", "y"])
    watch.missing("x", [1], now=5.0)
    with pytest.raises(Aborted):
        watch.missing("x", [1], now=65.0)
