"""Wait for the hosts of a launch to resolve and accept ssh, saying which ones it waits for.

In a Kubernetes MPIJob the launcher pod often starts before its workers run: their names
do not resolve yet (a headless Service publishes a pod once it runs), then their sshd does
not listen yet. MPI's launchers fail at the first ``ssh: Could not resolve hostname``.
ddlrun probes every host beside its loop (one thread each per round: a name lookup, then
the ssh the MPI will use, ``BatchMode`` with a short connect timeout), and the decision
(launch, wait, give up) is a pure function of the probes and the time.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import shlex
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from ddl.launcher.command import Flavour

#: ssh options of the probe, placed before the user's own (ssh keeps an option's first value).
PROBE_SSH_OPTIONS: tuple[str, ...] = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-o", "ConnectionAttempts=1")
#: Seconds between two probes of a host that is not ready.
PROBE_INTERVAL_S = 1.0
#: Seconds between two identical waiting lines.
REPORT_EVERY_S = 10.0


class WorkersNotReady(RuntimeError):
    """Hosts did not become reachable in time, or cannot become so; the message names them and why."""


class Reach(enum.Enum):
    """How far a probe of one host got."""

    UNRESOLVED = "does not resolve"
    NO_SSH = "does not accept ssh"
    LOGIN_REFUSED = "refuses the ssh login"
    BROKEN = "cannot be probed"
    READY = "ready"


@dataclasses.dataclass(frozen=True)
class Probe:
    """One probe's outcome: how far it got and what ssh (or the resolver) said."""

    reach: Reach
    detail: str = ""

    def describe(self) -> str:
        return f"{self.reach.value} ({self.detail})" if self.detail else self.reach.value


class Action(enum.Enum):
    LAUNCH = "launch"
    WAIT = "wait"
    GIVE_UP = "give up"


@dataclasses.dataclass(frozen=True)
class Verdict:
    action: Action
    message: str


def classify_ssh(returncode: int, stderr: str) -> Probe:
    """What an ``ssh HOST true`` probe's status and error text say about the host.

    Example:
        >>> classify_ssh(255, "ssh: Could not resolve hostname w-1.j: Name or service not known").reach
        <Reach.UNRESOLVED: 'does not resolve'>
        >>> classify_ssh(255, "ssh: connect to host w-1 port 22: Connection refused").describe()
        'does not accept ssh (ssh: connect to host w-1 port 22: Connection refused)'
    """
    if returncode == 0:
        return Probe(Reach.READY)
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    detail = lines[-1] if lines else f"ssh exit status {returncode}"
    text = stderr.lower()
    if "could not resolve hostname" in text or "name or service not known" in text:
        return Probe(Reach.UNRESOLVED, detail)
    if any(word in text for word in ("permission denied", "host key verification failed",
                                     "too many authentication failures", "no matching host key")):
        return Probe(Reach.LOGIN_REFUSED, detail)
    return Probe(Reach.NO_SSH, detail)


def decide(probes: Mapping[str, Probe | None], *, elapsed: float, timeout: float) -> Verdict:
    """Launch when every host is ready; give up on a broken probe or past the timeout; else wait.

    ``None`` is a host not probed yet.

    Example:
        >>> decide({"a": Probe(Reach.READY), "b": Probe(Reach.UNRESOLVED)}, elapsed=3, timeout=300).message
        'waiting for 1 of 2 hosts (3 s of 300 s): b does not resolve'
    """
    waiting = {host: probe for host, probe in probes.items() if probe is None or probe.reach is not Reach.READY}
    if not waiting:
        return Verdict(Action.LAUNCH, f"all {len(probes)} hosts resolve and accept ssh ({elapsed:.0f} s)")
    broken = {h: p for h, p in waiting.items() if p is not None and p.reach is Reach.BROKEN}
    if broken:
        return Verdict(Action.GIVE_UP, f"cannot probe {_list(broken)}")
    line = f"waiting for {len(waiting)} of {len(probes)} hosts ({elapsed:.0f} s of {timeout:.0f} s): {_list(waiting)}"
    if elapsed >= timeout:
        return Verdict(Action.GIVE_UP, f"gave up after {elapsed:.0f} s (--wait-for-workers {timeout:g}): "
                                       f"{len(waiting)} of {len(probes)} hosts not ready: {_list(waiting)}")
    return Verdict(Action.WAIT, line)


def should_report(line: str, *, last_line: str | None, since_last: float) -> bool:
    """Print a waiting line when what is awaited changed, else every :data:`REPORT_EVERY_S`.

    Lines differ in their seconds; only the part after the colon is compared.
    """
    if last_line is None:
        return True
    return line.split("): ", 1)[-1] != last_line.split("): ", 1)[-1] or since_last >= REPORT_EVERY_S


