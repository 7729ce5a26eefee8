"""ddlrun's watch over the ranks, without MPI: the verdict, the protocol, the output, the keeper.

The keeper runs here for real (a Python child standing in for a rank, reporting to a
:class:`WatchServer` in this process): output lines whole, notes passed on, how the rank
ended, its last words, and the shared memory it left removed.
"""

from __future__ import annotations

import io
import os
import queue
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ddl.base import notes
from ddl.base.notes import Note
from ddl.launcher.watch import protocol, verdict
from ddl.launcher.watch.output import OutputRouter, hydra_banner
from ddl.launcher.watch.protocol import Ended, KeeperHello, Noted, Output
from ddl.launcher.watch.server import KeeperClosed, WatchServer
from ddl.wire.shm_segments import Segment, mapped_segments, parse_maps, remove_left

# -- the verdict ---------------------------------------------------------------------------


def _state(np: int = 2, hosts: tuple[str, ...] = ("h1", "h2")) -> verdict.WatchState:
    state = verdict.WatchState(np)
    for r in range(np):
        verdict.step(state, verdict.Joined(r, hosts[r], 0.0))
    return state


def _tell(state: verdict.WatchState, rank: int, *kinds: str, at: float = 1.0, **fields: object) -> list[verdict.Action]:
    actions: list[verdict.Action] = []
    for kind in kinds:
        actions += verdict.step(state, verdict.Told(rank, Note(kind, **fields), at))  # type: ignore[arg-type]
    return actions


def _gone(state: verdict.WatchState, rank: int, code: int | None = None, sig: int | None = None, at: float = 2.0,
          words: tuple[str, ...] = ()) -> list[verdict.Action]:
    return verdict.step(state, verdict.RankGone(rank, Ended(rank, code, sig, words), at))


def test_a_rank_that_fails_before_init_ends_the_job_with_its_status_and_last_words() -> None:
    state = _state()
    _tell(state, 0, notes.INIT)
    (action,) = _gone(state, 1, 3, words=("Traceback ...", "RuntimeError: no config here"))
    assert action.status == 3
    text = "\n".join(action.report)
    assert text.startswith("ddlrun: rank 1 (host h2) exited with status 3 before ddl.init"), text
    assert "| RuntimeError: no config here" in text and "stopping rank(s) [0]" in text
    assert "exit status 3 (rank 1's own)" in text
    assert _gone(state, 0, sig=signal.SIGTERM) == []  # the job has failed already: nothing more


def test_a_killed_rank_is_named_with_its_signal_host_and_phase() -> None:
    state = _state()
    _tell(state, 1, notes.INIT, notes.READY)
    (action,) = _gone(state, 1, sig=signal.SIGKILL)
    assert action.status == 128 + 9
    assert action.report[0] == "ddlrun: rank 1 (host h2) was killed by signal 9 (SIGKILL) after ddl.init"


def test_a_rank_that_failed_because_another_left_defers_to_that_ranks_own_status() -> None:
    state = _state()
    _tell(state, 0, notes.INIT, notes.READY)
    _tell(state, 1, notes.INIT, notes.READY, notes.LEAVING)
    _tell(state, 0, notes.FAILING, text="RankLeftError: rank 1 left", blame=1)
    assert _gone(state, 0, 1, at=2.0) == []  # rank 1 has not ended yet: wait for its status
    (action,) = _gone(state, 1, 3, at=2.5)
    assert action.status == 3 and action.report[0].startswith("ddlrun: rank 1 (host h2) exited with status 3")
    assert any("rank 0 (host h1) exited with status 1 because of it" in line for line in action.report)


def test_the_wait_for_a_blamed_rank_is_bounded() -> None:
    state = _state()
    _tell(state, 0, notes.FAILING, text="RankLeftError", blame=1)
    assert _gone(state, 0, 1, at=10.0) == []
    assert verdict.step(state, verdict.Tick(10.0 + verdict.BLAME_WAIT - 0.1)) == []
    (action,) = verdict.step(state, verdict.Tick(10.0 + verdict.BLAME_WAIT))
    assert action.status == 1 and "rank 1 did not end within" in "\n".join(action.report)


