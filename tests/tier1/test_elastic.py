"""Elastic training's pure parts: discovery, membership, the commit store, the wire, sharding, the flags."""

from __future__ import annotations

import os
import queue
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ddl.launcher import cli
from ddl.launcher.elastic.discovery import (
    Discovered,
    DiscoveryFailed,
    DiscoveryRunner,
    parse_lenient,
    run_once,
)
from ddl.launcher.elastic.flags import check_bounds
from ddl.launcher.elastic.membership import Membership, WorldPlan
from ddl.launcher.elastic.preload import PythonTarget, imports_of, python_target
from ddl.launcher.hosts import HostSlots
from ddl.runtime.elastic import protocol
from ddl.runtime.elastic.position import batches_per_rank, deal, epoch_order
from ddl.runtime.elastic.protocol import (
    Beat,
    LaunchRank,
    ProtocolError,
    RankReport,
    Route,
    Step,
    decode,
    encode,
)
from ddl.runtime.elastic.store import CommitStore
from ddl.runtime.elastic.wire import LineReader, host_folder, send


def hosts(text: str) -> tuple[HostSlots, ...]:
    listed, skipped = parse_lenient(text.replace(",", "\n"), default_slots=1, source="test")
    assert not skipped
    return listed


# -- discovery and membership ----------------------------------------------------------------


def test_discovery_output_is_horovods_host_slots_lines_and_other_lines_are_named_and_skipped() -> None:
    assert parse_lenient("h1:2\n\n  h2  \n# a comment\nh3 slots=4 # spare\n", default_slots=3, source="d.sh") == (
        (HostSlots("h1", 2), HostSlots("h2", 3), HostSlots("h3", 4)), ())
    listed, skipped = parse_lenient("h1:2\nh2:zero\n<html><body>\nh3:1\n", default_slots=1, source="d.sh")
    assert listed == (HostSlots("h1", 2), HostSlots("h3", 1))
    assert skipped == ("d.sh line 2: 'h2:zero'", "d.sh line 3: '<html><body>'")


def script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "d.sh"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_a_failing_discovery_script_says_why(tmp_path: Path) -> None:
    failed = run_once(script(tmp_path, "echo h1:1\necho broken >&2\nexit 3\n"), default_slots=1, timeout=10)
    assert isinstance(failed, DiscoveryFailed) and "exited with status 3 (broken)" in failed.why
    garbage = run_once(script(tmp_path, "echo '{\"hosts\": [1, 2]}'\n"), default_slots=1, timeout=10)
    assert isinstance(garbage, DiscoveryFailed) and "printed no host[:slots] line" in garbage.why
    found = run_once(script(tmp_path, "echo h1:2\necho h2\n"), default_slots=2, timeout=10)
    assert isinstance(found, Discovered) and found.hosts == (HostSlots("h1", 2), HostSlots("h2", 2))
    empty = run_once(script(tmp_path, "true\n"), default_slots=2, timeout=10)  # no host listed is a list
    assert isinstance(empty, Discovered) and empty.hosts == ()
    missing = run_once(str(tmp_path / "nothing.sh"), default_slots=1, timeout=10)
    assert isinstance(missing, DiscoveryFailed) and "could not run" in missing.why


def test_a_hanging_discovery_script_is_killed_at_its_timeout_with_what_it_started(tmp_path: Path) -> None:
    """The shell's child (sleep) holds the output pipe: killing the shell alone would leave the run
    waiting for it; the whole session goes."""
    marker = tmp_path / "child.pid"
    start = time.monotonic()
    hung = run_once(script(tmp_path, f"sleep 300 &\necho $! > {marker}\nwait\n"), default_slots=1, timeout=0.5)
    assert isinstance(hung, DiscoveryFailed) and "did not finish in 0.5 s (--discovery-timeout); killed" in hung.why
    assert time.monotonic() - start < 5
    child = int(marker.read_text())
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the script's child outlived the timeout"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def test_the_discovery_runner_posts_events_beside_the_caller_and_stops_what_runs(tmp_path: Path) -> None:
    """Runs one after another, each posted as it ends; the caller never waits for one; stop()
    kills a run in progress."""
    events: queue.Queue[object] = queue.Queue()
    path = script(tmp_path, f"n=$(cat {tmp_path}/n 2>/dev/null || echo 0); echo $((n+1)) > {tmp_path}/n\n"
                            f"[ $n -ge 2 ] && echo $$ > {tmp_path}/pid && exec sleep 300\necho h$n:1\n")
    runner = DiscoveryRunner(path, default_slots=1, interval=0.05, timeout=60, post=events.put)
    start = time.monotonic()
    runner.start()
    assert time.monotonic() - start < 0.5
    first, second = events.get(timeout=10), events.get(timeout=10)
    assert [e.hosts for e in (first, second)] == [(HostSlots("h0", 1),), (HostSlots("h1", 1),)]  # type: ignore[attr-defined]
    deadline = time.monotonic() + 10
    while not (tmp_path / "pid").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.1)  # the third run sleeps
    stopping = time.monotonic()
    runner.stop()
    assert time.monotonic() - stopping < 5 and events.empty()
    assert not _alive(int((tmp_path / "pid").read_text())), "stop() left the running script behind"


