"""Elastic jobs on this host alone (no root): a misbehaving discovery script, and ranks that leave.

Discovery: one job on this host (``localhost:2``, no root needed) whose discovery script answers,
then takes 6 s, then fails, then prints garbage around its list, then hangs (killed at
``--discovery-timeout 8``), then answers again (:mod:`emulation.discovery_cases`). Before
issue 39 the 6-s run alone held ddlrun's loop past the agents' 5-s fence and the job
failed. The longer cases (30 s, a hang at the default 60 s) are measured by
``python -m emulation.discovery_cases``.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

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


LEAVER = """
import os, sys
import numpy as np
import ddl
from ddl.runtime import elastic

mode = sys.argv[1]
if mode == "before-init" and os.environ.get("PMI_RANK") == "1":
    sys.exit(3)  # a config file missing on one host
ddl.init()
state = elastic.ObjectState(step=0)


@elastic.run
def train(state):
    while state.step < 100000:
        ddl.allreduce(np.ones(4), name="x")
        state.step += 1
        if mode == "mid-step" and ddl.rank() == 1 and state.step == 7:
            sys.exit(0)
        if state.step % 5 == 0:
            state.commit()


train(state)
"""


@pytest.mark.parametrize("mode", ["before-init", "mid-step"])
def test_a_rank_that_leaves_is_a_lost_rank_never_a_hang(tmp_path: Path, mode: str) -> None:
    """Rank 1 exits before its init (status 3) or with sys.exit(0) mid-step, while rank 0 waits for it:
    it is a lost rank, its host (the only one here) is left out, and with fewer than --min-np left
    the job ends at once, saying so. Before issue 39 the mid-step case waited in ddl's shutdown for the
    stall timeout (60 s)."""
    script = tmp_path / "leaver.py"
    script.write_text(LEAVER)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "ddl.launcher.cli", "--elastic", "-np", "2", "--min-np", "1",
                           "--calibration", "off", sys.executable, str(script), mode],
                          capture_output=True, text=True, timeout=120)
    seconds = time.monotonic() - start
    text = proc.stdout + proc.stderr
    print(f"{mode}: rc {proc.returncode} after {seconds:.1f} s")
    code = 3 if mode == "before-init" else 0
    assert f"lost host localhost (rank 1 exited with status {code} before it finished (a lost rank))" in text, text
    assert proc.returncode == 1 and "ddlrun: error: elastic:" in text and "--min-np is 1" in text, text
    assert seconds < 30, f"{seconds:.1f} s: a leaving rank must not be waited for"
    assert "Traceback" not in text, text
