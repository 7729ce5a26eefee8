"""Emulated hosts on one machine: network namespaces on a bridge, ``tbf``-shaped links.

``Cluster(hosts=2, ranks_per_host=2, rate="1gbit")`` makes, all inside network
namespaces it creates (nothing is added to the machine's own namespace):

- a *switch* namespace holding a bridge;
- one namespace per host (``h1``, ``h2``, ...), joined to the bridge by a veth pair
  whose two ends are shaped with ``tc tbf`` (both directions, like a full-duplex port);
- a *launcher* namespace (unshaped) where ``mpiexec`` runs.

Jobs start through hydra's ssh launcher with a generated ``-launcher-exec`` script that
enters the host's namespace with its own host name (``unshare --uts``), so
``MPI_Get_processor_name`` and ``COMM_TYPE_SHARED`` see separate hosts. Host names
resolve through ``/etc/netns/<namespace>/hosts`` (``ip netns exec`` mounts it over
``/etc/hosts``). ``UCX_TLS=tcp``: MPICH's default UCX transport would otherwise treat
the namespaces as one node and move the data through shared memory, bypassing the
link; the veth byte counters (:meth:`Cluster.counters`) show what crossed it.

Every name starts with ``ddlh`` followed by the creating process id (6 hex digits), and
addresses are in ``10.231.0.0/16``. :meth:`Cluster.down` kills every process in the
namespaces, deletes them (the bridge and veths go with them) and the hosts files, and
removes the MPI library's shared-memory segments that the processes it killed left in the
machine's ``/dev/shm`` (the emulated hosts share it; a real host's go with the host); it
runs on ``with`` exit, at interpreter exit, and for leftovers of dead processes at the
next :meth:`Cluster.up`.

Example:
    >>> with Cluster(hosts=2, ranks_per_host=2, rate="1gbit") as c:  # doctest: +SKIP
    ...     c.run(["ddlrun", "-np", "4", "-H", c.host_list(), "python", "train.py"])
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from ddl.wire import shm_segments

PREFIX = "ddlh"
SUBNET = "10.231.0"  # inside /16 10.231.0.0; every cluster has its own switch, so one /24 serves all
LAUNCHER_ADDRESS = 254
#: Link names are ``<tag>h<N>a`` (tag: 11 characters); Linux allows 15, so two digits.
MAX_HOSTS = 16
NETNS_ETC = Path("/etc/netns")
_NAME = re.compile(rf"^{PREFIX}([0-9a-f]{{6}})[0-9a-z](s|l|h\d+)$")
_serial = itertools.count()


class ClusterUnavailable(RuntimeError):
    """This machine cannot build the emulated cluster; the message says why (tests skip)."""


def unavailable_reason() -> str | None:
    """Why no cluster can be built here (not root, no ``ip``/``tc``/``unshare``), else None."""
    if sys.platform != "linux":
        return f"emulated hosts need Linux network namespaces (this is {sys.platform})"
    if os.geteuid() != 0:
        return "emulated hosts need root (network namespaces, veth, tc); run the tests as root"
    missing = [tool for tool in ("ip", "tc", "unshare", "hostname") if shutil.which(tool) is None]
    if missing:
        return f"emulated hosts need {', '.join(missing)} (iproute2, util-linux) on PATH"
    return None


def _sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise ClusterUnavailable(f"`{' '.join(argv)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_namespace(ns: str) -> None:
    """SIGKILL every process in namespace ``ns`` (all of them started by a cluster), then delete it."""
    for _ in range(3):
        pids = [int(p) for p in _sh("ip", "netns", "pids", ns, check=False).stdout.split()]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    _sh("ip", "netns", "del", ns, check=False)
    shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)


#: A segment younger than this is never taken for a leftover: a job elsewhere on the machine
#: may have created it and not mapped it yet (MPICH maps its own at once and keeps them).
_SEGMENT_GRACE_S = 5.0


def _shm_entries() -> set[tuple[str, int]]:
    """(name, inode) of every MPICH segment in ``/dev/shm`` now."""
    with contextlib.suppress(OSError), os.scandir("/dev/shm") as it:
        return {(e.name, e.inode()) for e in it if e.name.startswith("mpich_shm_")}
    return set()


def _remove_left_segments(before: set[tuple[str, int]]) -> list[str]:
    """Remove the MPICH segments made since ``before`` that no live process maps: what the
    processes a cluster killed left (SIGKILL skips MPI_Finalize, which unlinks them). A
    segment some process still maps, or younger than :data:`_SEGMENT_GRACE_S`, is kept."""
    now, left = time.time(), set()
    for name, inode in _shm_entries() - before:
        with contextlib.suppress(OSError):
            st = os.stat(f"/dev/shm/{name}", follow_symlinks=False)
            if st.st_ino == inode and now - st.st_ctime >= _SEGMENT_GRACE_S:
                left.add(shm_segments.Segment(f"/dev/shm/{name}", st.st_dev, inode))
    return shm_segments.remove_left(left)


def remove_stale() -> list[str]:
    """Delete ``ddlh`` namespaces left by cluster processes that no longer run; returns them."""
    gone = []
    for line in _sh("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = _NAME.match(name)
        if m and not _alive(int(m.group(1), 16)):
            _kill_namespace(name)
            gone.append(name)
    return gone


class Cluster:
    """``hosts`` emulated hosts of ``ranks_per_host`` slots each, links shaped to ``rate``.

    Args:
        hosts: number of hosts (1-16), named ``h1`` ... ``hN`` (16: the longest link
            name, ``<tag>h16a``, is then 15 characters, Linux's limit).
        ranks_per_host: slots per host in :meth:`host_list` and :meth:`hostfile`.
        rate: ``tc`` rate of each host's link in each direction (``"1gbit"``), or None
            for unshaped veths.
        burst, latency: ``tbf`` parameters (the bucket and the longest queueing delay).
        mtu: the links' MTU (None: the kernel's 1500). ``tbf`` counts frame bytes, so
            headers take 4.4 % of a 1500-byte link and 0.7 % of a 9000-byte (jumbo) one,
            which also has the cores forward a sixth of the packets.
    """

    def __init__(self, hosts: int = 2, ranks_per_host: int = 2, *, rate: str | None = "1gbit",
                 burst: str = "128kb", latency: str = "5ms", mtu: int | None = None) -> None:
        if not 1 <= hosts <= MAX_HOSTS:
            raise ValueError(f"hosts={hosts}: give 1 to {MAX_HOSTS} emulated hosts")
        if ranks_per_host < 1:
            raise ValueError(f"ranks_per_host={ranks_per_host}: give at least 1")
        self.hosts = [f"h{i + 1}" for i in range(hosts)]
        self.ranks_per_host = ranks_per_host
        self.rate, self.burst, self.latency, self.mtu = rate, burst, latency, mtu
        serial = "0123456789abcdefghijklmnopqrstuvwxyz"[next(_serial) % 36]
        self.tag = f"{PREFIX}{os.getpid():06x}{serial}"
        self.switch, self.launcher = f"{self.tag}s", f"{self.tag}l"
        self.namespaces: list[str] = []
        self._shm_before: set[tuple[str, int]] = set()
        self.workdir: Path | None = None
        self.exec_script: Path | None = None

    # -- names -------------------------------------------------------------------
    def namespace(self, host: str) -> str:
        return f"{self.tag}{host}"

    def veth(self, host: str) -> str:
        """The host-side end of ``host``'s link (its counters are the host's traffic)."""
        return f"{self.tag}{host}a"

    def address(self, host: str) -> str:
        return f"{SUBNET}.{self.hosts.index(host) + 1}"

    def host_list(self, slots: int | None = None) -> str:
        """``h1:2,h2:2`` for ``ddlrun -H``."""
        return ",".join(f"{h}:{slots or self.ranks_per_host}" for h in self.hosts)

    def hostfile(self, path: str | Path) -> Path:
        """Write a hostfile (``h1 slots=2`` lines) for ``ddlrun --hostfile``."""
        target = Path(path)
        target.write_text("".join(f"{h} slots={self.ranks_per_host}\n" for h in self.hosts))
        return target

    # -- life cycle --------------------------------------------------------------
    def __enter__(self) -> Cluster:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> Cluster:
        """Create the namespaces, bridge, links, hosts files and the launcher script.

        Raises:
            ClusterUnavailable: not permitted here (the message says why); nothing is left behind.
        """
        reason = unavailable_reason()
        if reason:
            raise ClusterUnavailable(reason)
        remove_stale()
        self._shm_before = _shm_entries()
        atexit.register(self.down)
        try:
            self._build()
        except BaseException:
            self.down()
            raise
        return self

    def _build(self) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix=f"{self.tag}-"))
        for ns in (self.switch, self.launcher, *map(self.namespace, self.hosts)):
            _sh("ip", "netns", "add", ns)
            self.namespaces.append(ns)
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
            # No IPv6: its autoconfiguration chatter would move the byte counters.
            _sh("ip", "netns", "exec", ns, "sh", "-c", "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6 && "
                "echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6", check=False)
        bridge = f"{self.tag}br"
        _sh("ip", "-n", self.switch, "link", "add", bridge, "type", "bridge")
        _sh("ip", "-n", self.switch, "link", "set", bridge, "up")
        ends = [(self.launcher, f"{self.tag}l0", f"{self.tag}l1", LAUNCHER_ADDRESS, False)]
        ends += [(self.namespace(h), self.veth(h), f"{self.tag}{h}b", i + 1, True) for i, h in enumerate(self.hosts)]
        for ns, inside, outside, host_id, shaped in ends:
            _sh("ip", "-n", self.switch, "link", "add", outside, "type", "veth", "peer", "name", inside, "netns", ns)
            if self.mtu:
                _sh("ip", "-n", self.switch, "link", "set", outside, "mtu", str(self.mtu))
                _sh("ip", "-n", ns, "link", "set", inside, "mtu", str(self.mtu))
            _sh("ip", "-n", self.switch, "link", "set", outside, "master", bridge, "up")
            _sh("ip", "-n", ns, "addr", "add", f"{SUBNET}.{host_id}/24", "dev", inside)
            _sh("ip", "-n", ns, "link", "set", inside, "up")
            if shaped and self.rate:
                for where, dev in ((ns, inside), (self.switch, outside)):
                    _sh("tc", "-n", where, "qdisc", "add", "dev", dev, "root", "tbf", "rate", self.rate,
                        "burst", self.burst, "latency", self.latency)
        names = "".join(f"{self.address(h)} {h}\n" for h in self.hosts)
        hosts_file = f"127.0.0.1 localhost\n{SUBNET}.{LAUNCHER_ADDRESS} launcher\n{names}"
        for ns in self.namespaces:
            (NETNS_ETC / ns).mkdir(parents=True, exist_ok=True)
            (NETNS_ETC / ns / "hosts").write_text(hosts_file)
        self.exec_script = self.workdir / "launch-exec.sh"
        self.exec_script.write_text(self._exec_script())
        self.exec_script.chmod(0o755)

    def _exec_script(self) -> str:
        cases = "".join(f"  {h}|{self.address(h)}) ns={self.namespace(h)} ;;\n" for h in self.hosts)
        # Hydra calls it as ssh: [options] HOST COMMAND...; like ssh, the words are joined
        # and run by a shell, here in the host's namespace under the host's own name.
        return ("#!/bin/sh\n# generated by emulation.cluster: hydra's ssh, into an emulated host\n"
                'while [ "${1#-}" != "$1" ]; do shift; done\n'
                'host=$1; shift\ncase "$host" in\n' + cases +
                '  *) echo "emulation.cluster: no emulated host named $host" >&2; exit 255 ;;\nesac\n'
                'exec ip netns exec "$ns" unshare --uts sh -c "hostname $host && exec $*"\n')

    def down(self) -> None:
        """Kill every process in the cluster's namespaces and delete everything it made."""
        for ns in reversed(self.namespaces):
            _kill_namespace(ns)
        if self.namespaces:
            _remove_left_segments(self._shm_before)
        self.namespaces = []
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
        atexit.unregister(self.down)

    # -- jobs --------------------------------------------------------------------
    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment for ``mpiexec``/``ddlrun`` in the launcher namespace."""
        assert self.exec_script is not None, "call up() first"
        env = dict(os.environ if base is None else base)
        env.update({
            "HYDRA_LAUNCHER": "ssh",
            "HYDRA_LAUNCHER_EXEC": str(self.exec_script),
            "HYDRA_IFACE": f"{self.tag}l0",  # proxies call mpiexec back on the bridge
            "UCX_TLS": "tcp",  # else UCX takes the namespaces for one node: shared memory, no link
            # All emulated hosts share this machine's cores: idle ranks must yield them.
            "MPIR_CVAR_ENABLE_HEAVY_YIELD": "1",
        })
        return env

    def launch_argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run in the launcher namespace (as ``mpiexec``'s host)."""
        return ["ip", "netns", "exec", self.launcher, *argv]

    def run(self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None,
            ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` (``ddlrun``/``mpiexec`` ...) in the launcher namespace; output captured."""
        return subprocess.run(self.launch_argv(argv), capture_output=True, text=True, timeout=timeout,
                              env=self.env(env))

    def popen(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen(self.launch_argv(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=self.env(env))

    def pids(self, host: str) -> list[int]:
        """Processes running in ``host``'s namespace."""
        return [int(p) for p in _sh("ip", "netns", "pids", self.namespace(host), check=False).stdout.split()]

    def counters(self) -> dict[str, tuple[int, int]]:
        """``{host: (tx_bytes, rx_bytes)}`` of each host's link, read in its namespace."""
        out = {}
        for h in self.hosts:
            info = json.loads(_sh("ip", "-n", self.namespace(h), "-s", "-j", "link", "show", "dev", self.veth(h)).stdout)
            stats = info[0]["stats64"]
            out[h] = (int(stats["tx"]["bytes"]), int(stats["rx"]["bytes"]))
        return out
