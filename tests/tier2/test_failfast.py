"""Fail fast and together: a rank that fails in any of the ways real jobs fail ends the job at once.

Under ``ddlrun -np 2`` (each rank under its keeper) every case ends within seconds of the
failure, with the failing rank's own status and a report naming it and its host; under
a plain ``mpiexec -n 2`` every case but a failure before ``init`` does too (that one is
bounded by ``DDL_INIT_TIMEOUT``). Where this runs as root, each job gets a ``/dev/shm``
of its own (a mount namespace) and a temp dir of its own, and must leave both empty:
MPICH's segments of killed and aborted ranks included.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

WORKERS = Path(__file__).parent / "workers"
MPIEXEC = Path(sys.executable).parent / "mpiexec"
PRIVATE_SHM = os.geteuid() == 0 and shutil.which("unshare") is not None
pytestmark = pytest.mark.mpi

# The job runs in its own /dev/shm; after it, wait (up to 5 s: a plain mpiexec's ranks are
# cleaned up after by watchers that outlive them) for it to empty, then say what is left.
_SHELL = ('mount -t tmpfs -o size=256m ddl-test-shm /dev/shm || exit 97; "$@"; rc=$?; '
          'for i in $(seq 50); do [ -z "$(ls -A /dev/shm)" ] && break; sleep 0.1; done; '
          'echo "LEFT IN SHM: $(ls -A /dev/shm | tr "\\n" " ")" >&2; exit $rc')


def launch(argv: list[str], tmp: Path, *, env: dict[str, str] | None = None, timeout: float = 90,
           ) -> tuple[subprocess.CompletedProcess[str], float, list[str]]:
    """Run ``argv`` in a /dev/shm and TMPDIR of its own; (result, seconds, files left behind)."""
    tmpdir = tmp / "tmpdir"
    tmpdir.mkdir(exist_ok=True)
    full = ["unshare", "-m", "sh", "-c", _SHELL, "sh", *argv] if PRIVATE_SHM else argv
    start = time.monotonic()
    done = subprocess.run(full, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "TMPDIR": str(tmpdir), **(env or {})})
    took = time.monotonic() - start
    left = [f"tmp:{p.name}" for p in tmpdir.iterdir()]
    found = re.search(r"LEFT IN SHM: (.*)", done.stderr)
    if found:
        left += [f"shm:{name}" for name in found.group(1).split()]
    return done, took, left


def since_failure(done: subprocess.CompletedProcess[str], ended: float) -> float:
    marks = [float(t) for t in re.findall(r"T0 (\d+\.\d{3})", done.stdout)]
    assert marks, done.stdout[-2000:] + done.stderr[-2000:]
    return ended - min(marks)


def ddlrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "ddl.launcher.cli", *args]


#: case -> (status, the first line of ddlrun's report, extra environment)
DDLRUN_CASES = {
    "before-init": (1, r"rank 1 \(host \S+\) exited with status 1 before ddl.init$", {}),
    "exit-3": (3, r"rank 1 \(host \S+\) exited with status 3 after ddl.shutdown$", {}),
    "import-error": (1, r"rank 1 \(host \S+\) exited with status 1 after ddl.shutdown; it raised "
                        r"ModuleNotFoundError: No module named 'not_a_module_anywhere'$", {}),
    "sigkill": (137, r"rank 1 \(host \S+\) was killed by signal 9 \(SIGKILL\) after ddl.init$", {}),
    "skip-step": (1, r"rank 0 \(host \S+\) exited with status 1 after ddl.shutdown; it raised RankLeftError: "
                     r"rank 1 \(host \S+\) left: its program is ending", {}),
    # Any rank's stall watch may end it first (rank 1's engine sees rank 0 waiting too).
    "stall": (1, r"rank [01] \(host \S+\) aborted the job with error code 1 after ddl.init$", {"DDL_STALL_TIMEOUT": "2"}),
    "exit-0-before-init": (1, r"rank 1 \(host \S+\) exited with status 0 before ddl.init$", {}),
    # A stopped rank never answers: rank 0's wait in the negotiation ends at the stall timeout.
    "freeze": (1, r"rank 0 \(host \S+\) aborted the job with error code 1 after ddl.init$", {"DDL_STALL_TIMEOUT": "2"}),
    "os-exit-0": (1, r"rank 1 \(host \S+\) exited with status 0 after ddl.init$", {}),
    # MPI_Abort returns at once; the launcher kills the rank a moment later (it may be in shutdown by then).
    "mpi-abort": (4, r"rank 1 \(host \S+\) aborted the job with error code 4 (after ddl.init|in ddl.shutdown)$", {}),
}


@pytest.mark.parametrize("case", sorted(DDLRUN_CASES))
def test_under_ddlrun_every_failure_ends_the_job_at_once_with_the_ranks_own_status(case: str, tmp_path: Path) -> None:
    status, first, env = DDLRUN_CASES[case]
    done, _, left = launch(ddlrun("-np", "2", sys.executable, str(WORKERS / "worker_failfast.py"), case), tmp_path,
                           env=env)
    ended = time.time()
    report = [line.removeprefix("ddlrun: ") for line in done.stderr.splitlines() if line.startswith("ddlrun: ")]
    assert done.returncode == status, (done.returncode, done.stderr[-3000:])
    assert report and re.match(first, report[0]), report
    assert f"exit status {status}" in report[-1], report
    assert "DONE rank 0" not in done.stdout, done.stdout  # rank 0 never carried on as if nothing happened
    bound = 5.0 + (2.0 if case in ("stall", "freeze") else 0.0)  # a stall ends at its timeout (2 s here)
    assert since_failure(done, ended) < bound
    if case == "freeze":
        assert "StalledWaitError: rank 0 waited 2 s for the other ranks' negotiation records" in done.stderr
        assert "collective ('grad')" in done.stderr, done.stderr[-2000:]  # the call it was in
    assert "BAD TERMINATION" not in done.stdout + done.stderr  # ddlrun said it better
    assert left == [], left


@pytest.mark.skipif(not MPIEXEC.exists(), reason="needs the pip MPICH's mpiexec")
@pytest.mark.parametrize(("case", "status"), [("exit-3", 3), ("import-error", 1), ("sigkill", 9), ("skip-step", 1)])
def test_under_a_plain_mpiexec_every_failure_after_init_ends_the_job_at_once(case: str, status: int,
                                                                            tmp_path: Path) -> None:
    done, _, left = launch([str(MPIEXEC), "-n", "2", sys.executable, str(WORKERS / "worker_failfast.py"), case],
                           tmp_path, env={"MPIR_CVAR_ENABLE_HEAVY_YIELD": "1"})
    ended = time.time()
    assert done.returncode == status, (done.returncode, done.stderr[-3000:])
    assert since_failure(done, ended) < 5.0
    if case in ("exit-3", "skip-step"):
        assert "RankLeftError: rank 1 (host" in done.stderr, done.stderr[-3000:]
    assert left == [], left  # the watchers forked at init removed what the killed ranks left


@pytest.mark.skipif(not MPIEXEC.exists(), reason="needs the pip MPICH's mpiexec")
def test_under_a_plain_mpiexec_a_frozen_rank_ends_the_job_at_the_stall_timeout(tmp_path: Path) -> None:
    """SIGSTOP keeps a rank's sockets open and its shared memory mapped: nothing tells the
    others it is gone, so the bound is the stall timeout, then the job is aborted."""
    done, _, left = launch([str(MPIEXEC), "-n", "2", sys.executable, str(WORKERS / "worker_failfast.py"), "freeze"],
                           tmp_path, env={"MPIR_CVAR_ENABLE_HEAVY_YIELD": "1", "DDL_STALL_TIMEOUT": "2"})
    ended = time.time()
    assert done.returncode != 0
    assert "StalledWaitError: rank 0 waited 2 s" in done.stderr, done.stderr[-3000:]
    assert 2.0 <= since_failure(done, ended) < 2.0 + 5.0
    assert left == [], left


@pytest.mark.skipif(not MPIEXEC.exists(), reason="needs the pip MPICH's mpiexec")
@pytest.mark.parametrize(("wait", "what"), [
    ("allreduce", "the other ranks in MPI's allreduce"), ("negotiation", "the other ranks' negotiation records"),
    ("sendrecv", "a message of rank 1"), ("broadcast", "rank 1's broadcast"),
])
def test_each_wait_ddl_polls_leaves_at_the_stall_limit(wait: str, what: str, tmp_path: Path) -> None:
    """MPI's own allreduce and broadcast (started nonblocking where ranks have cores), the
    compact negotiation's, and a message from another host: rank 1 comes 4 s late, rank 0
    leaves after its 1 s limit, naming the wait."""
    argv = [str(MPIEXEC), "-n", "2", sys.executable, str(WORKERS / "worker_stalled_wait.py"), wait]
    # No ddl.init here, so no watcher removes MPICH's segments of the aborted ranks: the job
    # gets a /dev/shm of its own, which goes with it (launch() would wait for it to empty).
    if PRIVATE_SHM:
        argv = ["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o size=64m ddl-test-shm /dev/shm || exit 97; "$@"',
                "sh", *argv]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    assert re.search(rf"STALLED after 1\.\d s: rank 0 waited 1 s for {re.escape(what)}", done.stdout), done.stdout
    assert "DONE" not in done.stdout


@pytest.mark.skipif(not MPIEXEC.exists(), reason="needs the pip MPICH's mpiexec")
def test_under_a_plain_mpiexec_a_failure_before_init_is_bounded_by_the_init_timeout(tmp_path: Path) -> None:
    done, _, left = launch([str(MPIEXEC), "-n", "2", sys.executable, str(WORKERS / "worker_failfast.py"),
                            "before-init"], tmp_path, env={"DDL_INIT_TIMEOUT": "3"})
    ended = time.time()
    assert done.returncode != 0
    assert "rank 0 of 2 (host" in done.stderr and "did not all start MPI within 3 s" in done.stderr, done.stderr
    assert 3.0 <= since_failure(done, ended) < 3.0 + 5.0
    assert left == [], left


def test_ddlrun_stopped_by_timeout_ends_every_rank_and_leaves_nothing(tmp_path: Path) -> None:
    for signal_name, took_at_most in (("TERM", 15.0), ("KILL", 15.0)):
        done, took, left = launch(["timeout", "-s", signal_name, "6", *ddlrun("-np", "2", sys.executable,
                                   str(WORKERS / "worker_failfast.py"), "stall")], tmp_path,
                                  env={"STALL_SECONDS": "600"})
        assert done.returncode in (124, 137), (signal_name, done.returncode, done.stderr[-2000:])
        assert took < took_at_most, took
        assert left == [], (signal_name, left)


def test_output_is_tagged_by_rank_never_merged_and_filed_per_rank(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    done = subprocess.run(ddlrun("-np", "2", "--log-dir", str(logs), sys.executable, "-u",
                                 str(WORKERS / "worker_output.py")), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 600 and all(re.fullmatch(r"\[(\d)\]<stdout>:rank \1 line \d+ end", x) for x in lines), lines
    assert sum(bool(re.fullmatch(r"\[(\d)\]<stderr>:rank \1 note \d+", x)) for x in done.stderr.splitlines()) == 12
    for r in (0, 1):
        filed = (logs / f"rank.{r}" / "stdout").read_text().splitlines()
        assert filed == [f"rank {r} line {i} end" for i in range(300)]
        assert len((logs / f"rank.{r}" / "stderr").read_text().splitlines()) == 6
    plain = subprocess.run(ddlrun("-np", "2", "--no-tag-output", sys.executable, "-u", str(WORKERS / "worker_output.py")),
                           capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0 and sorted(plain.stdout.splitlines()) == sorted(x.split(":", 1)[1] for x in lines)


def test_two_entries_for_this_machine_run_as_one_host() -> None:
    done = subprocess.run(ddlrun("-np", "2", "-H", "localhost:1,127.0.0.1:1", sys.executable,
                                 str(WORKERS / "worker_topology.py")), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "hosts localhost, 127.0.0.1 are this machine" in done.stderr
    assert len(re.findall(r"RANK \d dims=2 local=\d/2 cross=0/1", done.stdout)) == 2, done.stdout
