"""The process ``ddlrun`` starts for each rank: it runs the rank and reports to ``ddlrun`` how it goes.

``mpiexec`` starts ``python -m ddl.launcher.watch.keeper -- COMMAND ...`` on every rank's
host. That process (the *anchor*, which ``mpiexec`` knows) forks the *keeper* into a
session of its own, and the keeper starts COMMAND. The split is what lets the keeper
outlive a launcher that kills whole process groups (hydra does on ``MPI_Abort``): the rank
stays in the anchor's process group, so it is killed with it as MPI expects, while the
keeper (a group of its own) still removes the shared memory the rank left in
``/dev/shm``, and reports.

The keeper connects to ``ddlrun`` (``DDL_MONITOR``), sends what the rank writes line by
line (``ddlrun`` tags and files them), what ddl in the rank tells it on a pipe
(:mod:`ddl.base.notes`), and at the end the rank's status or signal with its last lines on
stderr. Once ``ddlrun`` has that report the anchor ends with status 0: ``ddlrun``, not
the launcher, decides what the end means and stops the others (hydra's own clean-up would
kill them before their keepers report, and its ``-disable-auto-cleanup`` mode fails at
the end of large jobs). Where the report could not be delivered, the anchor ends as the
rank ended (its status, or its signal), so ``mpiexec`` sees what it would have seen. SIGINT, SIGTERM and SIGHUP are passed on to the rank; one
that does not end within :data:`GRACE` seconds of a SIGTERM is killed. A rank never
outlives its keeper (``PR_SET_PDEATHSIG``), nor a keeper its anchor.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import time
from types import FrameType

from ddl.base.config import BY_FIELD, announced_world, environment
from ddl.base.notes import Note
from ddl.launcher.watch import protocol
from ddl.launcher.watch.lifeline import die_with_parent
from ddl.launcher.watch.protocol import Ended, KeeperHello, Message, Noted, Output
from ddl.wire.shm_segments import Segment, mapped_segments, remove_left

#: Seconds a rank has to end after a SIGTERM before it is killed.
GRACE = 3.0
#: Seconds a rank may go on ending by itself once the keeper's anchor is gone (the launcher
#: killed it, say after the rank's own MPI_Abort) before it is stopped.
ORPHAN_GRACE = 1.0
#: The signal the kernel sends the keeper when its anchor dies (not one a launcher forwards).
ANCHOR_GONE = signal.SIGUSR2
#: Lines of the rank's stderr kept as its last words.
LAST_WORDS = 12
#: Longest line passed on whole; longer ones are cut into pieces of this size.
MAX_LINE = 64 * 1024
#: Seconds between looks at the shared memory the rank maps: often while MPI starts (it
#: maps its segments then; until ddl says init finished, or for the first 30 s of a program
#: that does not use ddl), then less often. It is also looked at when ddl says init
#: finished, and before a signal is passed on.
LOOK_EVERY = (0.25, 2.0)
EARLY = 30.0
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: MPICH's line for a program's own MPI_Abort (its error code).
_MPI_ABORT = re.compile(r"application called MPI_Abort\([^,]*, (-?\d+)\)")


def main(argv: list[str] | None = None) -> int:
    """``python -m ddl.launcher.watch.keeper -- COMMAND ...``: the rank's status (see the module)."""
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[1:] if args[:1] == ["--"] else args
    if not command:
        print("usage: python -m ddl.launcher.watch.keeper -- COMMAND ... (ddlrun starts it for each rank)",
              file=sys.stderr)
        return 2
    env = environment()
    said = announced_world(env)
    rank = said.rank if said is not None and said.rank is not None else 0
    host = BY_FIELD["hostname"].read(env) or socket.gethostname()
    return _anchor(command, env, rank, host)


