"""Host discovery beside the supervisor's loop: a thread runs the script and posts typed events; a pure machine judges them.

Cloud and cluster APIs answer in seconds, and a script may hang, fail or print what is
not a host list; none of that may hold up the loop that keeps the job alive (the agents
fence themselves after ``--elastic-timeout`` without a word from ``ddlrun``). So
:class:`DiscoveryRunner` runs the script in a thread, one run at a time, each in its own
session and killed (with whatever it started) at ``--discovery-timeout``, and posts a
:class:`Discovered` or :class:`DiscoveryFailed` event to the supervisor's queue.
:func:`step` decides what each one means (transitions D1..D7 of :data:`TRANSITIONS`,
tested in ``tests/tier1/test_elastic_machines.py``): the hosts for the membership, the
lines for ddlrun's log (once per change, not once a second), and whether the job can
start at all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable

from ddl.launcher.hosts import HostListError, HostSlots, parse_hostfile

TRANSITIONS: dict[str, str] = {
    "D1": "a list arrived: the membership takes it",
    "D2": "lines that are not host[:slots] were skipped: named in the log when they change",
    "D3": "discovery failed (non-zero status, killed at its timeout, nothing but garbage, could not run) with a "
          "list known: logged when it starts failing or the reason changes; the last list is kept",
    "D4": "a list arrived after failures: logged, with how long discovery failed",
    "D5": "the first discovery failed: the job ends with the reason (no host is known)",
    "D6": "a list took longer than --elastic-timeout to come: logged once per slow spell (the loop never waited)",
    "D7": "a failure repeats with the same reason: nothing new to log",
}


# -- events (posted by the runner) -----------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Discovered:
    """A run of the script ended with a list (``skipped``: the lines that were not ``host[:slots]``)."""

    hosts: tuple[HostSlots, ...]
    skipped: tuple[str, ...]
    seconds: float
    at: float


@dataclasses.dataclass(frozen=True)
class DiscoveryFailed:
    """A run of the script gave no list; ``why`` says how it failed."""

    why: str
    seconds: float
    at: float


DiscoveryEvent = Discovered | DiscoveryFailed


# -- actions ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Observe:
    """Give the membership this list."""

    hosts: tuple[HostSlots, ...]


@dataclasses.dataclass(frozen=True)
class DiscoveryNote:
    text: str


@dataclasses.dataclass(frozen=True)
class FailJob:
    message: str


DiscoveryAction = Observe | DiscoveryNote | FailJob


@dataclasses.dataclass(frozen=True, kw_only=True)
class DiscoveryState:
    known: bool = False  # a list arrived once
    failing_since: float | None = None
    failures: int = 0
    last_failure: str = ""
    skipped: tuple[str, ...] = ()
    slow: bool = False


def step(state: DiscoveryState, event: DiscoveryEvent, *, slow_after: float,
         script: str) -> tuple[DiscoveryState, list[DiscoveryAction]]:
    """The discovery after ``event`` and what the supervisor must do (see :data:`TRANSITIONS`).

    Args:
        slow_after: a run longer than this is logged (``--elastic-timeout``).
        script: the script's path, for the log lines.
    """
    actions: list[DiscoveryAction] = []
    if isinstance(event, Discovered):
        slow = event.seconds > slow_after
        if slow and not state.slow:  # D6
            actions.append(DiscoveryNote(f"host discovery took {event.seconds:.1f} s (the job went on meanwhile; runs "
                                "start one after another, so new hosts are seen that much later)"))
        state = dataclasses.replace(state, slow=slow)
    if isinstance(event, DiscoveryFailed):
        if not state.known:  # D5
            return state, [*actions, FailJob(f"the first host discovery failed: {event.why}; fix {script} (it must "
                                             "print host[:slots] lines and exit 0) and start the job again")]
        if event.why != state.last_failure:  # D3
            actions.append(DiscoveryNote(f"host discovery failed: {event.why}; keeping the last list "
                                f"({state.failures + 1} failure(s) in a row)"))
        # D7: the same reason again: already said
        began = event.at - event.seconds  # the failing run's start: a hang counts from when it began
        return dataclasses.replace(state, failing_since=state.failing_since if state.failing_since is not None
                                   else began, failures=state.failures + 1, last_failure=event.why), actions
    if state.failing_since is not None:  # D4
        actions.append(DiscoveryNote(f"host discovery works again after {state.failures} failure(s) over "
                            f"{event.at - state.failing_since:.1f} s"))
    if event.skipped and event.skipped != state.skipped:  # D2
        actions.append(DiscoveryNote(f"host discovery printed {len(event.skipped)} line(s) that are not host[:slots], "
                            f"skipped: {'; '.join(event.skipped)}"))
    actions.append(Observe(event.hosts))  # D1
    return dataclasses.replace(state, known=True, failing_since=None, failures=0, last_failure="",
                               skipped=event.skipped), actions


# -- the script's output ---------------------------------------------------------------------------

def parse_lenient(text: str, *, default_slots: int, source: str) -> tuple[tuple[HostSlots, ...], tuple[str, ...]]:
    """``host[:slots]`` lines (Horovod's contract; ``#`` comments and blank lines ignored), and
    a description of each line that is not one (skipped, not fatal).

    Example:
        >>> parse_lenient("h1:2\\nh2\\n<html>\\n", default_slots=4, source="d.sh")
        ((HostSlots(name='h1', slots=2), HostSlots(name='h2', slots=4)), ("d.sh line 3: '<html>'",))
    """
    slots: dict[str, int] = {}  # a host listed twice gets the sum, as in a hostfile
    skipped: list[str] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        entry = line if ":" in line or "slots=" in line else f"{line}:{default_slots}"
        try:
            [host] = parse_hostfile(entry, source=f"{source} line {number}")
            if not _HOST_NAME.match(host.name):
                raise HostListError(host.name)
        except (HostListError, ValueError):
            skipped.append(f"{source} line {number}: {line[:80]!r}")
            continue
        slots[host.name] = slots.get(host.name, 0) + host.slots
    return tuple(HostSlots(name, n) for name, n in slots.items()), tuple(skipped)


#: A host name or IPv4 address, as ssh and mpiexec take it.
_HOST_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")


def run_once(script: str, *, default_slots: int, timeout: float,
             started: Callable[[subprocess.Popen[str] | None], None] = lambda proc: None) -> DiscoveryEvent:
    """Run the script once, killing it and everything it started after ``timeout`` seconds.

    ``started`` is told the running process (then None once it is over), for :meth:`DiscoveryRunner.stop`.
    """
    start = time.monotonic()

    def failed(why: str) -> DiscoveryFailed:
        return DiscoveryFailed(why, time.monotonic() - start, time.monotonic())

    try:
        proc = subprocess.Popen([script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                text=True, errors="replace", start_new_session=True)
    except OSError as exc:
        return failed(f"{script} could not run: {exc}")
    started(proc)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_session(proc)
        return failed(f"{script} did not finish in {timeout:g} s (--discovery-timeout); killed")
    except (OSError, ValueError) as exc:  # killed and closed by stop() meanwhile
        return failed(f"{script} was stopped ({exc})")
    finally:
        started(None)
    if proc.returncode != 0:
        tail = err.strip().splitlines()[-1][:200] if err.strip() else "no output on stderr"
        return failed(f"{script} exited with status {proc.returncode} ({tail})")
    hosts, skipped = parse_lenient(out, default_slots=default_slots, source=script)
    if skipped and not hosts:
        return failed(f"{script} printed no host[:slots] line, only: {'; '.join(skipped[:3])}")
    return Discovered(hosts, skipped, time.monotonic() - start, time.monotonic())


def kill_session(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the script's session (a shell's ``sleep`` holds the pipes open otherwise), then reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        proc.communicate(timeout=2.0)
    except subprocess.TimeoutExpired:  # a descendant that left the session still holds a pipe
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        proc.wait(timeout=2.0)


class DiscoveryRunner:
    """Runs the discovery script in a thread, one run at a time, ``interval`` seconds apart, and
    hands each outcome to ``post`` (the supervisor's queue).

    Example:
        >>> import queue
        >>> events = queue.Queue()
        >>> runner = DiscoveryRunner("/bin/false", default_slots=1, interval=1.0, timeout=5.0, post=events.put)
        >>> runner.start(); first = events.get(timeout=10); runner.stop()
        >>> type(first).__name__, "exited with status 1" in first.why
        ('DiscoveryFailed', True)
    """

    def __init__(self, script: str, *, default_slots: int, interval: float, timeout: float,
                 post: Callable[[DiscoveryEvent], None]) -> None:
        self.script, self.default_slots, self.interval, self.timeout = script, default_slots, interval, timeout
        self._post = post
        self._stop = threading.Event()
        self._running: subprocess.Popen[str] | None = None
        self._thread = threading.Thread(target=self._run, name="ddlrun-elastic-discovery", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            event = run_once(self.script, default_slots=self.default_slots, timeout=self.timeout,
                             started=self._started)
            if self._stop.is_set():
                return
            self._post(event)
            self._stop.wait(self.interval)

    def _started(self, proc: subprocess.Popen[str] | None) -> None:
        self._running = proc

    def stop(self) -> None:
        """No further runs; a run in progress is killed with what it started (the job leaves nothing behind)."""
        self._stop.set()
        proc = self._running
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)