def test_the_survivors_come_first_and_max_np_cuts_the_last_host() -> None:
    m = Membership(max_np=5)
    m.observe(hosts("a:2,b:2,c:2,d:2"), now=0)
    plan = m.plan(ready={"a", "b", "c", "d"}, previous=("c", "a"))
    assert plan.hosts == (HostSlots("c", 2), HostSlots("a", 2), HostSlots("b", 1))
    assert plan.np == 5 and [plan.host_of(r) for r in range(5)] == ["c", "c", "a", "a", "b"]
    assert m.plan(ready={"b"}, previous=("a",)) == WorldPlan((HostSlots("b", 2),))  # only warm agents count


def test_a_failed_host_returns_only_when_listed_again_after_leaving_the_list() -> None:
    m = Membership(max_np=8)
    m.observe(hosts("a,b,c"), now=0)
    m.fail("c", now=1)
    assert [h.name for h in m.eligible()] == ["a", "b"]
    assert m.observe(hosts("a,b,c"), now=100) == [] and m.left == []  # still listed: a partitioned host stays out
    assert m.observe(hosts("a,b"), now=101) == [] and m.left == ["c"]  # said once (ddlrun logs it)
    assert m.observe(hosts("a,b"), now=101.5) == [] and m.left == []
    assert m.observe(hosts("a,b,c"), now=102) == ["c"]  # the scheduler replaced or repaired it
    assert [h.name for h in m.eligible()] == ["a", "b", "c"]


def test_a_cooldown_lets_a_failed_host_back_later_each_time() -> None:
    m = Membership(max_np=8, cooldown=(10, 25))
    m.observe(hosts("a,b"), now=0)
    m.fail("b", now=0)
    assert m.observe(hosts("a,b"), now=9) == [] and m.observe(hosts("a,b"), now=10) == ["b"]
    m.fail("b", now=20)  # second failure: 20 s
    assert m.observe(hosts("a,b"), now=39) == [] and m.observe(hosts("a,b"), now=40) == ["b"]
    m.fail("b", now=50)  # third: 40 s, capped at 25
    assert m.observe(hosts("a,b"), now=75) == ["b"]


def test_bounds_come_from_np_and_are_checked() -> None:
    assert check_bounds(3, 2, None, None) == (2, 3)
    assert check_bounds(None, None, None, 6) == (1, 6)
    for args, message in (((None, 2, None, None), "needs an upper bound"), ((4, 1, 3, None), "outside"),
                          ((None, 3, 2, None), "more than --max-np"), ((None, 0, 2, None), ">= 1")):
        with pytest.raises(ValueError, match=message):
            check_bounds(*args)


def test_ddlrun_refuses_elastic_flags_without_elastic_and_a_fixed_topology_with_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["-np", "2", "--min-np", "1", "python", "x.py"]) == cli.USAGE_ERROR
    assert "--min-np applies only with --elastic" in capsys.readouterr().err
    assert cli.main(["--elastic", "-np", "2", "--topology", "2", "python", "x.py"]) == cli.USAGE_ERROR
    assert "an elastic world changes size" in capsys.readouterr().err
    assert cli.main(["--elastic", "--host-discovery-script", "/nonexistent", "--max-np", "2", "python", "x"]) == 2
    assert "is not an executable file" in capsys.readouterr().err


# -- the commit store and the wire ----------------------------------------------------------


def test_the_store_keeps_the_last_whole_commit(tmp_path: Path) -> None:
    store = CommitStore(tmp_path / "h1")
    assert store.read() is None and store.serial() == 0
    store.write(1, b"one")
    store.write(2, b"two" * 1000)
    assert store.read() == (2, b"two" * 1000)
    # A writer killed half-way leaves its temporary file; the commit before it stays whole.
    (tmp_path / "h1" / ".state.bin.999").write_bytes(b"DDLSTATE1\nhalf")
    assert store.serial() == 2
    data = store.path.read_bytes()
    store.path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # a damaged payload is no commit
    assert store.read() is None and store.serial() == 0


