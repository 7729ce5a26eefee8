"""A chaos run: elastic training on emulated hosts under the faults real clusters bring, and the table of what it cost.

    python -m emulation.chaos --hosts 4 --faults 20 --seed 1             (as root)
    python -m emulation.chaos --hosts 4 --faults 18 --seed 11,12,13      (the long run: 54 faults)

``ddlrun --elastic`` trains :mod:`emulation.chaos_train` (float64 softmax regression, a
global batch fixed by the step) on ``--hosts`` emulated hosts of one rank each, and this
driver injects ``--faults`` faults, one at a time at a random moment of a steady world (a
world of every host that has run a few steps), drawn by ``--seed`` from :data:`KINDS`:
a host's link down, a host SIGKILLed, a host frozen (SIGSTOP, SIGCONT later), a flapping
link, two hosts at once, a host dying inside a commit, a host lost while a new world syncs,
a host lost while another joins, a discovery that is slow (5-30 s), fails, prints garbage
or hangs, a straggler (a host at a third of its speed), a rank that exits mid-step, a rank
SIGKILLed or frozen alone (its host's agent fine). After each fault the host is healed
and listed again (as a scheduler would), and the job grows back to every host before the
next fault. Then the job is told to finish (a file the program reads at a commit).

It prints one row per fault kind: how many, how many ended a world, the worst recovery
(fault -> first step of the next world), the most steps lost (the last step reached -
the step the next world resumed after; at most one commit interval), and checks: the job
finished (rc 0), no traceback anywhere in the output, every rank's final weights
identical, and equal to a one-process replay of the steps with the same world sizes
(:func:`emulation.chaos_train.replay`, <= 1e-6), with the load average beside them.
Faults that must not end a world (discovery, straggler) are checked not to.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from emulation.chaos_train import replay
from emulation.cluster import Cluster
from emulation.elastic_run import kill_host, set_link

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "emulation" / "chaos_train.py"
COMMIT_EVERY = 5
RECOVERY_TARGET = 10.0
#: --discovery-timeout of the chaos job: a slow discovery (up to 30 s) still answers, a hanging one is killed.
DISCOVERY_TIMEOUT = 40.0

_LOG = re.compile(r"ddlrun: elastic \[\s*([\d.]+) s\] ([^\n]*)")
_STARTED = re.compile(r"started at unix time ([\d.]+)")
_STEP = re.compile(r"STEP (\d+) world (\d+) size (\d+) t=(\d+\.\d+)")
_FINAL = re.compile(r"FINAL rank (\d+) size (\d+) step (\d+) digest ([0-9a-f]{16})")
_CRASH = re.compile(r"CRASH host=(h\d+) inside commit \d+ t=(\d+\.\d+)")
_WORLD = re.compile(r"world (\d+): starting \d+ rank\(s\) on (\S+)")


@dataclasses.dataclass
class Fault:
    kind: str
    hosts: tuple[str, ...]
    at: float  # unix time of the injection
    world: int  # the world it hit
    ends_world: bool  # whether it must end that world
    recovered_at: float | None = None  # first step of a later world
    detected_at: float | None = None  # ddlrun's first "lost host" (or left-at-once) line after it
    resumed_after: int | None = None
    last_step: int | None = None
    ended_world: bool = False
    problem: str = ""

    @property
    def recovery(self) -> float | None:
        return None if self.recovered_at is None else self.recovered_at - self.at

    @property
    def detection(self) -> float | None:
        return None if self.detected_at is None else self.detected_at - self.at

    @property
    def steps_lost(self) -> int:
        if self.resumed_after is None or self.last_step is None:
            return 0
        return max(0, self.last_step - self.resumed_after)


@dataclasses.dataclass
class Rejoin:
    """A failed host listed again: seconds from the relisting until ddlrun let it back in (discovery), its
    agent was ready (started and preloaded), and the first step of a world with it; a commit interval then."""

    host: str
    seconds: float | None
    seen: float | None
    ready: float | None
    commit_interval: float

    @property
    def beyond(self) -> float | None:
        """Seconds past the agent's readiness + one commit interval (the next world's start and sync)."""
        if self.seconds is None or self.ready is None:
            return None
        return self.seconds - self.ready - self.commit_interval


class Job:
    """``ddlrun --elastic``'s output, read by a thread, and what it says so far."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.lines: list[str] = []
        self.start_unix = 0.0
        self.events: list[tuple[float, str]] = []
        self.steps: list[tuple[int, int, int, float]] = []  # step, world, size, t
        self.finals: dict[int, tuple[int, int, str]] = {}
        self.crashes: list[tuple[str, float]] = []
        self.worlds: dict[int, tuple[float, tuple[str, ...]]] = {}  # world -> (logged at, hosts)
        self.cond = threading.Condition()
        self.ended = False
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            line = raw.rstrip("\n")
            with self.cond:
                self.lines.append(line)
                if not self.start_unix and (m := _STARTED.search(line)):
                    self.start_unix = float(m[1])
                for m in _LOG.finditer(line):
                    at = self.start_unix + float(m[1])
                    self.events.append((at, m[2]))
                    if w := _WORLD.search(m[2]):
                        self.worlds[int(w[1])] = (at, tuple(h.split(":")[0] for h in w[2].split(",")))
                for m in _STEP.finditer(line):  # hydra may join two ranks' lines into one
                    self.steps.append((int(m[1]), int(m[2]), int(m[3]), float(m[4])))
                for m in _FINAL.finditer(line):
                    self.finals[int(m[1])] = (int(m[2]), int(m[3]), m[4])
                for m in _CRASH.finditer(line):
                    self.crashes.append((m[1], float(m[2])))
                self.cond.notify_all()
        with self.cond:
            self.ended = True
            self.cond.notify_all()

    def wait(self, predicate: Callable[[], object], timeout: float) -> object:
        """The predicate's first truthy value within ``timeout`` seconds (None if it never was, or the job ended)."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                value = predicate()
                if value or self.ended:
                    return value or None
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(min(left, 0.5))

    # -- what the output says (call with self.cond held, or accept a moment's staleness) --
    def world(self) -> tuple[int, int]:
        """(world, size) of the last step."""
        return (self.steps[-1][1], self.steps[-1][2]) if self.steps else (0, 0)

    def steps_in(self, world: int) -> list[int]:
        return [s for s, w, _, _ in self.steps if w == world]

    def event_after(self, text: str, after: float) -> float | None:
        return next((t for t, line in self.events if text in line and t >= after), None)

    def text(self) -> str:
        with self.cond:
            return "\n".join(self.lines)


class Chaos:
    """The cluster, the job and the control files; each scenario is a method ``kind_<name>``."""

    def __init__(self, cluster: Cluster, rng: random.Random, *, say: Callable[[str], None]) -> None:
        assert cluster.workdir is not None
        self.cluster, self.rng, self.say = cluster, rng, say
        self.control = cluster.workdir / "control"
        self.control.mkdir()
        self.listing = self.control / "hosts.txt"
        self.mode = self.control / "mode"
        self.listing.write_text("".join(f"{h}:1\n" for h in cluster.hosts))
        self.mode.write_text("ok\n")
        self.discovery = self.control / "discover.sh"
        self.discovery.write_text(
            "#!/bin/sh\n# the chaos run's discovery: the listing, as the mode file says\n"
            f'mode=$(cat {self.mode})\ncase "$mode" in\n'
            f'  slow*) touch {self.control}/read-mode; sleep "${{mode#slow }}" ;;\n'
            '  fail) echo "the discovery API answered 503" >&2; exit 1 ;;\n'
            f"  hang) touch {self.control}/read-mode; exec sleep 100000 ;;\n"
            '  garbage) echo "<html><body>503 Service Unavailable</body></html>"; echo "h99:many" ;;\n'
            f"esac\ncat {self.listing}\n")
        self.discovery.chmod(0o755)
        self.job: Job | None = None
        self.faults: list[Fault] = []
        self.rejoins: list[Rejoin] = []
        self.loads: list[float] = []

    # -- the job -------------------------------------------------------------------------
    def start(self, *, seed: int, step_seconds: float, out: Path) -> Job:
        python = sys.executable
        argv = [python, "-m", "ddl.launcher.cli", "--elastic", "--min-np", "2", "--max-np", str(len(self.cluster.hosts)),
                "--host-discovery-script", str(self.discovery), "--discovery-timeout", f"{DISCOVERY_TIMEOUT:g}",
                "--calibration", "off", python, str(TRAIN), "--control", str(self.control), "--out", str(out),
                "--seed", str(seed), "--commit-every", str(COMMIT_EVERY), "--step-seconds", str(step_seconds)]
        process = subprocess.Popen(self.cluster.launch_argv(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, env=self.cluster.env())
        self.job = Job(process)
        return self.job

    @property
    def j(self) -> Job:
        assert self.job is not None
        return self.job

    def steady(self, *, timeout: float = 120.0) -> bool:
        """Wait for a world of every host that has run 3 steps."""
        full = len(self.cluster.hosts)

        def ready() -> bool:
            world, size = self.j.world()
            return size == full and len(self.j.steps_in(world)) >= 3

        return bool(self.j.wait(ready, timeout))

    def world_hosts(self) -> tuple[str, ...]:
        world, _ = self.j.world()
        return self.j.worlds.get(world, (0.0, tuple(self.cluster.hosts)))[1]

    def pick(self, n: int = 1, *, exclude: tuple[str, ...] = ()) -> tuple[str, ...]:
        hosts = [h for h in self.world_hosts() if h not in exclude]
        return tuple(self.rng.sample(hosts, n))

    # -- recording -------------------------------------------------------------------------
    def fault(self, kind: str, hosts: tuple[str, ...], *, ends_world: bool, at: float | None = None,
              world: int | None = None) -> Fault:
        with self.j.cond:
            record = Fault(kind, hosts, time.time() if at is None else at,
                           self.j.world()[0] if world is None else world, ends_world)
        self.faults.append(record)
        self.say(f"fault {len(self.faults)}: {kind} on {','.join(hosts) or 'discovery'} in world {record.world}")
        return record

    def await_recovery(self, fault: Fault, *, timeout: float = 60.0) -> None:
        """The first step of a world after the fault's; the steps it cost."""
        found = self.j.wait(lambda: next((s for s in self.j.steps if s[1] > fault.world and s[3] >= fault.at - 1),
                                         None), timeout)
        if not isinstance(found, tuple):
            fault.problem = f"no step of a later world within {timeout:g} s"
            return
        step, world, _, t = found
        with self.j.cond:
            fault.last_step = max((s for s, w, _, _ in self.j.steps if w <= fault.world), default=0)
        fault.recovered_at, fault.resumed_after, fault.ended_world = t, step - 1, True
        with self.j.cond:
            fault.detected_at = next((at for at, text in self.j.events if at >= fault.at - 0.5 and (
                ": lost host " in text or "left after a failed collective" in text or " lost (" in text)), None)
        self.say(f"  recovered in {t - fault.at:.2f} s: world {world} resumed after step {step - 1} "
                 f"({fault.steps_lost} step(s) lost)")

    def no_world_change(self, fault: Fault, until: float) -> None:
        """A fault that must not end a world: the world of the fault ran on through it."""
        self.j.wait(lambda: False, max(0.0, until - time.time()))
        with self.j.cond:
            later = [s for s in self.j.steps if s[1] > fault.world and s[3] >= fault.at]
            during = [s for s in self.j.steps if s[1] == fault.world and s[3] >= fault.at]
        if later:
            fault.ended_world = True
            fault.problem = f"world {fault.world} ended (world {later[0][1]} began)"
            self.await_recovery(fault)
        elif not during:
            fault.problem = "no step during the fault"
        self.say(f"  {len(during)} step(s) of world {fault.world} during it; "
                 f"{'ended the world: ' + fault.problem if fault.ended_world else 'no world change'}")

    # -- healing -------------------------------------------------------------------------------
    def lost_since(self, host: str, since: float) -> bool:
        return any(t >= since and (f"lost host {host} " in text or f"host {host} lost" in text)
                   for t, text in self.j.events)

    def heal(self, hosts: tuple[str, ...], since: float, *, down: tuple[str, ...] = ()) -> None:
        """List the failed hosts again after a spell off the list (a scheduler's replacement), and wait for
        the job to grow back to every host. A host lost that the fault did not touch is a problem of the fault.

        ``down``: hosts the fault took down, so ddlrun will say each is lost. The job may recover before
        it does (a world that was ending anyway), so wait for those lines, from the detection window's
        start, instead of reading the log once: a host healed too early is never listed again."""
        for host in down:
            self.j.wait(lambda host=host: self.lost_since(host, since - 0.5), 30.0)  # type: ignore[misc]
        failed = [h for h in self.cluster.hosts if self.lost_since(h, since - 0.5 if h in down else since)]
        blamed = [h for h in failed if h not in hosts]
        if blamed and self.faults:
            self.faults[-1].problem = f"also lost: {','.join(blamed)}"
            self.say(f"  {','.join(blamed)} lost too, though the fault did not touch it")
        if failed:
            self.relist(failed)
            relisted = time.time()
            full = len(self.cluster.hosts)
            found = self.j.wait(lambda: next((s for s in self.j.steps if s[2] == full and s[3] >= relisted), None),
                                120.0)
            with self.j.cond:
                recent = [t for _, _, _, t in self.j.steps[-4 * COMMIT_EVERY:]]
                interval = COMMIT_EVERY * float(np.median(np.diff(recent))) if len(recent) > 2 else 0.0
                for host in failed:
                    seen = self.j.event_after(f"host {host} may take part again", relisted - 0.5)
                    ready = self.j.event_after(f"agent on {host} ready", relisted - 0.5)
                    self.rejoins.append(Rejoin(host, found[3] - relisted if isinstance(found, tuple) else None,
                                               None if seen is None else seen - relisted,
                                               None if ready is None else max(0.0, ready - relisted), interval))
            if isinstance(found, tuple):
                self.say(f"  {','.join(failed)} rejoined {found[3] - relisted:.2f} s after being listed again")
            else:
                self.say(f"  {','.join(failed)} did not rejoin within 120 s")

    def relist(self, hosts: list[str]) -> None:
        """Leave ``hosts`` off the list until ddlrun has seen them gone, then list them again."""
        unlisted = time.time()
        self.listing.write_text("".join(f"{h}:1\n" for h in self.cluster.hosts if h not in hosts))
        for host in hosts:
            said = f"no longer lists failed host {host};"
            if not self.j.wait(lambda said=said: self.j.event_after(said, unlisted - 1), 60.0):  # type: ignore[misc]
                self.say(f"  ddlrun did not see {host} leave the list within 60 s")
        self.listing.write_text("".join(f"{h}:1\n" for h in self.cluster.hosts))

    def signal_host(self, host: str, sig: signal.Signals) -> None:
        for pid in self.cluster.pids(host):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def rank_pid(self, host: str) -> int | None:
        try:
            return int((self.control / f"pid-{host}").read_text())
        except (OSError, ValueError):
            return None

    # -- the scenarios -----------------------------------------------------------------------
    def kind_link_down(self) -> None:
        (h,) = self.pick()
        f = self.fault("link down", (h,), ends_world=True)
        set_link(self.cluster, h, up=False)
        self.await_recovery(f)
        time.sleep(self.rng.uniform(1, 3))
        set_link(self.cluster, h, up=True)
        self.heal((h,), f.at, down=(h,))

    def kind_sigkill_host(self) -> str:
        (h,) = self.pick()
        f = self.fault("SIGKILL of a host", (h,), ends_world=True)
        kill_host(self.cluster, h)
        self.await_recovery(f)
        return h

    def kind_sigkill(self) -> None:
        h = self.kind_sigkill_host()
        self.heal((h,), self.faults[-1].at, down=(h,))

    def kind_sigstop_host(self) -> None:
        (h,) = self.pick()
        f = self.fault("SIGSTOP of a host", (h,), ends_world=True)
        self.signal_host(h, signal.SIGSTOP)
        self.await_recovery(f)
        time.sleep(self.rng.uniform(1, 4))
        self.signal_host(h, signal.SIGCONT)  # its agent wakes to a closed connection and ends its ranks
        time.sleep(1.0)
        self.heal((h,), f.at, down=(h,))

    def kind_flapping_link(self) -> None:
        (h,) = self.pick()
        f = self.fault("flapping link", (h,), ends_world=False)
        downs = []
        for _ in range(4):
            downs.append(time.time())
            set_link(self.cluster, h, up=False)
            time.sleep(self.rng.uniform(0.5, 2.5))
            set_link(self.cluster, h, up=True)
            time.sleep(self.rng.uniform(1.0, 4.0))
        detected = self.j.event_after(f"lost host {h}", f.at)
        if detected is not None:
            f.ends_world = True
            f.at = max(t for t in downs if t <= detected)  # the spell that was noticed
            self.await_recovery(f)
        else:
            self.no_world_change(f, time.time())
        self.heal((h,), f.at)

    def kind_two_hosts(self) -> None:
        hosts = self.pick(2)
        f = self.fault("two hosts at once", hosts, ends_world=True)
        for h in hosts:
            kill_host(self.cluster, h)
        self.await_recovery(f)
        self.heal(hosts, f.at, down=hosts)

    def kind_in_commit(self) -> None:
        (h,) = self.pick()
        seen = len(self.j.crashes)
        (self.control / f"crash-in-commit-{h}").write_text("")
        crashed = self.j.wait(lambda: self.j.crashes[seen] if len(self.j.crashes) > seen else None, 30.0)
        if not isinstance(crashed, tuple):
            (self.control / f"crash-in-commit-{h}").unlink(missing_ok=True)
            self.fault("fault inside a commit", (h,), ends_world=True).problem = "the host did not reach a commit"
            return
        f = self.fault("fault inside a commit", (h,), ends_world=True, at=crashed[1])
        kill_host(self.cluster, h)  # what the crash left of the host (hydra's proxy)
        self.await_recovery(f)
        self.heal((h,), f.at, down=(h,))

    def _during_rejoin(self, kind: str, trigger: Callable[[str, float], bool], *, starting: bool) -> None:
        """A host is lost and listed again; when ``trigger(host, relisted)`` holds, another host dies."""
        x = self.kind_sigkill_host()
        lost_at = self.faults[-1].at
        self.relist([x])
        relisted = time.time()
        if not self.j.wait(lambda: trigger(x, relisted), 90.0):
            self.fault(kind, (), ends_world=True).problem = "the rejoin it needs never came"
            self.heal((x,), lost_at)
            return
        with self.j.cond:
            world = max(self.j.worlds)
            (y,) = self.rng.sample([h for h in self.j.worlds[world][1] if h != x] or [self.cluster.hosts[0]], 1)
        f = self.fault(kind, (y,), ends_world=True, world=world if starting else None)
        kill_host(self.cluster, y)
        self.await_recovery(f)
        self.heal((x, y), f.at, down=(y,))

    def kind_in_sync(self) -> None:
        def starting(x: str, relisted: float) -> bool:
            return any(t >= relisted and x in hosts for t, hosts in self.j.worlds.values())

        self._during_rejoin("fault while a new world syncs", starting, starting=True)

    def kind_while_joining(self) -> None:
        def announced(x: str, relisted: float) -> bool:
            return self.j.event_after("hosts changed, next world", relisted) is not None

        self._during_rejoin("fault while a host joins", announced, starting=False)

    def _discovery(self, kind: str, mode: str, seconds: float) -> None:
        f = self.fault(kind, (), ends_world=False)
        self.mode.write_text(mode + "\n")
        time.sleep(seconds)
        self.mode.write_text("ok\n")
        self.no_world_change(f, time.time() + 1.0)

    def _one_run(self, kind: str, mode: str, lasts: float) -> None:
        """One discovery run misbehaves (the script says when it read the mode); the job is watched while it lasts."""
        f = self.fault(kind, (), ends_world=False)
        marker = self.control / "read-mode"
        marker.unlink(missing_ok=True)
        self.mode.write_text(mode + "\n")
        deadline = time.time() + 10
        while not marker.exists() and time.time() < deadline:
            time.sleep(0.05)
        self.mode.write_text("ok\n")
        self.no_world_change(f, time.time() + lasts + 1.5)

    def kind_slow_discovery(self) -> None:
        s = self.rng.uniform(5, 30)
        self._one_run(f"slow discovery ({s:.0f} s)", f"slow {s:.1f}", s)

    def kind_failing_discovery(self) -> None:
        self._discovery("failing discovery", "fail", self.rng.uniform(3, 8))

    def kind_garbage_discovery(self) -> None:
        self._discovery("discovery printing garbage", "garbage", self.rng.uniform(3, 6))

    def kind_hanging_discovery(self) -> None:
        self._one_run("hanging discovery", "hang", DISCOVERY_TIMEOUT)

    def kind_straggler(self) -> None:
        (h,) = self.pick()
        f = self.fault("straggler (1/3 speed)", (h,), ends_world=False)
        end = time.time() + self.rng.uniform(6, 12)
        while time.time() < end:  # a host at a third of its speed: stopped 0.2 s of every 0.3 s
            self.signal_host(h, signal.SIGSTOP)
            time.sleep(0.2)
            self.signal_host(h, signal.SIGCONT)
            time.sleep(0.1)
        self.no_world_change(f, time.time())
        self.heal((h,), f.at)

    def kind_rank_exit(self) -> None:
        (h,) = self.pick()
        code = self.rng.choice([0, 3])
        f = self.fault(f"a rank exits mid-step (status {code})", (h,), ends_world=True)
        (self.control / f"exit-{h}").write_text(str(code))
        self.await_recovery(f)
        self.heal((h,), f.at)

    def kind_rank_kill(self) -> None:
        (h,) = self.pick()
        pid = self.rank_pid(h)
        f = self.fault("SIGKILL of a rank alone", (h,), ends_world=True)
        if pid is None:
            f.problem = "no rank pid"
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        self.await_recovery(f)
        self.heal((h,), f.at)

    def kind_sigstop_rank(self) -> None:
        (h,) = self.pick()
        pid = self.rank_pid(h)
        f = self.fault("SIGSTOP of a rank alone", (h,), ends_world=True)
        if pid is None:
            f.problem = "no rank pid"
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
        self.await_recovery(f)
        self.heal((h,), f.at)


