"""ddlrun's loop for a watched job: run mpiexec, route the keepers' reports, end the job on a failure.

The decisions are :func:`ddl.launcher.watch.verdict.step`'s; this loop only carries them
out: it writes the ranks' lines (:class:`~ddl.launcher.watch.output.OutputRouter`), prints
the failure report, stops the world (SIGTERM to ``mpiexec``, which passes it to every
keeper; SIGKILL to its process group after :data:`KILL_AFTER` seconds) and waits for the
keepers' last reports (each removes its rank's shared memory before it reports) before
returning the job's status.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from types import FrameType
from typing import Any

from ddl.launcher.command import Launch
from ddl.launcher.watch import verdict
from ddl.launcher.watch.lifeline import die_with_parent
from ddl.launcher.watch.output import OutputRouter
from ddl.launcher.watch.protocol import Ended, KeeperHello, Noted, Output
from ddl.launcher.watch.server import KeeperClosed, KeeperEvent, WatchServer

#: Seconds after the SIGTERM that ends a failed job before its mpiexec is killed.
KILL_AFTER = 10.0
#: Seconds ddlrun waits, once mpiexec has ended, for keepers that have not reported yet.
KEEPER_WAIT = 5.0
NOT_STARTED = 127
#: The connection number of mpiexec's own output in the event queue.
LAUNCHER = -1
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class WatchedJob:
    """One run of ``launch`` under :class:`WatchServer` ``server``; :meth:`run` returns the exit status."""

    def __init__(self, launch: Launch, server: WatchServer, *, np: int, router: OutputRouter) -> None:
        self.launch, self.server, self.router = launch, server, router
        self.state = verdict.WatchState(np)
        self.ranks: dict[int, int] = {}  # connection -> rank
        self.reported: set[int] = set()  # ranks whose keeper said how they ended
        self.status: int | None = None  # the failure's, once decided
        self.signalled: int | None = None
        self.kill_at: float | None = None
        self.process: subprocess.Popen[bytes] | None = None

    def run(self) -> int:
        try:
            self.process = subprocess.Popen(self.launch.argv, env=self.launch.env, start_new_session=True,
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                            preexec_fn=lambda: die_with_parent(signal.SIGTERM))
        except OSError as exc:
            print(f"ddlrun: error: cannot start {self.launch.argv[0]} ({exc}); check that it is an executable "
                  "mpiexec", file=sys.stderr, flush=True)
            return NOT_STARTED
        readers = [threading.Thread(target=self._read_launcher, args=(pipe, stream), daemon=True,
                                    name=f"ddlrun-mpiexec-{stream}")
                   for pipe, stream in ((self.process.stdout, "stdout"), (self.process.stderr, "stderr"))]
        for reader in readers:
            reader.start()
        previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            previous = {sig: signal.signal(sig, self._on_signal) for sig in _FORWARDED}
        try:
            status = self._loop(self.process)
            for reader in readers:
                reader.join(timeout=2.0)
            self._drain(wait=0.0)
            return status
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, signal.SIG_DFL if handler is None else handler)
            self.router.close()
            self.server.close()

    def _read_launcher(self, pipe: Any, stream: str) -> None:
        """mpiexec's own lines (hydra's messages; a rank's whose keeper could not reach ddlrun)."""
        for raw in pipe:
            text = raw.rstrip(b"\n").decode("utf-8", "surrogateescape")
            self.server.events.put(KeeperEvent(LAUNCHER, Output(-1, stream, text), time.monotonic()))
        pipe.close()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        process = self.process
        if process is None:
            return
        if self.signalled is not None:  # asked twice: no more waiting
            _kill_group(process.pid, signal.SIGKILL)
            return
        self.signalled = signum
        self.state.stopping = True
        with contextlib.suppress(OSError):
            process.send_signal(signum)
        self.kill_at = time.monotonic() + KILL_AFTER

    def _loop(self, process: subprocess.Popen[bytes]) -> int:
        ended_at: float | None = None
        while True:
            self._drain(wait=0.1)
            now = time.monotonic()
            self._act(verdict.step(self.state, verdict.Tick(now)))
            if self.kill_at is not None and now > self.kill_at and process.poll() is None:
                _kill_group(process.pid, signal.SIGKILL)
                self.kill_at = float("inf")
            code = process.poll()
            if code is not None:
                ended_at = ended_at or now
                waiting = [r for r in self.ranks.values() if r not in self.reported]
                if not waiting or now - ended_at > KEEPER_WAIT:
                    self._act(verdict.step(self.state, verdict.Over(now)))
                    self.router.flush()
                    return self._status(code)

    def _status(self, code: int) -> int:
        if self.status is not None:
            return self.status
        if self.signalled is not None:
            return 128 + self.signalled
        if len(self.reported) == self.state.np:
            return 0  # every rank reported a clean end: what mpiexec makes of it does not change that
        status = 128 - code if code < 0 else code
        if status and not self.reported:
            print(f"ddlrun: mpiexec exited with status {status} and no rank reported why (look above)",
                  file=sys.stderr, flush=True)
        return status

    def _drain(self, *, wait: float) -> None:
        try:
            event = self.server.events.get(timeout=wait) if wait > 0 else self.server.events.get_nowait()
        except queue.Empty:
            return
        while True:
            self._event(event)
            try:
                event = self.server.events.get_nowait()
            except queue.Empty:
                self.router.flush()
                return

    def _event(self, event: KeeperEvent) -> None:
        what = event.what
        if event.connection == LAUNCHER:
            assert isinstance(what, Output)
            self.router.launcher_line(what.stream, what.text, ended_by_ddlrun=self.status is not None)
            return
        if isinstance(what, KeeperHello):
            self.ranks[event.connection] = what.rank
            self._act(verdict.step(self.state, verdict.Joined(what.rank, what.host, event.at)))
            return
        rank = self.ranks.get(event.connection)
        if rank is None:
            return
        if isinstance(what, Output):
            self.router.line(rank, what.stream, what.text)
        elif isinstance(what, Noted):
            self._act(verdict.step(self.state, verdict.Told(rank, what.note, event.at)))
        elif isinstance(what, Ended):
            self.reported.add(rank)
            self._act(verdict.step(self.state, verdict.RankGone(rank, what, event.at)))
        elif isinstance(what, KeeperClosed) and rank not in self.reported:
            # The keeper vanished without a report: it was killed, and its rank with it.
            self.reported.add(rank)
            gone = Ended(rank, None, signal.SIGKILL, ("(its keeper's connection closed without a report: "
                                                      f"{what.why or 'killed?'})",))
            self._act(verdict.step(self.state, verdict.RankGone(rank, gone, event.at)))

    def _act(self, actions: list[verdict.Action]) -> None:
        for action in actions:
            self.router.flush()
            sys.stderr.write("".join(line + "\n" for line in action.report))
            sys.stderr.flush()
            self.status = action.status
            process = self.process
            if process is not None and process.poll() is None:
                with contextlib.suppress(OSError):
                    process.send_signal(signal.SIGTERM)
                self.kill_at = time.monotonic() + KILL_AFTER


def _kill_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