def test_messages_are_lines_and_may_arrive_in_pieces() -> None:
    reader = LineReader()
    report, beat = RankReport(step=Step.COMMIT, serial=3), Beat(host="h1", seq=7)
    data = encode(report) + encode(beat)
    assert reader.feed(data[:5]) == [] and reader.feed(data[5:]) == [report, beat]
    with pytest.raises(ValueError, match="one JSON object a line"):
        reader.feed(b"[1, 2]\n")
    assert host_folder("/dev/shm", "job", "h1") == Path("/dev/shm/ddl-elastic-job/h1")


_SAMPLES = {"str": "h1", "int": 3, "float": 1.5, "list[str]": ["json"], "dict[str, str]": {"a": "b"},
            "Step": Step.COMMIT, "EndCause": protocol.EndCause.SIGNAL, "StopWhy": protocol.StopWhy.LOST,
            "Reason": protocol.Reason.COLLECTIVE_FAILED}


@pytest.mark.parametrize("kind", sorted(protocol.KINDS))
def test_every_message_kind_survives_the_wire_as_itself(kind: str) -> None:
    cls = protocol.KINDS[kind]
    message = cls(**{name: _SAMPLES[type_] for name, type_ in protocol.fields_of(cls)})
    [back] = LineReader(cls.route).feed(encode(message))
    assert back == message and type(back) is cls and back.kind == kind


@pytest.mark.parametrize(("data", "words"), [
    ({"v": 2, "t": "beat", "host": "h", "seq": 1}, "protocol version 2, but this ddl speaks version 3"),
    ({"t": "beat", "host": "h", "seq": 1}, "protocol version None"),
    ({"v": 3, "t": "hug"}, "unknown elastic message kind 'hug'"),
    ({"v": 3, "t": "beat", "host": "h"}, "lacks its field 'seq'"),
    ({"v": 3, "t": "beat", "host": "h", "seq": "1"}, "field 'seq' must be int"),
    ({"v": 3, "t": "beat", "host": "h", "seq": True}, "field 'seq' must be int"),
    ({"v": 3, "t": "stop", "world": 1, "why": "bored", "lost": []},
     "field 'why' is 'bored'; one of lost, reset, error, done"),
    ({"v": 3, "t": "report", "step": "reset", "serial": 1, "reason": "HorovodInternalError"},
     "field 'reason' is 'HorovodInternalError'; one of none, hosts_updated, collective_failed, exception"),
    ({"v": 3, "t": "quit", "now": 1}, "unknown field"),
])
def test_a_message_this_ddl_cannot_take_is_refused_saying_why(data: dict[str, object], words: str) -> None:
    with pytest.raises(ProtocolError, match=re.escape(words)):
        decode(data)


def test_a_message_on_the_wrong_route_is_refused() -> None:
    reader = LineReader(Route.AGENT_TO_SUPERVISOR)
    with pytest.raises(ProtocolError, match="travels supervisor -> agent, not agent -> supervisor"):
        reader.feed(encode(protocol.Quit()))
    assert decode({"v": 3, "t": "report", "step": "reset", "serial": 3}) == RankReport(step=Step.RESET, serial=3)


def test_descriptors_travel_with_the_first_message(tmp_path: Path) -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b, open(tmp_path / "f", "w") as f:
        launch = LaunchRank(argv=["python", "t.py"], env={"A": "1"}, cwd="/")
        send(a, launch, [f.fileno()])
        reader = LineReader()
        assert reader.receive(b, with_fds=True) == [launch]
        assert len(reader.fds) == 1 and os.path.samestat(os.fstat(reader.fds[0]), os.fstat(f.fileno()))
        os.close(reader.fds[0])


# -- what the agent preloads -----------------------------------------------------------------


def test_python_programs_are_recognised_and_others_are_executed(tmp_path: Path) -> None:
    py = sys.executable
    assert python_target([py, "t.py", "-x"], py) == PythonTarget("path", "t.py", ["t.py", "-x"])
    assert python_target([py, "-u", "-m", "pkg.mod", "a"], py) == PythonTarget("module", "pkg.mod", ["pkg.mod", "a"], True)
    assert python_target([py, "-c", "print(1)"], py) == PythonTarget("code", "print(1)", ["-c"])
    assert python_target([py, "-O", "t.py"], py) is None  # options that change the interpreter: exec
    assert python_target(["/bin/echo", "hi"], py) is None
    script = tmp_path / "tool"
    script.write_text("#!/usr/bin/env python3\nimport json\n")
    assert python_target([str(script), "x"], py) == PythonTarget("path", str(script), [str(script), "x"])


