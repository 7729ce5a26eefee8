"""More ranks than 16 on one host: the engine's 128-byte records and their blocking gather."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from ddl.base.cpus import available_cpus

WORKERS = Path(__file__).parent / "workers"


def test_seventeen_ranks_ride_small_calls_in_128_byte_records() -> None:
    env = {**os.environ, "MPIR_CVAR_ENABLE_HEAVY_YIELD": "1"}
    done = subprocess.run([sys.executable, "-m", "ddl.launcher.cli", "-np", "17", sys.executable,
                           str(WORKERS / "worker_many_ranks.py")], capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = re.findall(r"RANK (\d+) ok=(\w+) inline=(\d+) record=(\d+) blocks=(\w+)", done.stdout)
    assert sorted(int(r) for r, *_ in lines) == list(range(17)), done.stdout[-3000:]
    blocks = available_cpus() < 17  # ranks outnumber the cores this job may use (as init reads them)
    assert {tuple(rest) for _, *rest in lines} == {("True", "88", "128", str(blocks))}