#: Every fault kind, by its command-line name (the method ``Chaos.kind_<name>``).
KINDS = ("link_down", "sigkill", "sigstop_host", "flapping_link", "two_hosts", "in_commit", "in_sync",
         "while_joining", "slow_discovery", "failing_discovery", "garbage_discovery", "hanging_discovery",
         "straggler", "rank_exit", "rank_kill", "sigstop_rank")


@dataclasses.dataclass
class Report:
    rc: int
    faults: list[Fault]
    rejoins: list[Rejoin]
    finals: dict[int, tuple[int, int, str]]
    replay_diff: float | None
    tracebacks: list[str]
    loads: list[float]
    seconds: float
    steps: int
    problems: list[str]

    def table(self) -> str:
        rows: dict[str, list[Fault]] = {}
        for f in self.faults:
            rows.setdefault(re.sub(r" \(\d+ s\)$", "", re.sub(r"\(status \d\)", "", f.kind)).strip(), []).append(f)
        lines = ["| fault | count | ended a world | worst detection | worst recovery | most steps lost | problems |",
                 "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
        for kind, fs in rows.items():
            recoveries = [f.recovery for f in fs if f.recovery is not None]
            detections = [f.detection for f in fs if f.detection is not None]
            worst = f"{max(recoveries):.2f} s" if recoveries else "-"
            detected = f"{max(detections):.2f} s" if detections else "-"
            problems = "; ".join(sorted({f.problem for f in fs if f.problem})) or ""
            lines.append(f"| {kind} | {len(fs)} | {sum(f.ended_world for f in fs)} | {detected} | {worst} | "
                         f"{max(f.steps_lost for f in fs)} | {problems} |")
        return "\n".join(lines)

    def summary(self) -> str:
        digests = {d for _, _, d in self.finals.values()}
        rejoin = [r.seconds for r in self.rejoins if r.seconds is not None]
        beyond = [r.beyond for r in self.rejoins if r.beyond is not None]
        ready = [r.ready for r in self.rejoins if r.ready is not None]
        seen = [r.seen for r in self.rejoins if r.seen is not None]
        interval = [r.commit_interval for r in self.rejoins]
        loads = f"{min(self.loads):.1f} to {max(self.loads):.1f}" if self.loads else "-"
        return "\n".join([
            f"{len(self.faults)} faults of {len({f.kind.split(' (')[0] for f in self.faults})} kinds over "
            f"{self.seconds:.0f} s, {self.steps} steps; load average (1 min) {loads}",
            f"job: rc {self.rc}; tracebacks in the output: {len(self.tracebacks)}",
            f"recoveries: {sum(f.recovery is not None for f in self.faults)}, worst "
            f"{max((f.recovery for f in self.faults if f.recovery is not None), default=0):.2f} s (target <= "
            f"{RECOVERY_TARGET:g} s); most steps lost {max((f.steps_lost for f in self.faults), default=0)} "
            f"(commit interval {COMMIT_EVERY})",
            f"rejoins: {len(self.rejoins)}, worst {max(rejoin, default=0):.2f} s from being listed again to a step "
            f"with it{'' if len(rejoin) == len(self.rejoins) else ', ' + str(len(self.rejoins) - len(rejoin)) + ' never'}"
            f" (seen by discovery within {max(seen, default=0):.2f} s, its agent ready within "
            f"{max(ready, default=0):.2f} s, a commit interval up to {max(interval, default=0):.2f} s; beyond ready + "
            f"one commit interval at most {max(beyond, default=0):.2f} s: the next world's start and sync)",
            f"final weights: {len(self.finals)} rank(s), {'identical' if len(digests) == 1 else 'DIFFERENT'} "
            f"({', '.join(sorted(digests))}); one-process replay max |diff| "
            f"{'-' if self.replay_diff is None else f'{self.replay_diff:.3g}'} (target <= 1e-6)",
            "targets: " + ("met" if not self.problems else "MISSED: " + "; ".join(self.problems)),
        ])


@contextlib.contextmanager
def load_at_least(target: float | None, *, say: Callable[[str], None], spinners: int = 16,
                  within: float = 180.0) -> Iterator[None]:
    """Busy loops at normal priority (as other jobs sharing the machine would) until the 1-minute load
    average reaches ``target``, running on inside the block; nothing when ``target`` is None."""
    if target is None:
        yield
        return
    loops = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(spinners)]
    try:
        deadline = time.monotonic() + within
        while os.getloadavg()[0] < target and time.monotonic() < deadline:
            time.sleep(1)
        say(f"load average {os.getloadavg()[0]:.1f} (asked for at least {target:g}, {spinners} busy loops)")
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def run_chaos(*, hosts: int = 4, faults: int = 10, seed: int = 0, kinds: tuple[str, ...] = KINDS,
              step_seconds: float = 0.1, rate: str = "1gbit", say: Callable[[str], None] = print,
              show_output: bool = False, load: float | None = None) -> Report:
    """Run the chaos job on a fresh cluster; returns what happened (see the module docstring)."""
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"unknown fault kind(s) {unknown}; known: {', '.join(KINDS)}")
    if hosts < 4 and "two_hosts" in kinds:
        raise ValueError("two hosts at once needs --hosts 4 or more (--min-np is 2)")
    rng = random.Random(seed)
    started = time.time()
    try:
        with load_at_least(load, say=say), Cluster(hosts=hosts, ranks_per_host=1, rate=rate) as cluster:
            chaos = Chaos(cluster, rng, say=say)
            out = chaos.control / "weights.npz"
            sampler = threading.Event()

            def sample_load() -> None:
                while not sampler.wait(5.0):
                    chaos.loads.append(os.getloadavg()[0])

            threading.Thread(target=sample_load, daemon=True).start()
            chaos.loads.append(os.getloadavg()[0])
            job = chaos.start(seed=seed, step_seconds=step_seconds, out=out)
            order: list[str] = []
            try:
                while len(chaos.faults) < faults:
                    if not order:
                        order = rng.sample(list(kinds), len(kinds))
                    kind = order.pop()
                    if not chaos.steady():
                        chaos.say("the job did not reach a world of every host; ending the run")
                        break
                    time.sleep(rng.uniform(0.0, 2.0))
                    getattr(chaos, f"kind_{kind}")()
                chaos.steady(timeout=60)
                (chaos.control / "finish").write_text("")
                job.wait(lambda: False, 120.0)
            finally:
                sampler.set()
                if job.process.poll() is None:
                    job.process.send_signal(signal.SIGTERM)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        job.process.wait(timeout=20)
                if job.process.poll() is None:
                    job.process.kill()
                rc = job.process.wait()
                chaos.loads.append(os.getloadavg()[0])
            text = job.text()
            if show_output:
                print(text)
            saved = dict(np.load(out)) if out.exists() else None
    finally:  # interrupted too: what the killed hosts left in /dev/shm
        _remove_stores(started)
    final_steps = {s for _, s, _ in job.finals.values()}
    diff = None
    schedule: list[int] = []
    if saved is not None:
        schedule = [int(n) for n in saved["sizes"]]
        diff = float(np.max(np.abs(replay(schedule, seed) - saved["weights"])))
    # The schedule the program kept against what rank 0 printed (a world's last lines may be lost
    # with it; a step printed by the world that ran it last must agree).
    printed: dict[int, tuple[int, int]] = {}
    for step, world, size, _ in job.steps:
        if world >= printed.get(step, (0, 0))[0]:
            printed[step] = (world, size)
    disagree = [s for s, (_, n) in printed.items() if s <= len(schedule) and schedule[s - 1] != n]
    tracebacks = [line for line in text.splitlines() if "Traceback" in line]
    problems = []
    if rc != 0:
        problems.append(f"the job ended with status {rc}")
    if tracebacks:
        problems.append(f"{len(tracebacks)} traceback(s)")
    for f in chaos.faults:
        if f.problem:
            problems.append(f"{f.kind} on {','.join(f.hosts)}: {f.problem}")
        if f.recovery is not None and f.recovery > RECOVERY_TARGET:
            problems.append(f"{f.kind} on {','.join(f.hosts)}: recovery {f.recovery:.2f} s")
        if f.steps_lost > COMMIT_EVERY:
            problems.append(f"{f.kind}: {f.steps_lost} steps lost")
    for r in chaos.rejoins:
        if r.seconds is None:
            problems.append(f"{r.host} did not rejoin")
    if len({d for _, _, d in job.finals.values()}) != 1 or len(final_steps) != 1:
        problems.append(f"final weights differ: {job.finals}")
    if diff is None or diff > 1e-6:
        problems.append(f"replay max |diff| {diff}")
    if saved is not None and len(schedule) != max(final_steps, default=0):
        problems.append(f"the program kept {len(schedule)} step sizes for {max(final_steps, default=0)} steps")
    if disagree:
        problems.append(f"steps {disagree[:5]} ran at another size than the program kept")
    return Report(rc=rc, faults=chaos.faults, rejoins=chaos.rejoins, finals=job.finals, replay_diff=diff,
                  tracebacks=tracebacks, loads=chaos.loads, seconds=time.time() - started,
                  steps=max(final_steps, default=0), problems=problems)