def test_only_top_level_imports_are_preloaded(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import os, json as j\nfrom numpy import linalg\nfrom numpy import *\ntry:\n    import csv\nexcept ImportError:\n"
                      "    pass\ndef f():\n    import sqlite3\nfrom . import sibling\n")
    assert imports_of(PythonTarget("path", str(script), [])) == ["os", "json", "numpy", "numpy.linalg", "csv"]


def test_the_agent_refuses_to_initialise_mpi_and_a_rank_may() -> None:
    code = ("from ddl.launcher.elastic.preload import preload, allow_mpi\n"
            "ok, failed = preload(['json', 'mpi4py.MPI', 'no_such_module_xyz'])\n"
            "assert ok == ['json'], ok\n"
            "assert 'not imported in ddl' in failed['mpi4py.MPI'], failed\n"
            "assert 'no_such_module_xyz' not in failed  # a name that is no module: skipped (the rank reports it)\n"
            "allow_mpi()\nfrom mpi4py import MPI\nprint('ranks', MPI.COMM_WORLD.Get_size())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "ranks 1" in out.stdout, out.stderr


# -- dealing the rest of an epoch ------------------------------------------------------------


@pytest.mark.parametrize("count", [0, 1, 7, 100, 1437])
@pytest.mark.parametrize("size", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("batch", [1, 4, 32])
def test_every_rank_runs_the_same_steps_and_no_sample_repeats_unless_it_must(count: int, size: int, batch: int) -> None:
    remaining = epoch_order(count, epoch=2, seed=7, shuffle=True)
    shares = [deal(remaining, rank=r, size=size, batch_size=batch) for r in range(size)]
    steps = {-(-len(s) // batch) for s in shares}
    assert steps == {batches_per_rank(count, size=size, batch_size=batch)}, [len(s) for s in shares]
    seen = np.concatenate(shares)
    assert set(seen.tolist()) == set(remaining.tolist())  # nothing skipped
    q, extra = divmod(count, size)
    if not extra or q % batch:
        assert len(seen) == count  # nothing repeated
    else:  # the short ranks would have no last batch: they share the last few samples
        assert len(seen) == (q + 1) * size
        values, counts = np.unique(seen, return_counts=True)
        assert set(values[counts > 1].tolist()) <= set(remaining[q * size:].tolist())


def test_after_a_resize_the_world_continues_where_the_order_stands() -> None:
    order = epoch_order(1000, epoch=0, seed=1, shuffle=True)
    processed = 0
    seen: list[int] = []
    for size, steps in ((3, 4), (2, 5), (4, 3)):  # 3 ranks for 4 steps, then 2 for 5, then 4 for 3
        shares = [deal(order[processed:], rank=r, size=size, batch_size=10) for r in range(size)]
        for step in range(steps):
            for share in shares:
                seen += share[step * 10:(step + 1) * 10].tolist()
        processed += steps * 10 * size
    assert sorted(seen) == sorted(order[:processed].tolist())  # exactly the first samples of the order, once
    assert epoch_order(5, epoch=0, seed=0, shuffle=True).tolist() != epoch_order(5, epoch=1, seed=0, shuffle=True).tolist()


# -- ddlrun's supervisor: never a traceback ------------------------------------------------------

def test_an_unexpected_error_in_the_supervisor_is_one_line_and_status_1(capsys: pytest.CaptureFixture[str],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in ddlrun's loop (here: an IndexError where issue 39 found one) ends the job with one line
    naming it and status 1, never a traceback; what the job started is cleaned up."""
    from ddl.launcher.command import MpiInfo
    from ddl.launcher.elastic.flags import ElasticOptions
    from ddl.launcher.elastic.supervisor import Supervisor

    options = ElasticOptions(command=("python", "train.py"), min_np=1, max_np=1)
    supervisor = Supervisor(options, mpi=MpiInfo(flavour="mpich", mpiexec="mpiexec"), base_env={},
                            python_executable=sys.executable, cpu_count=2, is_root=False)

    def broken() -> None:
        raise IndexError("tuple index out of range")

    monkeypatch.setattr(supervisor, "_begin", broken)
    assert supervisor.run() == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    [line] = [line for line in err.splitlines() if line.startswith("ddlrun: error:")]
    assert "ddlrun failed (IndexError: tuple index out of range at test_elastic.py:" in line
