"""The watcher ``ddl.init`` forks where no keeper watches a rank: a bounded wait, then clean-up.

Real processes stand in for ranks: one that never gets past "MPI_Init" is ended at the
timeout with a message; one that dies (killed) after it leaves no ``/dev/shm`` file it
mapped; one that lives on keeps its files.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

RANK = textwrap.dedent("""
    import mmap, os, sys, time
    from ddl.runtime import rank_watch
    f = open(sys.argv[1], "w+b"); f.truncate(4096); m = mmap.mmap(f.fileno(), 4096)
    watch = rank_watch.start(timeout=float(sys.argv[2]), rank=1, size=2, host="h2")
    if sys.argv[3] != "hang":
        watch.started()   # MPI is up
    print("up", flush=True)
    if sys.argv[3] == "die":
        os.kill(os.getpid(), 9)
    time.sleep(60)
""")


def _rank(segment: Path, timeout: float, how: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", RANK, str(segment), str(timeout), how], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "up\n"
    return proc


def _gone(path: Path, within: float) -> bool:
    deadline = time.monotonic() + within
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not path.exists()


def test_a_rank_stuck_waiting_for_the_world_is_ended_at_the_timeout_with_a_message() -> None:
    segment = Path(f"/dev/shm/ddl-watch-test-{os.getpid()}-hang")
    try:
        start = time.monotonic()
        proc = _rank(segment, 1.0, "hang")
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - start
        assert proc.returncode == -signal.SIGTERM
        assert 1.0 <= took < 6.0, took
        assert "rank 1 of 2 (host h2): the other ranks did not all start MPI within 1 s" in err, err
        assert _gone(segment, 5.0)  # what it had mapped went with it
    finally:
        segment.unlink(missing_ok=True)


def test_a_rank_killed_after_init_leaves_no_shared_memory_and_a_live_one_keeps_its_own() -> None:
    dead = Path(f"/dev/shm/ddl-watch-test-{os.getpid()}-dead")
    alive = Path(f"/dev/shm/ddl-watch-test-{os.getpid()}-alive")
    try:
        living = _rank(alive, 0.5, "live")
        proc = _rank(dead, 0.5, "die")
        proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL
        assert _gone(dead, 10.0), "the killed rank's segment is still there"
        time.sleep(1.0)  # well past its init timeout: a rank that started MPI is never ended
        assert living.poll() is None and alive.exists()
        living.kill()
        living.wait(timeout=30)
        assert _gone(alive, 10.0)
    finally:
        dead.unlink(missing_ok=True)
        alive.unlink(missing_ok=True)
