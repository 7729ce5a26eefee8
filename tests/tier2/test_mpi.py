"""Tier 2: worker modules under a real mpiexec at 1-4 ranks, each run with a timeout."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddl.base.cpus import available_cpus

WORKERS = Path(__file__).parent / "workers"
pytestmark = pytest.mark.mpi


def ddlrun(np_: int, script: str, *extra: str, timeout: float = 120, env: dict[str, str] | None = None):
    cmd = [sys.executable, "-m", "ddl.launcher.cli", "-np", str(np_), *extra, sys.executable, str(WORKERS / script)]
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    return proc, time.monotonic() - start


@pytest.mark.parametrize(
    ("np_", "topology", "shm_bytes"),
    # A 64 KiB shared slot makes shm cut the 1 MiB sums into pieces; one host throughout,
    # so shm runs wherever dims[0] > 1 (1x4 and one rank: it must be refused).
    [(1, None, None), (2, None, None), (3, None, "65536"), (4, "4", None), (4, "2x2", "65536"), (4, "1x4", None)],
)
def test_collectives_under_mpiexec(np_: int, topology: str | None, shm_bytes: str | None) -> None:
    extra = ["--topology", topology] if topology else []
    proc, _ = ddlrun(np_, "worker_collectives.py", *extra, env={"DDL_SHM_BYTES": shm_bytes} if shm_bytes else None)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # Ranks share one stdout, so lines may interleave: count the markers instead.
    passed = re.findall(r"PASS rank \d+/\d+ topology (\S+?) shm (\w+) local", proc.stdout)
    assert len(passed) == np_, proc.stdout
    if topology:
        assert all(t == topology for t, _ in passed), passed
    want = "refused" if np_ == 1 or (topology or "").startswith("1x") else "ran"
    assert all(s == want for _, s in passed), passed


def test_exception_on_one_rank_aborts_the_job_quickly() -> None:
    proc, _ = ddlrun(3, "worker_abort.py", timeout=60)
    ended = time.time()
    assert proc.returncode != 0
    assert "boom from rank 1" in proc.stderr
    assert "UNREACHABLE" not in proc.stdout
    assert _since_mark(proc, ended) < 10


def test_topology_spec_that_does_not_fit_fails_at_once() -> None:
    proc, elapsed = ddlrun(4, "worker_topology.py", "--topology", "3x2", timeout=30)
    assert proc.returncode != 0
    assert "3x2" in proc.stderr and "6" in proc.stderr and "4" in proc.stderr
    assert elapsed < 10


def test_bad_topology_from_environment_raises_at_init() -> None:
    proc, _ = ddlrun(2, "worker_topology.py", env={"DDL_TOPOLOGY": "3"}, timeout=60)
    assert proc.returncode != 0
    assert "TopologyError" in proc.stderr and "world size is 2" in proc.stderr


def test_hosts_are_discovered_from_host_names() -> None:
    # Two fake hosts of two ranks each, in round-robin placement: ranks 0,2 on a, 1,3 on b.
    mpiexec = Path(sys.executable).parent / "mpiexec"
    if not mpiexec.exists():
        pytest.skip("needs the pip MPICH's mpiexec for per-rank environments")
    cmd = [str(mpiexec)]
    for r in range(4):
        if r:
            cmd.append(":")
        cmd += ["-n", "1", "-env", "DDL_HOSTNAME", "ab"[r % 2], "-env", "MPIR_CVAR_ENABLE_HEAVY_YIELD", "1",
                sys.executable, str(WORKERS / "worker_topology.py")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = sorted(m for m in re.findall(r"RANK \d .*?host=\S+?(?=RANK|\n|$)", proc.stdout))
    assert len(lines) == 4
    for line in lines:
        assert "dims=2x2" in line and "/2" in line.split("local=")[1]
    assert "RANK 2 dims=2x2 local=1/2 cross=0/2 coords=(1, 0)" in lines[2], lines
    assert "RANK 1 dims=2x2 local=0/2 cross=1/2 coords=(0, 1)" in lines[1], lines


@pytest.mark.parametrize("np_", [2, 4])
def test_engine_under_mpiexec(np_: int, tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    proc, _ = ddlrun(np_, "worker_engine.py", "--timeline", str(trace), timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("PASS engine") == np_
    import json

    events = json.loads(trace.read_text())["traceEvents"]
    rows = {e["args"]["name"] for e in events if e["ph"] == "M"}
    assert {"a", "big", "g0", "g255"} <= rows
    by_name = {}
    for e in events:
        by_name.setdefault(e["name"], []).append(e)
    assert "queued" in by_name and "fused" in by_name and "done" in by_name
    fused = [e for e in by_name["fused"] if e.get("args", {}).get("tensors", 0) > 1]
    assert fused, "no fused buffer in the trace"
    assert all(e["args"]["bytes"] > 0 and e["args"]["algorithm"] for e in fused)
    phases = [n for n in by_name if "reduce-scatter" in n or "halving" in n or n in ("mpi allreduce", "shm allreduce")]
    assert phases, sorted(by_name)
    assert all(e["dur"] >= 0 for e in events if e["ph"] == "X")


def test_stalled_rank_is_reported_and_the_job_aborts() -> None:
    proc, _ = ddlrun(3, "worker_stall.py", env={"DDL_STALL_TIMEOUT": "2"}, timeout=60)
    ended = time.time()
    assert proc.returncode != 0
    assert "UNREACHABLE" not in proc.stdout
    assert "'late'" in proc.stderr and "not by rank(s) [1]" in proc.stderr, proc.stderr[-2000:]
    assert "warning" in proc.stderr
    assert _since_mark(proc, ended) < 10  # 2 s of timeout, then the abort


def test_calibrated_model_is_identical_on_every_rank(tmp_path: Path) -> None:
    # Two dims, so both link probes and the multi-ring pricing take part.
    np_, extra = 4, ["--topology", "2x2"]
    calib = tmp_path / "calib.json"
    for attempt, source in enumerate(("measured", "loaded")):
        proc, _ = ddlrun(np_, "worker_calibration.py", *extra, "--calibration", str(calib), timeout=120)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        passed = re.findall(r"PASS calibration rank \d+/\d+ source=(\w+) seconds=([\d.]+)", proc.stdout)
        assert len(passed) == np_, proc.stdout
        assert all(s == source for s, _ in passed), (attempt, passed)
        assert calib.is_file()
        if source == "measured":
            assert all(float(t) < 5.0 for _, t in passed), passed  # "well under 1 s" on an idle box


# -- the engine's trust contract (timed from the failure, not from a loaded start-up) --


def _since_mark(proc: subprocess.CompletedProcess[str], ended: float) -> float:
    # Ranks share one stdout, so two marks may run together on a line.
    marks = [float(t) for t in re.findall(r"T0 (\d+\.\d{3})", proc.stdout)]
    assert marks, proc.stdout[-2000:] + proc.stderr[-2000:]
    return ended - min(marks)


def test_an_argument_refused_on_one_rank_ends_the_call_everywhere_and_threads_never_mix() -> None:
    proc, _ = ddlrun_mode(3, "refuse")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("PASS trust") == 3
    waits = [float(t) for t in re.findall(r"REFUSED rank \d after ([\d.]+) s", proc.stdout)]
    assert len(waits) == 3 and max(waits) < 10, waits


def test_a_failure_inside_a_cycle_that_the_user_catches_still_ends_the_job() -> None:
    proc, _ = ddlrun_mode(3, "cycle-error")
    ended = time.time()
    assert proc.returncode != 0
    assert "UNREACHABLE" not in proc.stdout
    assert "rank 1: the engine failed during a collective ('boom')" in proc.stderr, proc.stderr[-2000:]
    assert "MemoryError: no room for the fused buffer" in proc.stderr
    assert _since_mark(proc, ended) < 10


def test_ranks_started_with_different_settings_are_refused_at_init() -> None:
    mpiexec = Path(sys.executable).parent / "mpiexec"
    if not mpiexec.exists():
        pytest.skip("needs the pip MPICH's mpiexec for per-rank environments")
    cmd = [str(mpiexec)]
    for r in range(2):
        if r:
            cmd.append(":")
        cmd += ["-n", "1", "-env", "MPIR_CVAR_ENABLE_HEAVY_YIELD", "1"]
        if r == 1:
            cmd += ["-env", "DDL_FUSION_THRESHOLD", "0", "-env", "DDL_SEGMENT_BYTES", "4096"]
        cmd += [sys.executable, str(WORKERS / "worker_trust.py"), "settings"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    # Ranks share one stdout, so their lines may run together: count the messages.
    assert proc.stdout.count("SETTINGS ") == 2, proc.stdout
    assert proc.stdout.count("DDL_FUSION_THRESHOLD: rank 0: 67108864; rank 1: 0") == 2, proc.stdout
    assert proc.stdout.count("DDL_SEGMENT_BYTES: rank 0: 1048576; rank 1: 4096") == 2, proc.stdout


def test_shutdown_after_a_failed_init_returns_at_once() -> None:
    proc, _ = ddlrun_mode(2, "init-fails")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    times = [float(t) for t in re.findall(r"SHUTDOWN ([\d.]+)", proc.stdout)]
    assert len(times) == 2 and max(times) < 2, times


def test_shutdown_waits_for_a_late_rank_and_exits_cleanly() -> None:
    proc, _ = ddlrun_mode(2, "late-stop")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    stops = dict(re.findall(r"STOPPED rank (\d) after ([\d.]+) s", proc.stdout))
    assert float(stops["0"]) >= 2.0 and float(stops["1"]) < 2.0, stops


def ddlrun_mode(np_: int, mode: str) -> tuple[subprocess.CompletedProcess[str], float]:
    cmd = [sys.executable, "-m", "ddl.launcher.cli", "-np", str(np_), sys.executable,
           str(WORKERS / "worker_trust.py"), mode]
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return proc, time.monotonic() - start


@pytest.mark.parametrize("shared", ["on", "off"])
def test_seventeen_ranks_ride_small_calls_in_their_records(shared: str) -> None:
    """More ranks than 16 on one host: through shared memory the records keep 4 KiB; over
    MPI's gather they are 128 bytes, gathered in MPI's blocking wait."""
    proc, _ = ddlrun(17, "worker_many_ranks.py", timeout=240,
                     env={"MPIR_CVAR_ENABLE_HEAVY_YIELD": "1", "DDL_SHARED_NEGOTIATION": shared})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = re.findall(r"RANK (\d+) ok=(\w+) inline=(\d+) record=(\d+) blocks=(\w+) shared=(\w+)", proc.stdout)
    assert sorted(int(r) for r, *_ in lines) == list(range(17)), proc.stdout[-3000:]
    blocks = available_cpus() < 17  # ranks outnumber the cores this job may use (as init reads them)
    want = ("True", "4096", "4136", str(blocks), "True") if shared == "on" else ("True", "88", "128", str(blocks), "False")
    assert {tuple(rest) for _, *rest in lines} == {want}


def test_a_process_set_waits_with_the_worlds_stall_limit() -> None:
    """A process set's waits are bounded as the world's are."""
    proc, _ = ddlrun(3, "worker_set_waits.py", timeout=180, env={"DDL_STALL_TIMEOUT": "7"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = re.findall(r"SET rank=(\d) sum=(\S+) limit=(\S+)/(\S+) poll=(\w+)/(\w+) busy=(\S+)/(\S+) blocks=(\w+) "
                       r"remote=(\S+)", proc.stdout)
    assert sorted(line[0] for line in lines) == ["0", "2"], proc.stdout[-3000:]
    for _, total, limit, world_limit, poll, world_poll, busy, world_busy, blocks, remote in lines:
        assert total == "2"  # ranks 0 and 2 only
        assert limit == world_limit == "7" and poll == world_poll and busy == world_busy
        assert blocks == "False" and remote == "[]"  # two members on one host