def _list(waiting: Mapping[str, Probe | None]) -> str:
    by_state: dict[str, list[str]] = {}
    for host, probe in waiting.items():
        by_state.setdefault("not probed yet" if probe is None else probe.describe(), []).append(host)
    return "; ".join(f"{', '.join(hosts)} {state}" for state, hosts in by_state.items())


# -- the probe and the loop -------------------------------------------------------------------

def ssh_command(flavour: Flavour, env: Mapping[str, str]) -> list[str] | None:
    """The ssh the MPI will run to reach hosts, with its extra arguments; None when it is not ssh.

    MPICH's hydra: ``HYDRA_LAUNCHER``/``HYDRA_LAUNCHER_EXEC`` and ``HYDRA_LAUNCH_EXTRA_ARGS``;
    Open MPI 5's PRRTE: ``PRTE_MCA_plm_ssh_agent``/``PRTE_MCA_plm_ssh_args`` (Open MPI 4:
    ``OMPI_MCA_plm_rsh_*``). Another launcher (a fork, a scheduler, a wrapper script) is
    not probed: only the names are.

    Example:
        >>> ssh_command("mpich", {"HYDRA_LAUNCH_EXTRA_ARGS": "-o ConnectionAttempts=10"})
        ['ssh', '-o', 'BatchMode=yes', '-o', 'ConnectTimeout=5', '-o', 'ConnectionAttempts=1', '-o', 'ConnectionAttempts=10']
    """
    if flavour == "mpich":
        if env.get("HYDRA_LAUNCHER", "ssh") != "ssh":
            return None
        agent, extra = env.get("HYDRA_LAUNCHER_EXEC", "ssh"), env.get("HYDRA_LAUNCH_EXTRA_ARGS", "")
    else:
        agent = env.get("PRTE_MCA_plm_ssh_agent") or env.get("OMPI_MCA_plm_rsh_agent") or "ssh"
        agent = agent.split(":")[0].strip()  # "ssh : rsh": the first that exists; ssh here
        extra = env.get("PRTE_MCA_plm_ssh_args") or env.get("OMPI_MCA_plm_rsh_args") or ""
    words = shlex.split(agent)
    if not words or os.path.basename(words[0]) != "ssh":
        return None
    return [*words, *PROBE_SSH_OPTIONS, *shlex.split(extra)]


def probe_host(host: str, *, ssh: Sequence[str] | None, local: bool) -> Probe:
    """Resolve ``host``, then (unless ``local`` or ``ssh`` is None) run ``ssh HOST true``."""
    try:
        socket.getaddrinfo(host, None)
    except (socket.gaierror, UnicodeError) as exc:
        return Probe(Reach.UNRESOLVED, str(exc))
    if ssh is None or local:
        return Probe(Reach.READY)
    if shutil.which(ssh[0]) is None:
        return Probe(Reach.BROKEN, f"{ssh[0]} is not installed or not on PATH")
    try:
        done = subprocess.run([*ssh, host, "true"], capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return Probe(Reach.NO_SSH, "ssh did not finish in 30 s")
    return classify_ssh(done.returncode, done.stderr)


def is_local(host: str, hostname: str) -> bool:
    """``host`` names this machine (its first label is this host name): MPI starts ranks here without ssh.

    Example:
        >>> is_local("j-launcher.j.ns.svc", "j-launcher"), is_local("j-worker-0.j.ns.svc", "j-launcher")
        (True, False)
    """
    return host in ("localhost", "127.0.0.1", hostname) or host.split(".")[0] == hostname.split(".")[0]


def wait_for_hosts(
    hosts: Sequence[str],
    *,
    timeout: float,
    probe: Callable[[str], Probe],
    report: Callable[[str], None],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Probe ``hosts`` until :func:`decide` says launch; returns the seconds waited.

    Raises:
        WorkersNotReady: given up (timeout, or a probe that cannot work); the message names
            each host that was not ready and why.
    """
    probes: dict[str, Probe | None] = dict.fromkeys(hosts)
    start = clock()
    last_line: str | None = None
    last_time = start
    with ThreadPoolExecutor(max_workers=min(32, max(1, len(hosts))), thread_name_prefix="ddlrun-probe") as pool:
        while True:
            pending = [h for h, p in probes.items() if p is None or p.reach is not Reach.READY]
            for host, result in zip(pending, pool.map(probe, pending), strict=True):
                probes[host] = result
            now = clock()
            verdict = decide(probes, elapsed=now - start, timeout=timeout)
            if verdict.action is Action.LAUNCH:
                if last_line is not None:
                    report(verdict.message)
                return now - start
            if verdict.action is Action.GIVE_UP:
                raise WorkersNotReady(verdict.message)
            if should_report(verdict.message, last_line=last_line, since_last=now - last_time):
                report(verdict.message)
                last_line, last_time = verdict.message, now
            sleep(min(PROBE_INTERVAL_S, max(0.0, timeout - (clock() - start))))
