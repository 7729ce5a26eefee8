"""A 2-node Slurm cluster emulated on one machine (root only): real slurmctld, slurmd, munged.

``slurmctld`` runs in a network namespace that holds a bridge; each node's ``slurmd``
runs in its own network + UTS + mount namespace (entered with ``nsenter --net`` and
``unshare --uts --mount``: ``ip netns exec`` remounts ``/sys`` without the cgroup tree
and slurmd 22.05 then refuses to start), with its own ``/etc/hosts``, ``/tmp`` (a
shared ``/tmp`` breaks ``--mpi=pmix``'s app dirs) and a sysfs that shows only its own
interfaces (UCX's tcp transport reads them from ``/sys/class/net``). One ``munged`` serves all through its socket.
Everything created is named ``ddls<hex pid>...`` and lives in 10.232.0.0/16; :meth:`close`
removes it by exact pid and namespace name, also after a failure.

Run ``python -m emulation.slurm_cluster`` for a shell on node h1 of such a cluster.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

NODES = ("h1", "h2")
CPUS_PER_NODE = 2
TOOLS = ("slurmctld", "slurmd", "munged", "srun", "salloc", "sbatch", "sinfo", "nsenter", "unshare", "ip")


def missing_tools() -> list[str]:
    """The programs this emulation needs that are not installed (slurm-wlm, munge, iproute2)."""
    return [tool for tool in TOOLS if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists()]


class SlurmCluster:
    """Start with ``with SlurmCluster(workdir) as cluster:``; run commands with :meth:`on_node`."""

    def __init__(self, workdir: Path) -> None:
        tag = f"{os.getpid():x}"[-6:]
        self.prefix = f"ddls{tag}"
        self.subnet = f"10.232.{os.getpid() % 250}"
        self.workdir = workdir
        self.conf = workdir / "slurm.conf"
        self.namespaces: list[str] = []
        self.daemons: dict[str, subprocess.Popen[bytes]] = {}
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> SlurmCluster:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def start(self, timeout: float = 30.0) -> None:
        """Build the network, write the config, start munged, slurmctld and both slurmd."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._network()
        self._write_files()
        self._start_munged()
        self._start_daemon("ctl", "ctl", ["/usr/sbin/slurmctld", "-D", "-i", "-f", str(self.conf)])
        for node in NODES:
            self._start_daemon(node, node, ["/usr/sbin/slurmd", "-D", "-N", node, "-f", str(self.conf)])
        self._wait_idle(timeout)

    def close(self) -> None:
        """Stop every process in our namespaces and our daemons by pid, then delete the namespaces."""
        for ns in self.namespaces:
            for pid in self._pids_in(ns):
                _kill(pid)
        for daemon in self.daemons.values():
            if daemon.poll() is None:
                _kill(daemon.pid)
                try:
                    daemon.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    daemon.kill()
                    daemon.wait()
        self.daemons.clear()
        for ns in reversed(self.namespaces):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.namespaces.clear()

    # ------------------------------------------------------------------ running things
    def on_node(self, node: str, argv: list[str], *, env: dict[str, str] | None = None,
                timeout: float = 300, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on ``node`` (its network, host name, /etc/hosts and /tmp), as a login shell would."""
        target = str(self.daemons[node].pid)
        # Entering a mount namespace resets the working directory: carry it over explicitly.
        cmd = ["nsenter", "-t", target, "--net", "--uts", "--mount", f"--wd={cwd or os.getcwd()}", *argv]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**self.env, **(env or {})})

    def veth_bytes(self, node: str) -> int:
        """Bytes received plus sent by ``node``'s link to the bridge so far."""
        out = subprocess.run(["ip", "netns", "exec", self._ns("ctl"), "cat",
                              f"/sys/class/net/{self._veth(node, 'b')}/statistics/rx_bytes",
                              f"/sys/class/net/{self._veth(node, 'b')}/statistics/tx_bytes"],
                             capture_output=True, text=True, check=True).stdout.split()
        return sum(int(value) for value in out)

    def log(self, who: str) -> str:
        path = self.workdir / who / f"{'slurmctld' if who == 'ctl' else 'slurmd'}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # ------------------------------------------------------------------ pieces
    def _ns(self, who: str) -> str:
        return f"{self.prefix}{who}"

    def _veth(self, node: str, end: str) -> str:
        return f"{self.prefix}{node}{end}"

    def _address(self, who: str) -> str:
        return f"{self.subnet}.{1 if who == 'ctl' else 10 + NODES.index(who) + 1}"

    def _network(self) -> None:
        for who in ("ctl", *NODES):
            _ip("netns", "add", self._ns(who))
            self.namespaces.append(self._ns(who))
        ctl, bridge = self._ns("ctl"), f"{self.prefix}br"
        _ip("-n", ctl, "link", "add", bridge, "type", "bridge")
        _ip("-n", ctl, "addr", "add", f"{self._address('ctl')}/24", "dev", bridge)
        _ip("-n", ctl, "link", "set", bridge, "up")
        _ip("-n", ctl, "link", "set", "lo", "up")
        for node in NODES:
            inside, outside = self._veth(node, "a"), self._veth(node, "b")
            _ip("-n", ctl, "link", "add", outside, "type", "veth", "peer", "name", inside, "netns", self._ns(node))
            _ip("-n", ctl, "link", "set", outside, "master", bridge, "up")
            _ip("-n", self._ns(node), "addr", "add", f"{self._address(node)}/24", "dev", inside)
            _ip("-n", self._ns(node), "link", "set", inside, "up")
            _ip("-n", self._ns(node), "link", "set", "lo", "up")

    def _write_files(self) -> None:
        wd = self.workdir
        hosts = "127.0.0.1 localhost\n" + "".join(f"{self._address(w)} {w}\n" for w in ("ctl", *NODES))
        for who in ("ctl", *NODES):
            (wd / who / "tmp").mkdir(parents=True, exist_ok=True)
            (wd / who / "tmp").chmod(0o1777)
            (wd / who / "spool").mkdir(exist_ok=True)
            (wd / who / "hosts").write_text(hosts)
        nodes = "".join(f"NodeName={n} NodeAddr={self._address(n)} CPUs={CPUS_PER_NODE} State=UNKNOWN\n" for n in NODES)
        self.conf.write_text(f"""ClusterName={self.prefix}
SlurmctldHost=ctl({self._address('ctl')})
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={wd}/munge/munge.socket
CredType=cred/munge
StateSaveLocation={wd}/ctl/spool
SlurmdSpoolDir={wd}/%n/spool
SlurmctldPidFile={wd}/ctl/slurmctld.pid
SlurmdPidFile={wd}/%n/slurmd.pid
SlurmctldLogFile={wd}/ctl/slurmctld.log
SlurmdLogFile={wd}/%n/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
{nodes}PartitionName=debug Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP
""")

    def _start_munged(self) -> None:
        munge = self.workdir / "munge"
        munge.mkdir(mode=0o700, exist_ok=True)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        argv = ["/usr/sbin/munged", "-F", "-f", f"--socket={munge}/munge.socket", f"--key-file={key}",
                f"--log-file={munge}/munged.log", f"--pid-file={munge}/munged.pid", f"--seed-file={munge}/seed"]
        self.daemons["munged"] = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_for(lambda: (munge / "munge.socket").exists(), 10, "munged's socket", self.daemons["munged"])

    def _start_daemon(self, key: str, who: str, argv: list[str]) -> None:
        wd = self.workdir / who
        # A sysfs of the node's own network namespace (UCX lists interfaces in /sys/class/net),
        # with the cgroup tree carried over: slurmd 22.05 refuses to start without it.
        script = (f"hostname {who} && mount --bind {wd}/hosts /etc/hosts && mount --bind {wd}/tmp /tmp "
                  f"&& mkdir -p {wd}/cgroup && mount --rbind /sys/fs/cgroup {wd}/cgroup "
                  f"&& mount -t sysfs sysfs /sys && mount --rbind {wd}/cgroup /sys/fs/cgroup "
                  f"&& exec {' '.join(argv)}")
        cmd = ["nsenter", f"--net=/run/netns/{self._ns(who)}", "unshare", "--uts", "--mount", "sh", "-c", script]
        log = open(wd / "stdout.log", "wb")  # noqa: SIM115 - kept open for the daemon's life
        self.daemons[key] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env)

    def _wait_idle(self, timeout: float) -> None:
        def idle() -> bool:
            for name, daemon in self.daemons.items():
                if daemon.poll() is not None:
                    who = "" if name == "munged" else self.log(name) + (self.workdir / name / "stdout.log").read_text()
                    raise RuntimeError(f"{name} exited with {daemon.returncode} while starting:\n{who[-2000:]}")
            out = self.on_node("h1", ["sinfo", "-h", "-N", "-o", "%N %t"], timeout=20).stdout.split()
            return out.count("idle") == len(NODES)

        _wait_for(idle, timeout, "both nodes idle in sinfo", None)

    def _pids_in(self, ns: str) -> list[int]:
        done = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        return [int(pid) for pid in done.stdout.split() if pid.isdigit() and int(pid) != os.getpid()]


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)


def _wait_for(ready: object, timeout: float, what: str, process: subprocess.Popen[bytes] | None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(ready) and ready():
            return
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what}: the process exited with {process.returncode}")
        time.sleep(0.3)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")


def main() -> int:
    """An interactive shell on node h1 of a fresh emulated cluster; removed on exit."""
    workdir = Path(f"/var/tmp/ddls-{os.getpid()}")
    try:
        with SlurmCluster(workdir) as cluster:
            print(f"cluster up (SLURM_CONF={cluster.conf}); try: salloc -N 2 -n 4 ddlrun python prog.py",
                  file=sys.stderr)
            return subprocess.call(["nsenter", "-t", str(cluster.daemons["h1"].pid), "--net", "--uts",
                                    "--mount", os.environ.get("SHELL", "/bin/sh")], env=cluster.env)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
