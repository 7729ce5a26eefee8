"""Elastic training while the host discovery script misbehaves: the job trains on, exactly, and ddlrun says what happened.

One job on this host (``localhost:2``, no root needed) whose discovery script answers,
then takes 6 s, then fails, then prints garbage around its list, then hangs (killed at
``--discovery-timeout 8``), then answers again (:mod:`emulation.discovery_cases`). Before
issue 39 the 6-s run alone held ddlrun's loop past the agents' 5-s fence and the job
failed. The longer cases (30 s, a hang at the default 60 s) are measured by
``python -m emulation.discovery_cases``.
"""

from __future__ import annotations

import pytest

from emulation.discovery_cases import run_case

pytestmark = [pytest.mark.mpi]


def test_a_slow_failing_garbage_and_hanging_discovery_never_disturbs_the_training() -> None:
    result = run_case("every case", ["slow 6", "fail", "garbage", "hang"], discovery_timeout=8.0)
    text = result.output[-4000:]
    print(f"{result.seconds:.1f} s, {result.steps} steps, worlds {result.worlds}, replay diff {result.replay_diff}; "
          f"ddlrun said: {result.lines}")
    assert result.rc == 0 and result.tracebacks == 0, text
    assert result.worlds == 1, "a discovery problem ended a world:\n" + text
    assert result.identical and result.replay_diff is not None and result.replay_diff <= 1e-6, text
    said = "\n".join(result.lines)
    assert "host discovery took 6." in said, said
    assert "exited with status 1 (the discovery API answered 503); keeping the last list" in said, said
    assert "skipped: " in said and "'<html><body>503 Service Unavailable</body></html>'" in said, said
    assert "'localhost:two'" in said, said
    assert "did not finish in 8 s (--discovery-timeout); killed" in said, said
    assert "host discovery works again after" in said, said
