"""Elastic training on emulated hosts: ``ddlrun --elastic`` loses hosts and gains them, and the training stays exact.

Three hosts (network namespaces, shaped veths), one rank each. The worker
(workers/worker_elastic.py) sums small integers, so its final weights follow from which
world size ran each step; every test compares them to the bit with what the ``STEP``
lines say happened, which fails if a step was lost beyond the last commit, repeated, or
run from another state. Faults: every process of a host SIGKILLed, a host's link set
down (it runs on, unreachable), a host crashing half-way through writing a commit, a
host lost while the next world starts, too few hosts left, and an error of the program.
The non-elastic behaviour (a lost rank ends the job) is tests/tier2/test_multihost.py's.
Skipped with the reason where namespaces are not permitted (not root, no ``ip``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from emulation.cluster import Cluster, ClusterUnavailable, unavailable_reason
from emulation.elastic_run import kill_host, set_link

WORKER = Path(__file__).parent / "workers" / "worker_elastic.py"
SIZE = 4096  # the worker's vector length
pytestmark = [pytest.mark.mpi, pytest.mark.multihost]
if unavailable_reason():
    pytestmark.append(pytest.mark.skip(reason=str(unavailable_reason())))

# Searched in the whole output: hydra may join two ranks' lines into one.
_STEP = re.compile(r"STEP (\d+) world=(\d+) size=(\d+) rank=(\d+) t=(\d+\.\d{3})")
# Where a line joined by hydra has a second worker line in it.
_SPLIT = re.compile(r"(?=(?:STEP|DONE|WORLD|SAVED|STORE) \w+[ =])")
_DONE = re.compile(r"DONE rank=(\d+) size=(\d+) world=(\d+) step=(\d+) digest=([0-9a-f]{16})")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster(hosts=3, ranks_per_host=1, rate="2gbit")
    try:
        c.up()
    except ClusterUnavailable as exc:
        pytest.skip(str(exc))
    start = time.time()
    try:
        yield c
    finally:
        c.down()
        # Hosts killed on purpose could not remove their store folders (emulated hosts share
        # /dev/shm; on real hosts a crashed host's tmpfs goes with it).
        for folder in Path("/dev/shm").glob("ddl-elastic-*"):
            if folder.stat().st_mtime >= start:
                subprocess.run(["rm", "-rf", str(folder)], check=False)
    assert not c.namespaces


@dataclasses.dataclass
class Run:
    rc: int
    lines: list[str]
    marks: dict[str, float]  # what the test did, and when (unix time)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def steps(self) -> list[tuple[int, int, int, float]]:
        """(step, world, size, t) of rank 0's STEP lines."""
        return [(int(m[1]), int(m[2]), int(m[3]), float(m[5])) for m in _STEP.finditer(self.text) if m[4] == "0"]

    def done(self) -> dict[int, tuple[int, int, str]]:
        return {int(m[1]): (int(m[2]), int(m[4]), m[5]) for m in _DONE.finditer(self.text)}