def _anchor(command: list[str], env: dict[str, str], rank: int, host: str) -> int:
    """Fork the keeper into its own session and end as the rank ends."""
    die_with_parent(signal.SIGTERM)  # mpiexec's proxy gone: end the rank through the keeper
    read_end, write_end = os.pipe()
    keeper = os.fork()
    if keeper == 0:
        code = 1
        try:
            os.close(read_end)
            anchor_group = os.getpgid(0)
            os.setpgid(0, 0)  # a group of its own: out of reach of a kill of the anchor's
            Keeper(command, env, rank, host, anchor_group).run(write_end)
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)

    def forward(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(OSError):
            os.kill(keeper, signum)

    for sig in _FORWARDED:
        signal.signal(sig, forward)
    # With -disable-auto-cleanup hydra tells the processes it started that a peer ended by
    # SIGUSR1; ddlrun decides what that means.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    chunks = []
    while chunk := os.read(read_end, 64):
        chunks.append(chunk)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(keeper, 0)
    text = b"".join(chunks).decode(errors="replace").strip()
    status = int(text) if text.lstrip("-").isdigit() else 1
    return _end_as(status)


def _end_as(status: int) -> int:
    """Exit with ``status`` (>= 0), or die of signal ``-status``, as the rank did."""
    if status >= 0:
        return status
    sig = -status
    for handled in _FORWARDED:
        signal.signal(handled, signal.SIG_DFL)
    with contextlib.suppress(OSError, ValueError):
        signal.signal(sig, signal.SIG_DFL)
    sys.stdout.flush()
    os.kill(os.getpid(), sig)
    return 128 + sig


class Keeper:
    """Runs one rank to its end, reporting to ``ddlrun``; see the module."""

    def __init__(self, command: list[str], env: dict[str, str], rank: int, host: str, group: int = 0) -> None:
        self.command, self.env, self.rank, self.host = command, env, rank, host
        self.group = group  # the anchor's process group, which the rank joins
        self.sock: socket.socket | None = None
        self.last_words: collections.deque[str] = collections.deque(maxlen=LAST_WORDS)
        self.segments: set[Segment] = set()
        self._signalled: int | None = None
        self._partial: dict[str, bytes] = {"stdout": b"", "stderr": b""}
        self._queued: list[bytes] = []
        self._look = False  # look at the rank's shared memory at once
        self._ready = False  # ddl's init finished in the rank
        self._orphaned: float | None = None  # when the anchor went
        self.stopped = False  # a signal from outside was passed to the rank
        self.reported = False  # ddlrun has read how the rank ended

    # -- the rank's life --------------------------------------------------------------------
    def run(self, status_fd: int) -> None:
        die_with_parent(ANCHOR_GONE)  # the anchor killed (hydra's abort): end the rank here
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_write, False)
        signal.set_wakeup_fd(wake_write)
        for sig in _FORWARDED:
            signal.signal(sig, self._on_signal)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # only to wake the loop
        signal.signal(ANCHOR_GONE, self._on_anchor_gone)
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        self.sock = self._connect()
        status = self._run_rank(wake_read)
        with contextlib.suppress(OSError):
            os.write(status_fd, str(0 if self.reported else status).encode())
            os.close(status_fd)

    def _in_the_rank(self) -> None:
        """In the rank's process before it runs COMMAND: the anchor's group (a launcher that
        kills the anchor's group, hydra after an MPI_Abort, kills the rank too), and no life
        beyond the keeper's."""
        if self.group:
            with contextlib.suppress(OSError):
                os.setpgid(0, self.group)
        die_with_parent(signal.SIGKILL)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signalled = signum

    def _on_anchor_gone(self, signum: int, frame: FrameType | None) -> None:
        if self._orphaned is None:
            self._orphaned = time.monotonic()

    def _connect(self) -> socket.socket | None:
        monitor = BY_FIELD["monitor"].read(self.env)
        if not monitor:
            return None
        try:
            host, port, token = protocol.parse_monitor(monitor)
            sock = socket.create_connection((host, port), timeout=10)
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except (OSError, ValueError) as exc:
            self._say(f"ddl: rank {self.rank} (host {self.host}): cannot reach ddlrun at {monitor} ({exc}); this "
                      "rank's output goes through mpiexec and its end is not reported to ddlrun")
            return None
        self.sock = sock
        self._send(KeeperHello(self.rank, self.host, os.getpid(), token))
        self._flush()
        return self.sock

    def _run_rank(self, wake_read: int) -> int:
        """Start the rank, pass on what it says until it ends; its status (-N: signal N)."""
        notes_read, notes_write = os.pipe()
        os.set_inheritable(notes_write, True)
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        # FD:PID: only the process whose parent is this keeper (the rank) reports on it.
        env = {**self.env, BY_FIELD["notes_fd"].env: f"{notes_write}:{os.getpid()}"}
        try:
            child = subprocess.Popen(self.command, env=env, stdout=out_write, stderr=err_write, close_fds=False,
                                     preexec_fn=self._in_the_rank)
        except OSError as exc:
            for fd in (notes_read, notes_write, out_read, out_write, err_read, err_write):
                os.close(fd)
            self._line("stderr", f"ddl: rank {self.rank} (host {self.host}): cannot start {self.command[0]!r}: "
                                 f"{exc.strerror or exc}".encode())
            self._report(Ended(self.rank, 127, None, tuple(self.last_words)))
            return 127
        for fd in (notes_write, out_write, err_write):
            os.close(fd)
        selector = selectors.DefaultSelector()
        for fd, what in ((out_read, "stdout"), (err_read, "stderr"), (notes_read, "notes"), (wake_read, "wake")):
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_READ, what)
        notes = b""
        kill_at: float | None = None
        started = next_look = time.monotonic()
        code = None
        while code is None:
            now = time.monotonic()
            if now >= next_look or self._look:
                self.segments |= mapped_segments(child.pid)
                next_look = now + LOOK_EVERY[self._ready or now - started > EARLY]
                self._look = False
            notes = self._serve(selector, 0.5, notes)
            if self._orphaned is not None and time.monotonic() - self._orphaned > ORPHAN_GRACE and kill_at is None:
                self._signalled = self._signalled or signal.SIGTERM
            if self._signalled is not None:
                sig, self._signalled = self._signalled, None
                self.stopped = True
                self.segments |= mapped_segments(child.pid)
                with contextlib.suppress(OSError):
                    child.send_signal(sig)
                if sig == signal.SIGTERM and kill_at is None:
                    kill_at = time.monotonic() + GRACE
            if kill_at is not None and time.monotonic() > kill_at:
                with contextlib.suppress(OSError):
                    child.kill()
                kill_at = float("inf")
            self._flush()
            code = child.poll()
        self._drain(selector, notes)
        removed = remove_left(self.segments)
        signal_number = -code if code < 0 else None
        self._report(Ended(self.rank, None if signal_number else code, signal_number, tuple(self.last_words),
                           tuple(removed), self.stopped))
        return code

    def _serve(self, selector: selectors.BaseSelector, timeout: float, notes: bytes) -> bytes:
        """Take what the rank's pipes hold within ``timeout`` (output lines, notes); a pipe that
        closed is let go. Returns the notes not yet complete."""
        for key, _ in selector.select(timeout=timeout):
            data = _read(key.fd)
            if key.data == "wake" or data is None:
                continue
            if data == b"":
                selector.unregister(key.fd)
                os.close(key.fd)
            elif key.data == "notes":
                notes = self._notes(notes + data)
            else:
                self._take(key.data, data)
        return notes

    def _drain(self, selector: selectors.BaseSelector, notes: bytes) -> None:
        """What the rank wrote just before it ended (up to a second: a process it started may
        hold its output open)."""
        deadline = time.monotonic() + 1.0
        while any(k.data != "wake" for k in selector.get_map().values()) and time.monotonic() < deadline:
            notes = self._serve(selector, 0.1, notes)
        for stream, rest in self._partial.items():
            if rest:
                self._line(stream, rest)
        self._partial = {"stdout": b"", "stderr": b""}

    # -- what the rank says -----------------------------------------------------------------
    def _take(self, stream: str, data: bytes) -> None:
        buffered = self._partial[stream] + data
        *lines, rest = buffered.split(b"\n")
        for line in lines:
            self._line(stream, line)
        while len(rest) > MAX_LINE:
            self._line(stream, rest[:MAX_LINE])
            rest = rest[MAX_LINE:]
        self._partial[stream] = rest

    def _line(self, stream: str, line: bytes) -> None:
        text = line.decode("utf-8", "surrogateescape")
        if stream == "stderr":
            self.last_words.append(text.encode("utf-8", "replace").decode("utf-8")[:500])
            aborted = _MPI_ABORT.search(text)
            if aborted:  # the program called MPI_Abort itself: the launcher kills the job; say who and why
                self._send(Noted(self.rank, Note("abort", text[:500], code=int(aborted.group(1)))))
        if self.sock is None:
            fd = 1 if stream == "stdout" else 2
            with contextlib.suppress(OSError):
                os.write(fd, f"[{self.rank}]<{stream}>:".encode() + line + b"\n")
            return
        self._send(Output(self.rank, stream, text))

    def _notes(self, data: bytes) -> bytes:
        *lines, rest = data.split(b"\n")
        for line in lines:
            try:
                note = Note.decode(line)
            except ValueError:
                continue
            self._send(Noted(self.rank, note))
            self._look = self._look or note.kind == "ready"
            self._ready = self._ready or note.kind == "ready"
        return rest

    # -- to ddlrun --------------------------------------------------------------------------
    def _send(self, message: Message) -> None:
        if self.sock is not None:
            self._queued.append(protocol.encode(message))

    def _flush(self) -> None:
        if self.sock is None or not self._queued:
            return
        data, self._queued = b"".join(self._queued), []
        try:
            self.sock.sendall(data)
        except OSError:  # ddlrun is gone: keep the rank's output where mpiexec can show it
            self.sock = None
            with contextlib.suppress(OSError):
                os.write(2, b"ddl: lost the connection to ddlrun; this rank goes on without it\n")

    def _report(self, ended: Ended) -> None:
        self._send(ended)
        self._flush()
        if self.sock is not None:
            self.reported = True
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_WR)
                self.sock.settimeout(2.0)
                self.sock.recv(1)  # ddlrun closes once it has read everything
            self.sock.close()
            self.sock = None

    def _say(self, text: str) -> None:
        with contextlib.suppress(OSError):
            os.write(2, (text + "\n").encode())


def _read(fd: int) -> bytes | None:
    """Up to 64 KiB from ``fd``: b'' at its end, None when nothing is there just now."""
    try:
        return os.read(fd, 65536)
    except BlockingIOError:
        return None
    except OSError:
        return b""


if __name__ == "__main__":
    raise SystemExit(main())