def test_a_rank_that_left_normally_leaves_the_failure_to_the_one_that_waited() -> None:
    state = _state()
    _tell(state, 1, notes.INIT, notes.READY, notes.LEAVING, notes.DONE)
    assert _gone(state, 1, 0) == []
    _tell(state, 0, notes.FAILING, text="RankLeftError: rank 1 left", blame=1)
    (action,) = _gone(state, 0, 1)
    assert action.status == 1 and action.report[0].startswith("ddlrun: rank 0 (host h1) exited with status 1")


def test_status_0_without_ddls_shutdown_fails_the_job() -> None:
    state = _state()
    _tell(state, 1, notes.INIT, notes.READY)
    (action,) = _gone(state, 1, 0)
    assert action.status == 1 and "without ddl's shutdown" in "\n".join(action.report)


@pytest.mark.parametrize("first", ["exit", "init"])
def test_status_0_without_ever_calling_init_fails_once_another_rank_calls_it(first: str) -> None:
    state = _state()
    if first == "exit":
        assert _gone(state, 1, 0) == []  # nobody waits for it yet
        (action,) = _tell(state, 0, notes.INIT)
    else:
        _tell(state, 0, notes.INIT)
        (action,) = _gone(state, 1, 0)
    assert action.status == 1 and "never called ddl.init" in "\n".join(action.report)


def test_programs_that_never_use_ddl_fail_only_by_their_status() -> None:
    state = _state()
    assert _gone(state, 0, 0) == [] and _gone(state, 1, 0) == []
    assert state.failure is None


# -- the protocol ----------------------------------------------------------------------------


def test_every_message_round_trips_and_output_keeps_any_bytes() -> None:
    raw = b"caf\xc3\xa9 \xff\xfe end"
    messages = [KeeperHello(1, "h2", 42, "ab"), Output(1, "stderr", raw.decode("utf-8", "surrogateescape")),
                Noted(0, Note(notes.FAILING, "ValueError: x", blame=1)), Ended(1, None, 9, ("a", "b"), ("/dev/shm/x",))]
    for message in messages:
        assert protocol.decode(protocol.encode(message).rstrip(b"\n")) == message
    assert messages[1].text.encode("utf-8", "surrogateescape") == raw  # type: ignore[union-attr]
    assert Ended(1, None, 9).status == 137 and Ended(1, 3, None).status == 3
    with pytest.raises(protocol.KeeperProtocolError):
        protocol.decode(b'{"type": "hello", "v": 99}')
    with pytest.raises(protocol.KeeperProtocolError):
        protocol.decode(b"not json")
    assert protocol.parse_monitor("10.0.0.1:42/tok") == ("10.0.0.1", 42, "tok")
    with pytest.raises(ValueError, match="HOST:PORT/TOKEN"):
        protocol.parse_monitor("10.0.0.1:42")


# -- the output --------------------------------------------------------------------------------


def test_lines_are_tagged_whole_filed_per_rank_and_hydras_banner_is_dropped_after_ddlrun_ended_the_job(
        tmp_path: Path) -> None:
    out, err = io.BytesIO(), io.BytesIO()
    router = OutputRouter(np=12, tagged=True, log_dir=tmp_path / "logs", stdout=out, stderr=err)
    router.line(3, "stdout", "epoch 2 step 16")
    router.line(11, "stderr", "warning")
    router.launcher_line("stderr", "=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES", ended_by_ddlrun=True)
    router.launcher_line("stderr", "[proxy:0] hydra says something", ended_by_ddlrun=True)
    router.close()
    assert out.getvalue() == b"[3]<stdout>:epoch 2 step 16\n"
    assert err.getvalue() == b"[11]<stderr>:warning\n[proxy:0] hydra says something\n"
    assert (tmp_path / "logs" / "rank.03" / "stdout").read_text() == "epoch 2 step 16\n"
    assert (tmp_path / "logs" / "rank.11" / "stderr").read_text() == "warning\n"
    plain = io.BytesIO()
    untagged = OutputRouter(np=2, tagged=False, log_dir=None, stdout=plain, stderr=io.BytesIO())
    untagged.line(1, "stdout", "x")
    untagged.launcher_line("stdout", "=   EXIT CODE: 9", ended_by_ddlrun=False)  # not ended by ddlrun: kept
    assert plain.getvalue() == b"x\n=   EXIT CODE: 9\n"
    assert hydra_banner("YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed (signal 9)")


