"""Where no ``ddlrun`` keeper watches a rank: a bounded wait for the world in ``ddl.init``, and
the shared memory the rank leaves behind.

``MPI_Init`` waits for every rank the launcher started. A rank that failed before its
``ddl.init`` (an import error, a missing file on one host, a bad argument) never comes,
and under a plain ``mpiexec`` the others would wait forever: MPI has no timeout, and
``MPI_Init`` holds the interpreter, so no thread of this process can end the wait.

So a forked watcher does: it waits ``DDL_INIT_TIMEOUT`` seconds for this process to say
that MPI started, then says what happened and ends it (SIGTERM, then SIGKILL). Which
rank failed cannot be known from here (no rank can talk to another before MPI starts);
under ``ddlrun`` its keeper reports it at once. Once MPI has started the watcher stays,
asleep, in a session of its own (out of reach of a launcher that kills process groups),
and when the process ends it removes the ``/dev/shm`` segments the process had mapped
that no live process maps any more: those an MPI killed or aborted never unlinks.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
import warnings

from ddl.wire.shm_segments import Segment, mapped_segments, remove_left

#: Seconds between looks at the process's mapped shared memory: while it starts MPI, after.
_LOOK_EVERY = (0.25, 2.0)
_STARTED = b"k"


class InitWatch:
    """The parent's end: :meth:`started` once MPI is up (the watcher then only cleans up after it)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def started(self) -> None:
        """MPI is up: the watcher stops counting, and takes what this process maps now (MPI's
        segments) with it, in case the process dies before it next looks."""
        mine = "".join(f"{s.path}\t{s.device}\t{s.inode}\n" for s in mapped_segments(os.getpid()))
        with contextlib.suppress(OSError):
            os.write(self._fd, _STARTED + mine.encode())
        # The pipe stays open (and closes when this process ends), as does the watcher.

    def close(self) -> None:
        """Drop the watch without a word (init failed here: the process's own error says why)."""
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1


def start(*, timeout: float, rank: int | None, size: int | None, host: str) -> InitWatch | None:
    """Fork the watcher (a grandchild in a session of its own, so nothing waits for it); None if
    it cannot be forked (the wait is then unbounded, as without ddl)."""
    read_end, write_end = os.pipe()
    parent = os.getpid()
    try:
        with warnings.catch_warnings():  # Python 3.12+ warns about fork in a threaded process
            warnings.simplefilter("ignore", DeprecationWarning)
            child = os.fork()
    except OSError:
        os.close(read_end)
        os.close(write_end)
        return None
    if child == 0:  # the intermediate child: start the watcher and go at once
        code = 0
        try:
            os.close(write_end)
            os.setsid()
            if os.fork() == 0:
                _watch(read_end, parent, timeout, rank, size, host)
        except BaseException:  # noqa: BLE001 - never return into the parent's program
            code = 1
        os._exit(code)
    os.close(read_end)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(child, 0)
    return InitWatch(write_end)


def _watch(fd: int, parent: int, timeout: float, rank: int | None, size: int | None, host: str) -> None:
    """The watcher's whole life; never returns."""
    try:
        os.closerange(3, fd)
        os.closerange(fd + 1, 1 << 16)
        deadline = time.monotonic() + timeout
        segments: set[Segment] = set()
        started = False
        told = b""
        while _alive(parent) or not started and told:
            segments |= mapped_segments(parent)
            left = deadline - time.monotonic()
            if not started and left <= 0:
                _say(_message(timeout, rank, size, host))
                _end(parent)
                break
            wait = _LOOK_EVERY[started] if started else min(_LOOK_EVERY[0], left)
            ready, _, _ = select.select([fd], [], [], wait)
            if ready:
                data = os.read(fd, 1 << 16)
                if data and not started:
                    told += data
                    if told.startswith(_STARTED) and told.endswith(b"\n") or told == _STARTED:
                        started = True
                        segments |= _parse(told[len(_STARTED):])
                        _quiet()  # keep no pipe of the launcher's open past the process's end
                elif not data:  # the process closed its end: it ended, or init failed and it goes on alone
                    if not _wait_gone(parent, 5.0):
                        os._exit(0)  # it lives on without MPI: nothing of it is ours to clean
                    break
        _wait_gone(parent, 5.0)
        if not started:  # it may have died (killed at once) before this watcher read its word
            told += _drain(fd)
            if told.startswith(_STARTED):
                segments |= _parse(told[len(_STARTED):])
        remove_left(segments)
        os._exit(0)
    except BaseException:  # noqa: BLE001
        os._exit(1)


def _drain(fd: int) -> bytes:
    """What is left in the pipe of a process that has ended (its end is closed: EOF comes)."""
    data = b""
    while select.select([fd], [], [], 1.0)[0]:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        data += chunk
    return data


def _parse(text: bytes) -> set[Segment]:
    found = set()
    for line in text.decode(errors="replace").splitlines():
        path, _, rest = line.partition("\t")
        device, _, inode = rest.partition("\t")
        if device.isdigit() and inode.isdigit():
            found.add(Segment(path, int(device), int(inode)))
    return found


def _quiet() -> None:
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)


def _message(timeout: float, rank: int | None, size: int | None, host: str) -> str:
    who = f"rank {rank if rank is not None else '?'} of {size if size is not None else '?'} (host {host})"
    return (f"ddl: {who}: the other ranks did not all start MPI within {timeout:g} s of this rank's ddl.init "
            "(DDL_INIT_TIMEOUT): a rank failed or exited before its ddl.init (look for its error above), or is "
            "still busy before it. Ending this rank, so the job does not wait forever. Under ddlrun a rank that "
            "ends before init ends the job at once, naming it; raise DDL_INIT_TIMEOUT if ranks legitimately "
            "reach ddl.init that far apart.\n")


def _say(text: str) -> None:
    with contextlib.suppress(OSError):
        os.write(2, text.encode())


def _end(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGTERM)
    if not _wait_gone(pid, 3.0):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        _wait_gone(pid, 3.0)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[-1].split()[0] != "Z"  # a zombie has ended
    except OSError:
        return False


def _wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
