"""A process set's waits are bounded as the world's are."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

WORKERS = Path(__file__).parent / "workers"


def test_a_process_set_waits_with_the_worlds_stall_limit() -> None:
    env = {**os.environ, "DDL_STALL_TIMEOUT": "7"}
    done = subprocess.run([sys.executable, "-m", "ddl.launcher.cli", "-np", "3", sys.executable,
                           str(WORKERS / "worker_set_waits.py")], capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = re.findall(r"SET rank=(\d) sum=(\S+) limit=(\S+)/(\S+) poll=(\w+)/(\w+) busy=(\S+)/(\S+) blocks=(\w+) "
                       r"remote=(\S+)", done.stdout)
    assert sorted(line[0] for line in lines) == ["0", "2"], done.stdout[-3000:]
    for _, total, limit, world_limit, poll, world_poll, busy, world_busy, blocks, remote in lines:
        assert total == "2"  # ranks 0 and 2 only
        assert limit == world_limit == "7" and poll == world_poll and busy == world_busy
        assert blocks == "False" and remote == "[]"  # two members on one host