# -- shared memory left behind ---------------------------------------------------------------------


def test_segments_are_read_from_maps_and_only_unmapped_ones_with_their_inode_are_removed() -> None:
    line = "7f00-7f10 rw-s 00000000 00:1a 42 /dev/shm/mpich_shm_ab_0\n"
    assert parse_maps(line) == {Segment("/dev/shm/mpich_shm_ab_0", os.makedev(0, 0x1a), 42)}
    assert parse_maps(line.replace("_0\n", "_0 (deleted)\n")) == set()
    path = Path(f"/dev/shm/ddl-test-{os.getpid()}")
    path.write_bytes(b"\0" * 4096)
    try:
        holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
            import mmap, sys
            f = open({str(path)!r}, "r+b"); m = mmap.mmap(f.fileno(), 4096)
            print("mapped", flush=True); sys.stdin.read()
            """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert holder.stdout is not None and holder.stdout.readline() == "mapped\n"
        (segment,) = mapped_segments(holder.pid)
        assert segment.path == str(path)
        assert remove_left({segment}) == [] and path.exists()  # a live process maps it
        assert holder.communicate(input="") is not None
        wrong = Segment(segment.path, segment.device, segment.inode + 1)
        assert remove_left({wrong}) == [] and path.exists()  # another file under that name: not ours
        assert remove_left({segment}) == [str(path)] and not path.exists()
    finally:
        path.unlink(missing_ok=True)


# -- the keeper, for real ---------------------------------------------------------------------------------

RANK = """
import mmap, os, signal, sys, time
from ddl.base import notes
notes.send(notes.INIT)
sys.stdout.write("part one, "); sys.stdout.flush(); time.sleep(0.05); print("part two", flush=True)
f = open(sys.argv[1], "w+b"); f.truncate(4096); m = mmap.mmap(f.fileno(), 4096)
notes.send(notes.READY)
print("dying now", file=sys.stderr, flush=True)
time.sleep(0.3)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _events(server: WatchServer, until: float) -> list[object]:
    got: list[object] = []
    while time.monotonic() < until:
        try:
            event = server.events.get(timeout=0.1)
        except queue.Empty:
            continue
        got.append(event.what)
        if isinstance(event.what, KeeperClosed):
            break
    return got