def elastic_job(cluster: Cluster, hosts: list[str], *flags: str, worker: list[str],
                react: Callable[[str, Run, Path], None], timeout: float = 150, zero: bool = False) -> Run:
    """Run ``ddlrun --elastic`` with a discovery script listing ``hosts``; ``react`` sees every line."""
    assert cluster.workdir is not None
    listing = cluster.workdir / f"hosts-{time.monotonic_ns()}.txt"
    listing.write_text("".join(f"{h}:1\n" for h in hosts))
    discovery = listing.with_suffix(".sh")
    discovery.write_text(f"#!/bin/sh\ncat {listing}\n")
    discovery.chmod(0o755)
    argv = [sys.executable, "-m", "ddl.launcher.cli", "--elastic", "--host-discovery-script", str(discovery),
            "--calibration", "off", *flags, sys.executable, str(ZERO_WORKER if zero else WORKER), *worker]
    job = subprocess.Popen(cluster.launch_argv(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=cluster.env())
    timer = threading.Timer(timeout, job.kill)
    timer.start()
    run = Run(rc=-1, lines=[], marks={})
    try:
        assert job.stdout is not None
        for raw in job.stdout:
            for line in _SPLIT.split(raw.rstrip("\n")):  # one worker line each, as react expects
                if line:
                    run.lines.append(line)
                    react(line, run, listing)
        run.rc = job.wait()
    finally:
        timer.cancel()
        if job.poll() is None:
            job.kill()
            job.wait()
    assert run.rc != -9, f"the job ran past {timeout} s:\n" + run.text[-4000:]
    return run


def expected_digest(run: Run) -> str:
    """The worker's final weights had each step run in the world that last printed it."""
    size_of: dict[int, tuple[int, int]] = {}
    for step, world, size, _ in run.steps():
        if step not in size_of or world >= size_of[step][0]:
            size_of[step] = (world, size)
    weights = np.zeros(SIZE, np.float32)
    for step in sorted(size_of):
        for rank in range(size_of[step][1]):
            weights -= np.random.default_rng((step - 1) * 1000 + rank).integers(-8, 9, SIZE).astype(np.float32)
    return hashlib.sha256(weights.tobytes()).hexdigest()[:16]


def check_exact(run: Run, *, steps: int, ranks: int) -> None:
    done = run.done()
    assert run.rc == 0, run.text[-4000:]
    assert len(done) == ranks and {d for _, _, d in done.values()} == {expected_digest(run)}, (done, run.text[-3000:])
    assert all(step == steps for _, step, _ in done.values()), done


def first_step_after(run: Run, mark: str, world: int) -> tuple[int, float]:
    """(step number, seconds after the mark) of the first step of ``world``."""
    step, _, _, t = next(s for s in run.steps() if s[1] == world)
    return step, t - run.marks[mark]


def check_nothing_left(cluster: Cluster, within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    while True:
        left = {h: [p for p in cluster.pids(h) if any(w.name in _cmdline(p) for w in (WORKER, ZERO_WORKER))]
                for h in cluster.hosts}
        if not any(left.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not any(left.values()), f"processes of the job still run: {left}"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return ""


def test_a_host_lost_by_sigkill_then_listed_again_rejoins(cluster: Cluster) -> None:
    """h3 killed at step 12 (commits every 5): the others run on from step 10 within 10 s; h3, listed
    again, joins at the commit of step 25; every rank ends with exactly the weights that implies."""

    def react(line: str, run: Run, listing: Path) -> None:
        m = _STEP.search(line)
        if m and m[2] == "1" and m[1] == "12" and "kill" not in run.marks:
            listing.write_text("h1:1\nh2:1\n")
            run.marks["kill"] = time.time()
            kill_host(cluster, "h3")
        # Listed again only after commit 20: the next commit (25, where the worker holds) is the only one
        # it can join at, however fast discovery sees it.
        if m and m[2] == "2" and m[1] == "21" and "relist" not in run.marks:
            run.marks["relist"] = time.time()
            listing.write_text("h1:1\nh2:1\nh3:1\n")

    run = elastic_job(cluster, ["h1", "h2", "h3"], "-np", "3", "--min-np", "2", "--max-np", "3", react=react,
                      worker=["--steps", "30", "--join-step", "25", "--step-seconds", "0.2"])
    check_exact(run, steps=30, ranks=3)
    assert "world 1: lost host h3 (its agent's connection closed)" in run.text
    step, seconds = first_step_after(run, "kill", world=2)
    reached = max(s for s, w, _, _ in run.steps() if w == 1)
    internal = sorted(set(re.findall(r"INTERNAL rank=(\d+) world=1 ", run.text)))
    print(f"h3 killed after step {reached}: world 2 ran step {step} {seconds:.2f} s later; "
          f"ranks that saw HorovodInternalError: {internal}")
    assert step == 11 and seconds < 10, (step, seconds)
    assert [(s, size) for s, w, size, _ in run.steps() if w == 3][:1] == [(26, 3)]
    check_nothing_left(cluster)


ZERO_WORKER = Path(__file__).parent / "workers" / "worker_elastic_zero.py"
_SAVED = re.compile(r"SAVED step=(\d+) rank=(\d+) size=(\d+) bytes=(\d+) whole=(\d+)")
_STORE = re.compile(r"STORE step=(\d+) host=(h\d) bytes=(\d+) model=(\d+) whole=(\d+)")
_ZERO_DONE = re.compile(r"DONE rank=(\d+) size=(\d+) world=(\d+) step=(\d+) digest=([0-9a-f]{16}) max_abs_diff=(\S+)")


def test_sharded_optimizer_state_survives_a_lost_host_and_its_return(cluster: Cluster) -> None:
    """ZeRO-1 Adam under TorchState: h3 killed at step 12, relisted after step 21, rejoins at the commit
    of step 25. Every rank ends with the same weights, those of one process over the same 30 global
    batches (<= 1e-6); each rank's saved part is about a third or half of the state, and each
    host's commit one whole copy of it (with the model), never one per rank."""

    def react(line: str, run: Run, listing: Path) -> None:
        m = _STEP.search(line)
        if m and m[2] == "1" and m[1] == "12" and "kill" not in run.marks:
            listing.write_text("h1:1\nh2:1\n")
            run.marks["kill"] = time.time()
            kill_host(cluster, "h3")
        if m and m[2] == "2" and m[1] == "21" and "relist" not in run.marks:
            run.marks["relist"] = time.time()
            listing.write_text("h1:1\nh2:1\nh3:1\n")

    run = elastic_job(cluster, ["h1", "h2", "h3"], "-np", "3", "--min-np", "2", "--max-np", "3", react=react,
                      worker=["--steps", "30", "--join-step", "25", "--step-seconds", "0.2"], zero=True, timeout=240)
    assert run.rc == 0, run.text[-4000:]
    done = {int(m[1]): m for m in _ZERO_DONE.finditer(run.text)}
    assert sorted(done) == [0, 1, 2] and {m[5] for m in done.values()} == {done[0][5]}, run.text[-3000:]
    assert all(m[4] == "30" and m[2] == "3" for m in done.values()), done
    assert float(done[0][6]) <= 1e-6, f"{done[0][6]} from one process"
    sizes = sorted({(int(m[3])) for m in _SAVED.finditer(run.text)})
    assert sizes == [2, 3], sizes  # commits in worlds of 3, 2 and 3 ranks
    for m in _SAVED.finditer(run.text):
        part, whole, size = int(m[4]), int(m[5]), int(m[3])
        assert part <= whole / size + 48 * 64 * 4 * 2 + 64, (m[0], "a rank saved more than its part")
    stores = list(_STORE.finditer(run.text))
    assert {m[2] for m in stores} >= {"h1", "h2", "h3"}, run.text[-3000:]
    for m in stores:
        payload, model_bytes, whole = int(m[3]), int(m[4]), int(m[5])
        assert whole <= payload < model_bytes + 2 * whole, (m[0], "a commit is not one whole copy")
    print(f"sharded elastic run: steps by world {sorted({(w, s) for _, w, s, _ in run.steps()})}; "
          f"commit sizes {sorted({int(m[3]) for m in stores})} bytes for a state of {stores[0][5]} + model "
          f"{stores[0][4]}; max_abs_diff {done[0][6]}")
    check_nothing_left(cluster)


def test_a_new_host_joins_then_its_link_goes_down(cluster: Cluster) -> None:
    """h3, listed only once the job runs, joins at the commit of step 10; two steps later its link goes down (it
    runs on, unreachable, still listed): the others run on exactly, h3's agent ends its own rank, and
    the failed host is not used again while discovery still lists it."""

    def react(line: str, run: Run, listing: Path) -> None:
        m = _STEP.search(line)
        if not m or m[4] != "0":
            return
        if m[2] == "1" and m[1] == "6" and "add" not in run.marks:  # after commit 5: it joins at 10
            run.marks["add"] = time.time()
            listing.write_text("h1:1\nh2:1\nh3:1\n")
        if m[3] == "3":
            run.marks["steps on 3"] = run.marks.get("steps on 3", 0) + 1
            if run.marks["steps on 3"] == 2:
                run.marks["cut"] = time.time()
                run.marks["cut world"] = int(m[2])
                set_link(cluster, "h3", up=False)

    try:
        run = elastic_job(cluster, ["h1", "h2"], "-np", "2", "--min-np", "2", "--max-np", "3",
                          "--elastic-timeout", "3", react=react,
                          worker=["--steps", "30", "--join-step", "10", "--step-seconds", "0.2"])
    finally:
        set_link(cluster, "h3", up=True)
    check_exact(run, steps=30, ranks=2)
    assert "cut" in run.marks, "h3 never joined: " + run.text[-3000:]
    joined, after = int(run.marks["cut world"]), int(run.marks["cut world"]) + 1
    assert joined == 2 and [s for s, w, _, _ in run.steps() if w == 2][0] == 11, run.steps()
    step, seconds = first_step_after(run, "cut", world=after)
    reached = max(s for s, w, _, _ in run.steps() if w == joined)
    internal = sorted(set(re.findall(rf"INTERNAL rank=(\d+) world={joined} ", run.text)))
    print(f"h3 joined in world {joined}; its link went down after step {reached}: world {after} ran step {step} "
          f"{seconds:.2f} s later; ranks whose collective raised HorovodInternalError: {internal}")
    assert reached - 5 <= step - 1 <= reached and seconds < 10, (step, reached, seconds)
    # The survivors were waiting for h3 in a collective when ddlrun ended the world: it raised.
    assert internal, "no survivor's collective raised HorovodInternalError: " + run.text[-3000:]
    assert f"world {joined}: lost host h3" in run.text
    assert all(size == 2 for _, w, size, _ in run.steps() if w >= after), "h3 failed: it must not return while listed"
    check_nothing_left(cluster)


@contextlib.contextmanager
def load_average_at_least(target: float, *, spinners: int = 16, within: float = 150.0) -> Iterator[list[float]]:
    """Busy loops (at normal priority, like any job sharing the machine) until the 1-minute load
    average reaches ``target``; they run on inside the block. Yields a list the caller appends
    load averages to; the loops end on leaving."""
    loops = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(spinners)]
    try:
        deadline = time.monotonic() + within
        while os.getloadavg()[0] < target:
            assert time.monotonic() < deadline, f"load average {os.getloadavg()[0]:.1f} < {target} after {within:g} s"
            time.sleep(1)
        yield [os.getloadavg()[0]]
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


_STARTED = re.compile(r"ddlrun: elastic \[\s*([\d.]+) s\] job \w+ started at unix time ([\d.]+)")
_LOG_AT = r"ddlrun: elastic \[\s*([\d.]+) s\] "


def logged_at(run: Run, text: str) -> float:
    """The unix time at which ddlrun logged the first line containing ``text`` (ddlrun's own clock)."""
    started = _STARTED.search(run.text)
    found = re.search(_LOG_AT + ".*" + re.escape(text), run.text)
    assert started and found, f"no ddlrun line with {text!r}:\n" + run.text[-3000:]
    return float(started[2]) + float(found[1]) - float(started[1])


def test_a_silent_host_is_lost_within_2_s_and_the_job_recovers_within_10_s_at_load_8(cluster: Cluster) -> None:
    """Default --elastic-timeout, 1-minute load average >= 8 on this 2-core machine: h3's link goes
    down at step 20 (it runs on, unreachable). Its missed heartbeats declare it lost within 2 s;
    the others resume within 10 s of the cut; no other host is ever declared lost (no false alarm
    over the 20 steps before the cut nor after it); the weights are exact."""

    def react(line: str, run: Run, listing: Path) -> None:
        m = _STEP.search(line)
        if m and m[2] == "1" and m[1] == "20" and "cut" not in run.marks:
            run.marks["cut"] = time.time()
            run.marks["load at cut"] = os.getloadavg()[0]
            set_link(cluster, "h3", up=False)

    try:
        with load_average_at_least(8.0) as loads:
            run = elastic_job(cluster, ["h1", "h2", "h3"], "-np", "3", "--min-np", "2", "--max-np", "3",
                              react=react, worker=["--steps", "30", "--step-seconds", "0.2"], timeout=240)
            loads.append(os.getloadavg()[0])
    finally:
        set_link(cluster, "h3", up=True)
    check_exact(run, steps=30, ranks=2)
    assert "cut" in run.marks, run.text[-3000:]
    detected = logged_at(run, "lost host h3") - run.marks["cut"]
    step, recovered = first_step_after(run, "cut", world=2)
    print(f"load average {loads[0]:.1f} at the start, {run.marks['load at cut']:.1f} at the cut, {loads[-1]:.1f} at "
          f"the end: h3 declared lost {detected:.2f} s after its link went down, world 2 ran step {step} "
          f"{recovered:.2f} s after it")
    assert min(loads[0], run.marks["load at cut"]) >= 8.0, (loads, run.marks)
    assert re.findall(r"lost host (h\d)", run.text) == ["h3"], "a false alarm: " + run.text[-3000:]
    assert "missed 6 heartbeats" in run.text
    assert not any(w == 2 for _, w, _, t in run.steps() if t < run.marks["cut"]), "world 1 ended before the cut"
    assert detected <= 2.0 and recovered <= 10.0, (detected, recovered)
    check_nothing_left(cluster)


def test_fewer_than_min_np_left_ends_every_rank(cluster: Cluster) -> None:
    def react(line: str, run: Run, listing: Path) -> None:
        m = _STEP.search(line)
        if m and m[1] == "8" and "kill" not in run.marks:
            run.marks["kill"] = time.time()
            kill_host(cluster, "h3")

    run = elastic_job(cluster, ["h1", "h2", "h3"], "--min-np", "3", "--max-np", "3", react=react,
                      worker=["--steps", "200"])
    ended = time.time() - run.marks["kill"]
    print(f"job ended {ended:.1f} s after h3 was killed with --min-np 3")
    assert run.rc == 1, run.text[-3000:]
    assert "ddlrun: error: elastic:" in run.text and "--min-np is 3" in run.text, run.text[-3000:]
    assert ended < 10
    check_nothing_left(cluster)


def test_a_host_crashing_inside_a_commit_then_another_during_recovery(cluster: Cluster) -> None:
    """h3 crashes half-way through writing commit 10; while world 2 starts, h2 is killed too: world 3
    runs on h1 alone (--min-np 1) from the newest whole commit, and ends exact."""

    def react(line: str, run: Run, listing: Path) -> None:
        if "world 2: starting" in line and "kill" not in run.marks:
            run.marks["kill"] = time.time()
            kill_host(cluster, "h2")

    run = elastic_job(cluster, ["h1", "h2", "h3"], "-np", "3", "--min-np", "1", "--max-np", "3", react=react,
                      worker=["--steps", "20", "--die-in-commit", "10", "--die-on", "h3"])
    check_exact(run, steps=20, ranks=1)
    assert "CRASH host=h3 inside commit 2" in run.text, run.text[-3000:]
    worlds = sorted({w for _, w, _, _ in run.steps()})
    assert worlds[0] == 1 and worlds[-1] >= 3 and "lost host h2" in run.text, run.text[-3000:]
    last = [s for s in run.steps() if s[1] == worlds[-1]]
    # From commit 10 if h1 finished writing it before the world was stopped (it nearly always
    # does: h3 crashed in its own write), else from commit 5; never from h3's half-written one.
    print(f"world {worlds[-1]} on h1 alone resumed at step {last[0][0]}")
    assert last[0][0] in (6, 11) and last[0][2] == 1, last[:2]
    check_nothing_left(cluster)


def test_horovod_internal_error_raised_by_the_program_on_one_rank_resumes_without_a_stall(cluster: Cluster) -> None:
    """Rank 0 raises HorovodInternalError at step 12 (commits every 5): it restores and leaves at once,
    ddlrun stops the others (who wait for it in a collective), and the next world resumes from
    step 10 in seconds, not after the 60 s stall timeout; the run stays exact."""

    def react(line: str, run: Run, listing: Path) -> None:
        if line.startswith("RAISE HorovodInternalError") and "raise" not in run.marks:
            run.marks["raise"] = time.time()

    run = elastic_job(cluster, ["h1", "h2", "h3"], "-np", "3", "--min-np", "2", "--max-np", "3", react=react,
                      worker=["--steps", "20", "--internal-error-step", "12", "--step-seconds", "0.1"])
    check_exact(run, steps=20, ranks=3)
    assert "left after a failed collective (HorovodInternalError)" in run.text, run.text[-3000:]
    step, seconds = first_step_after(run, "raise", world=2)
    print(f"HorovodInternalError at step 12: world 2 ran step {step} {seconds:.2f} s later")
    assert step == 11 and seconds < 10, (step, seconds)
    check_nothing_left(cluster)


def test_an_error_of_the_program_ends_the_job(cluster: Cluster) -> None:
    start = time.time()
    # -np 2: the first world waits for both hosts (with --min-np 1 alone, a host whose agent
    # came up late joined in a world 2 before the error, a scale-up this test is not about).
    run = elastic_job(cluster, ["h1", "h2"], "-np", "2", "--min-np", "1", "--max-np", "2",
                      react=lambda line, run, listing: None, worker=["--steps", "30", "--fail-step", "7"])
    assert run.rc == 1, run.text[-3000:]
    assert "ValueError: an error of the program at step 7" in run.text
    assert "an error of the program, not a lost host; ending the job" in run.text
    assert "world 2" not in run.text, "an error of the program must not start another world:\n" + run.text[-4000:]
    print(f"job ended {time.time() - start:.1f} s after it started")
    check_nothing_left(cluster)
    assert not any(p.name.startswith("ddl-elastic-") for p in Path("/dev/shm").iterdir()
                   if p.stat().st_mtime >= start), "the agents left their store folders behind"