def _remove_stores(since: float) -> None:
    """Hosts killed on purpose could not remove their store folders (emulated hosts share /dev/shm)."""
    for folder in Path("/dev/shm").glob("ddl-elastic-*"):
        with contextlib.suppress(OSError):
            if folder.stat().st_mtime >= since:
                subprocess.run(["rm", "-rf", str(folder)], check=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--faults", type=int, default=10)
    parser.add_argument("--seed", default="0", help="a seed, or several (11,12,13): one run each, then their "
                                                    "table together")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of: {', '.join(KINDS)}")
    parser.add_argument("--step-seconds", type=float, default=0.1)
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--load-at-least", type=float, default=None, metavar="L",
                        help="hold the 1-minute load average at L or more with busy loops during the run")
    parser.add_argument("--json", help="write the report(s) here")
    parser.add_argument("--show-output", action="store_true", help="print the job's whole output at the end")
    args = parser.parse_args(argv)
    reports = []
    seeds = [int(x) for x in str(args.seed).split(",") if x.strip()]
    for seed in seeds:
        report = run_chaos(hosts=args.hosts, faults=args.faults, seed=seed,
                           kinds=tuple(k.strip().replace("-", "_") for k in args.kinds.split(",") if k.strip()),
                           step_seconds=args.step_seconds, rate=args.rate, show_output=args.show_output,
                           load=args.load_at_least)
        reports.append(report)
        print(f"\nseed {seed}\n")
        print(report.table())
        print()
        print(report.summary(), flush=True)
    if len(reports) > 1:
        every = Report(rc=max(r.rc for r in reports), faults=[f for r in reports for f in r.faults],
                       rejoins=[j for r in reports for j in r.rejoins], finals={},
                       replay_diff=max((r.replay_diff for r in reports if r.replay_diff is not None), default=None),
                       tracebacks=[t for r in reports for t in r.tracebacks], loads=[x for r in reports for x in r.loads],
                       seconds=sum(r.seconds for r in reports), steps=sum(r.steps for r in reports),
                       problems=[p for r in reports for p in r.problems])
        print(f"\nall {len(reports)} runs (seeds {args.seed})\n")
        print(every.table())
        print()
        print("\n".join(line for line in every.summary().splitlines() if not line.startswith("final weights")))
        print("final weights: " + "; ".join(
            f"seed {seed}: {len(r.finals)} ranks {'identical' if len({d for _, _, d in r.finals.values()}) == 1 else 'DIFFERENT'}, "
            f"replay max |diff| {'-' if r.replay_diff is None else f'{r.replay_diff:.3g}'}" for seed, r in zip(seeds, reports, strict=False)))
    if args.json:
        Path(args.json).write_text(json.dumps([{
            "rc": report.rc, "faults": [dataclasses.asdict(f) | {"recovery": f.recovery, "steps_lost": f.steps_lost,
                                                                  "detection": f.detection}
                                        for f in report.faults],
            "rejoins": [dataclasses.asdict(r) for r in report.rejoins], "finals": report.finals,
            "replay_diff": report.replay_diff, "tracebacks": report.tracebacks, "loads": report.loads,
            "seconds": report.seconds, "steps": report.steps, "problems": report.problems} for report in reports],
            indent=1))
    return 0 if all(not r.problems for r in reports) else 1


if __name__ == "__main__":
    raise SystemExit(main())