def _keeper(server: WatchServer, script: str, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "DDL_MONITOR": server.address("127.0.0.1"), "PMI_RANK": "1", "PMI_SIZE": "2",
           "DDL_HOSTNAME": "h2"}
    return subprocess.Popen([sys.executable, "-m", "ddl.launcher.watch.keeper", "--", sys.executable, "-c", script,
                             *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_the_keeper_reports_a_killed_rank_with_its_lines_notes_and_last_words_and_removes_its_memory() -> None:
    server = WatchServer()
    segment = Path(f"/dev/shm/ddl-keeper-test-{os.getpid()}")
    try:
        anchor = _keeper(server, RANK, str(segment))
        got = _events(server, time.monotonic() + 60)
        anchor.wait(timeout=30)
    finally:
        server.close()
        segment.unlink(missing_ok=True)
    hello = got[0]
    assert isinstance(hello, KeeperHello) and (hello.rank, hello.host) == (1, "h2")
    lines = [(m.stream, m.text) for m in got if isinstance(m, Output)]
    assert ("stdout", "part one, part two") in lines and ("stderr", "dying now") in lines
    assert [m.note.kind for m in got if isinstance(m, Noted)] == [notes.INIT, notes.READY]
    (ended,) = [m for m in got if isinstance(m, Ended)]
    assert ended.signal == signal.SIGKILL and ended.code is None and "dying now" in ended.last_words
    assert ended.removed == (str(segment),), ended  # mapped by the rank, left behind, removed
    assert anchor.returncode == 0  # ddlrun has the report: it, not the launcher, ends the job


def test_without_ddlrun_the_keeper_tags_the_ranks_lines_itself_and_ends_as_the_rank_did() -> None:
    env = {k: v for k, v in os.environ.items() if k != "DDL_MONITOR"}
    done = subprocess.run([sys.executable, "-m", "ddl.launcher.watch.keeper", "--", sys.executable, "-c",
                           "import os, signal; print('hello', flush=True); os.kill(os.getpid(), signal.SIGTERM)"],
                          env={**env, "PMI_RANK": "3", "PMI_SIZE": "4"}, capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGTERM, done
    assert done.stdout == "[3]<stdout>:hello\n"


def test_the_keeper_passes_sigterm_on_and_kills_a_rank_that_ignores_it() -> None:
    script = ("import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
              "print('up', flush=True); time.sleep(60)")
    server = WatchServer()
    try:
        anchor = _keeper(server, script)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # wait for the rank to be up before the signal
            event = server.events.get(timeout=30)
            if isinstance(event.what, Output):
                break
        started = time.monotonic()
        anchor.send_signal(signal.SIGTERM)
        got = _events(server, time.monotonic() + 30)
        anchor.wait(timeout=30)
        took = time.monotonic() - started
    finally:
        server.close()
    (ended,) = [m for m in got if isinstance(m, Ended)]
    assert ended.signal == signal.SIGKILL, ended
    from ddl.launcher.watch.keeper import GRACE

    assert GRACE <= took < GRACE + 10, took


def test_a_rank_stopped_from_outside_defers_to_the_rank_that_failed_by_itself() -> None:
    state = _state()
    _tell(state, 0, notes.INIT, notes.READY)
    _tell(state, 1, notes.INIT, notes.READY)
    stopped = verdict.RankGone(0, Ended(0, None, signal.SIGTERM, stopped=True), 2.0)
    assert verdict.step(state, stopped) == []  # rank 1's MPI_Abort got the launcher to kill rank 0's anchor
    (action,) = _gone(state, 1, 4, at=2.2)
    assert action.status == 4 and action.report[0].startswith("ddlrun: rank 1 (host h2) exited with status 4")
    alone = _state()
    assert verdict.step(alone, verdict.RankGone(0, Ended(0, None, signal.SIGTERM, stopped=True), 5.0)) == []
    (action,) = verdict.step(alone, verdict.Over(5.1))  # everyone has ended: no cause will come
    assert action.status == 143 and "stopped from outside" in "\n".join(action.report)
    asked = _state()
    asked.stopping = True  # ddlrun itself was interrupted: its ranks being stopped is no failure
    assert verdict.step(asked, verdict.RankGone(0, Ended(0, None, signal.SIGINT, stopped=True), 1.0)) == []
    assert verdict.step(asked, verdict.Tick(10.0)) == [] and asked.failure is None


def test_an_mpi_abort_is_the_cause_of_every_end_that_follows_it() -> None:
    state = _state()
    _tell(state, 1, notes.ABORT, text="application called MPI_Abort(MPI_COMM_WORLD, 4)", code=4)
    assert _gone(state, 0, sig=signal.SIGKILL, at=1.0) == []  # killed by the launcher, before rank 1's report
    (action,) = _gone(state, 1, sig=signal.SIGKILL, at=1.1)
    assert action.status == 4
    assert action.report[0] == "ddlrun: rank 1 (host h2) aborted the job with error code 4 before ddl.init"
