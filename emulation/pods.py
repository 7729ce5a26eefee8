"""Kubernetes pods emulated on one machine: Kubeflow MPIJob and TrainJob pods as namespaces.

A *pod* here is a process that holds a network namespace of :class:`emulation.cluster.Cluster`
(its own address on the cluster's bridge, ``tbf``-shaped link, veth byte counters), its own
UTS namespace (the pod's host name) and its own mount namespace, in which

- ``/etc`` and ``/root`` are overlays (the pod's writes stay in the pod, as in a container);
- ``/etc/hosts`` is the job's DNS: one file, shared by every pod, that lists a pod's names
  (``<pod>.<service>.<namespace>.svc.cluster.local``, ``<pod>.<service>.<namespace>.svc``,
  ``<pod>.<service>``, ``<pod>``) from the moment the pod starts, as a headless Service
  publishes a pod once it runs; a pod that has not started does not resolve;
- ``/etc/mpi`` holds the MPI Operator's ConfigMap (``hostfile``, ``discover_hosts.sh``) on
  the launcher pod; ``/root/.ssh`` its Secret (``id_rsa``, ``id_rsa.pub``,
  ``authorized_keys``); ``/etc/ssh`` the image's ssh settings (host keys not checked);
- ``/dev/shm`` and ``/run`` are the pod's own, and ``/sys`` lists the pod's own interfaces.

MPIJob workers run Debian's real ``/usr/sbin/sshd -De`` (the operator's worker command) and
the launcher reaches them with the real ``ssh``; a TrainJob's pods run no sshd at all.
Everything is named after :class:`Cluster`'s tag (``ddlh`` + the creating pid) and removed
by :meth:`Pods.down` (also at interpreter exit, and as leftovers of a dead process).

Example:
    >>> with MpiJobPods("train", workers=3) as job:  # doctest: +SKIP
    ...     job.start_workers()
    ...     job.run("launcher", ["ddlrun", "python", "train.py"], timeout=120)
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from emulation.cluster import LAUNCHER_ADDRESS, SUBNET, Cluster, ClusterUnavailable
from emulation.cluster import unavailable_reason as cluster_unavailable

SSHD = Path("/usr/sbin/sshd")
CLUSTER_DOMAIN = "cluster.local"
#: The launcher's variables the MPI Operator (v0.8, ``mpi_job_controller.go``) sets per implementation.
OPERATOR_LAUNCHER_ENV: dict[str, dict[str, str]] = {
    "OpenMPI": {"OMPI_MCA_orte_keep_fqdn_hostnames": "true",
                "OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
                "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10"},
    "Intel": {"I_MPI_HYDRA_HOST_FILE": "/etc/mpi/hostfile",
              "I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS": "-o ConnectionAttempts=10"},
    "MPICH": {"HYDRA_HOST_FILE": "/etc/mpi/hostfile",
              "HYDRA_LAUNCH_EXTRA_ARGS": "-o ConnectionAttempts=10"},
}
#: The image's ssh client settings (as the operator's base images write them).
SSH_CONFIG = "Host *\n    StrictHostKeyChecking no\n    UserKnownHostsFile /dev/null\n    LogLevel ERROR\n"
SSHD_CONFIG = """# emulation.pods: the worker image's sshd
Port 22
HostKey /etc/ssh/ssh_host_ecdsa_key
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
AuthorizedKeysFile /root/.ssh/authorized_keys
PidFile none
PrintMotd no
"""


class PodsUnavailable(ClusterUnavailable):
    """This machine cannot emulate pods; the message says why (tests skip)."""


def unavailable_reason(*, sshd: bool = False) -> str | None:
    """Why pods cannot be emulated here (see :func:`emulation.cluster.unavailable_reason`), else None.

    Args:
        sshd: MPIJob workers need Debian's openssh-server (``/usr/sbin/sshd``).
    """
    reason = cluster_unavailable()
    if reason:
        return reason
    missing = [tool for tool in ("nsenter", "ssh", "ssh-keygen") if shutil.which(tool) is None]
    if missing:
        return f"emulated pods need {', '.join(missing)} (util-linux, openssh-client) on PATH"
    if sshd and not SSHD.exists():
        return f"MPIJob workers run sshd: {SSHD} is missing (apt-get install openssh-server; see install_sshd)"
    return None


def install_sshd(timeout: float = 300) -> str | None:
    """Install Debian's openssh-server (root, apt) when missing; returns why not, or None.

    Debian's package does not start the daemon where no init system runs (``policy-rc.d``);
    the pods start their own.
    """
    if SSHD.exists():
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return "openssh-server is missing and cannot be installed here (needs root and apt-get)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "install", "-y", "-qq", "--no-install-recommends", "openssh-server"],
                 ["apt-get", "update", "-qq"],
                 ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "openssh-server"]):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
        if argv[1] == "install" and done.returncode == 0 and SSHD.exists():
            return None
    return f"apt-get install openssh-server failed: {(done.stdout + done.stderr).strip()[-500:]}"


class Pod:
    """One emulated pod: its host name, its DNS names, its network namespace, its process."""

    def __init__(self, name: str, *, service: str, namespace: str, where: str, env: Mapping[str, str]) -> None:
        self.name = name
        self.where = where  # the Cluster namespace key: "launcher" or "h1", "h2", ...
        base = f"{name}.{service}.{namespace}.svc"
        self.fqdn = f"{base}.{CLUSTER_DOMAIN}"
        self.service_name = base  # the MPI Operator's hostfile spells workers so
        self.names = (self.fqdn, base, f"{name}.{service}", name)
        self.env = dict(env)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None, f"pod {self.name} has not started"
        return self.process.pid

    def __repr__(self) -> str:
        state = "running" if self.process is not None and self.process.poll() is None else "not running"
        return f"Pod({self.name!r}, {state})"


class Pods:
    """Pods on an emulated cluster: the network, the job's DNS, each pod's namespaces.

    Subclasses name the pods and say what each runs (:meth:`_holder`) and mounts.

    Args:
        pods: the pods' names in order; those with ``where="launcher"`` sit in the
            cluster's unshaped launcher namespace, the others on hosts ``h1`` ... ``hN``.
        service, namespace: the headless Service (the pods' subdomain) and the Kubernetes
            namespace, which spell the DNS names.
        rate: each host link's ``tc`` rate (None: unshaped).
    """

    def __init__(self, pods: Sequence[Pod], *, rate: str | None = "2gbit", slots: int = 1) -> None:
        hosts = [p for p in pods if p.where != "launcher"]
        self.cluster = Cluster(hosts=len(hosts), ranks_per_host=slots, rate=rate)
        self.pods = {p.name: p for p in pods}
        self.workdir: Path | None = None
        self.hosts_file: Path | None = None

    # -- life cycle --------------------------------------------------------------
    def __enter__(self) -> Pods:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> Pods:
        """Build the network and the job's files; no pod runs yet (see :meth:`start`)."""
        reason = unavailable_reason(sshd=self._needs_sshd())
        if reason:
            raise PodsUnavailable(reason)
        self.cluster.up()
        atexit.register(self.down)
        try:
            self.workdir = Path(tempfile.mkdtemp(prefix=f"{self.cluster.tag}-pods-"))
            self.hosts_file = self.workdir / "hosts"
            self.hosts_file.write_text("127.0.0.1 localhost\n")
            self._prepare()
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        """Kill every pod's processes (all of them live in the cluster's namespaces) and remove everything."""
        self.cluster.down()
        for pod in self.pods.values():
            if pod.process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    pod.process.wait(timeout=10)
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
        atexit.unregister(self.down)

    # -- pods ----------------------------------------------------------------------
    def address(self, pod: str) -> str:
        where = self.pods[pod].where
        return self.cluster.address(where) if where != "launcher" else f"{SUBNET}.{LAUNCHER_ADDRESS}"

    def namespace(self, pod: str) -> str:
        where = self.pods[pod].where
        return self.cluster.namespace(where) if where != "launcher" else self.cluster.launcher

    def start(self, names: Iterable[str]) -> None:
        """Start these pods: each gets its namespaces, mounts and process, then its DNS names."""
        for name in names:
            pod = self.pods[name]
            assert pod.process is None, f"pod {name} already started"
            assert self.workdir is not None, "call up() first"
            root = self.workdir / name
            for layer in ("etc", "etc-work", "root", "root-work"):
                (root / layer).mkdir(parents=True, exist_ok=True)
            self._layers(pod, root / "etc", root / "root")
            ns = self.namespace(name)
            steps = [
                f"hostname {pod.name}",
                f"mount -t overlay overlay -o lowerdir=/etc,upperdir={root}/etc,workdir={root}/etc-work /etc",
                f"mount -t overlay overlay -o lowerdir=/root,upperdir={root}/root,workdir={root}/root-work /root",
                f"mount --bind {self.hosts_file} /etc/hosts",
                "mount -t tmpfs -o size=1g,mode=1777 tmpfs /dev/shm",
                "mount -t tmpfs tmpfs /run && mkdir -p /run/sshd && chmod 755 /run/sshd",
                "mount -t sysfs sysfs /sys",  # UCX's tcp transport lists /sys/class/net
                *self._mounts(pod),
                f"exec {self._holder(pod)}",
            ]
            log = open(root / "pod.log", "wb")  # noqa: SIM115 - the pod's stdout for its life
            pod.process = subprocess.Popen(
                ["nsenter", f"--net=/run/netns/{ns}", "unshare", "--uts", "--mount", "--propagation", "private",
                 "sh", "-c", " && ".join(steps)],
                stdout=log, stderr=subprocess.STDOUT, env={"PATH": os.environ.get("PATH", ""), **pod.env})
            log.close()
            self._wait_running(pod)
            self._publish(pod)

    def stop(self, name: str) -> None:
        """Kill a pod's every process (the holder and what runs in its namespaces)."""
        pod = self.pods[name]
        listed = subprocess.run(["ip", "netns", "pids", self.namespace(name)], capture_output=True, text=True)
        for pid in listed.stdout.split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), 9)
        if pod.process is not None:
            pod.process.kill()
            pod.process.wait()

    def command(self, pod: str, argv: Sequence[str], *, cwd: str | None = None) -> list[str]:
        """``argv`` run inside ``pod`` (its network, host name and mounts)."""
        return ["nsenter", "-t", str(self.pods[pod].pid), "--net", "--uts", "--mount",
                f"--wd={cwd or os.getcwd()}", *argv]

    def environment(self, pod: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The container's environment: this process's, the pod's own, then ``extra``."""
        return {**os.environ, **self.pods[pod].env, **(extra or {})}

    def run(self, pod: str, argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None,
            cwd: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in ``pod`` with its container environment; output captured."""
        return subprocess.run(self.command(pod, argv, cwd=cwd), capture_output=True, text=True, timeout=timeout,
                              env=self.environment(pod, env))

    def popen(self, pod: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
              cwd: str | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen(self.command(pod, argv, cwd=cwd), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=self.environment(pod, env))

    def counters(self) -> dict[str, tuple[int, int]]:
        """``{pod: (tx_bytes, rx_bytes)}`` of each non-launcher pod's link."""
        by_host = self.cluster.counters()
        return {p.name: by_host[p.where] for p in self.pods.values() if p.where != "launcher"}

    def log(self, pod: str) -> str:
        assert self.workdir is not None
        path = self.workdir / pod / "pod.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # -- what subclasses decide ------------------------------------------------------
    def _needs_sshd(self) -> bool:
        return False

    def _prepare(self) -> None:
        """Write the job's files (keys, ConfigMap) once the work folder exists."""

    def _layers(self, pod: Pod, etc: Path, root: Path) -> None:
        """Fill the pod's ``/etc`` and ``/root`` overlay layers before it starts."""

    def _mounts(self, pod: Pod) -> list[str]:
        return []

    def _holder(self, pod: Pod) -> str:
        return "sleep infinity"

    # -- pieces --------------------------------------------------------------------
    def _publish(self, pod: Pod) -> None:
        """Add the pod's names to the job's DNS (appended: readers never see a torn file)."""
        assert self.hosts_file is not None
        with open(self.hosts_file, "a") as hosts:
            hosts.write(f"{self.address(pod.name)} {' '.join(pod.names)}\n")

    def _wait_running(self, pod: Pod, timeout: float = 15) -> None:
        """Until the holder's mounts are in place: its /etc/hosts is the job's."""
        assert pod.process is not None and self.hosts_file is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pod.process.poll() is not None:
                raise PodsUnavailable(f"pod {pod.name} exited with {pod.process.returncode} while starting: "
                                      f"{self.log(pod.name)[-1500:]}")
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{pod.pid}/root/etc/hosts").st_ino == self.hosts_file.stat().st_ino:
                    return
            time.sleep(0.05)
        raise PodsUnavailable(f"pod {pod.name} did not set up its mounts in {timeout:.0f} s: {self.log(pod.name)}")


class MpiJobPods(Pods):
    """An MPIJob (``kubeflow.org/v2beta1``): a launcher pod and ``workers`` worker pods running sshd.

    The ConfigMap's ``hostfile`` lists the workers in the operator's format for
    ``implementation`` (``OpenMPI``: ``<worker>.<job>.<ns>.svc slots=N``; ``MPICH``/``Intel``:
    ``<worker>.<job>.<ns>.svc:N``); ``discover_hosts.sh`` echoes the running workers.
    :attr:`launcher_env` is what the operator puts in the launcher container's environment.
    """

    def __init__(self, job: str = "train", *, workers: int = 3, slots: int = 1, implementation: str = "MPICH",
                 namespace: str = "default", rate: str | None = "2gbit") -> None:
        if implementation not in OPERATOR_LAUNCHER_ENV:
            raise ValueError(f"implementation={implementation!r}: give one of {sorted(OPERATOR_LAUNCHER_ENV)}")
        self.job, self.slots, self.implementation = job, slots, implementation
        self.launcher_env = {"K_MPI_JOB_ROLE": "launcher", **OPERATOR_LAUNCHER_ENV[implementation]}
        if implementation == "OpenMPI":
            self.launcher_env["OMPI_MCA_orte_set_default_slots"] = str(slots)
        elif implementation == "Intel":
            self.launcher_env["I_MPI_PERHOST"] = str(slots)
        pods = [Pod(f"{job}-launcher", service=job, namespace=namespace, where="launcher", env=self.launcher_env)]
        pods += [Pod(f"{job}-worker-{i}", service=job, namespace=namespace, where=f"h{i + 1}",
                     env={"K_MPI_JOB_ROLE": "worker"}) for i in range(workers)]
        super().__init__(pods, rate=rate, slots=slots)
        self.launcher = pods[0].name
        self.workers = [p.name for p in pods[1:]]

    def hostfile_text(self) -> str:
        """The ConfigMap's ``hostfile``, spelled as the operator spells it for this implementation."""
        sep = " slots=" if self.implementation == "OpenMPI" else ":"
        return "".join(f"{self.pods[w].service_name}{sep}{self.slots}\n" for w in self.workers)

    def discover_hosts_text(self) -> str:
        """``discover_hosts.sh``: the running workers, sorted by name, one ``echo`` each."""
        running = sorted(w for w in self.workers if self.pods[w].process is not None
                         and self.pods[w].process.poll() is None)  # type: ignore[union-attr]
        return "#!/bin/sh\n" + "".join(f"echo {self.pods[w].service_name}\n" for w in running)

    def start_launcher(self) -> None:
        self.start([self.launcher])

    def start_workers(self, names: Iterable[str] | None = None) -> None:
        self.start(self.workers if names is None else names)
        self._write_config()

    def stop(self, name: str) -> None:
        super().stop(name)
        self._write_config()

    def _needs_sshd(self) -> bool:
        return True

    def _prepare(self) -> None:
        assert self.workdir is not None
        keys = self.workdir / "secret"
        keys.mkdir()
        # The operator's Secret: an ECDSA P-521 key, stored under the name id_rsa.
        subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-b", "521", "-N", "", "-C", f"{self.job}",
                        "-f", str(keys / "id_rsa")], check=True, capture_output=True, timeout=30)
        shutil.copy(keys / "id_rsa.pub", keys / "authorized_keys")
        subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-N", "", "-f", str(self.workdir / "ssh_host_ecdsa_key")],
                       check=True, capture_output=True, timeout=30)
        (self.workdir / "mpi").mkdir()
        self._write_config()

    def _write_config(self) -> None:
        """The ConfigMap, replaced file by file as the kubelet does (write aside, rename)."""
        if self.workdir is None:
            return
        for name, text, mode in (("hostfile", self.hostfile_text(), 0o444),
                                 ("discover_hosts.sh", self.discover_hosts_text(), 0o555)):
            staged = self.workdir / "mpi" / f".{name}.new"
            staged.write_text(text)
            staged.chmod(mode)
            staged.replace(self.workdir / "mpi" / name)

    def _layers(self, pod: Pod, etc: Path, root: Path) -> None:
        assert self.workdir is not None
        ssh = root / ".ssh"
        ssh.mkdir(mode=0o700, exist_ok=True)
        for name in ("id_rsa", "id_rsa.pub", "authorized_keys"):
            shutil.copy(self.workdir / "secret" / name, ssh / name)
            (ssh / name).chmod(0o600)
        (etc / "ssh").mkdir(exist_ok=True)
        (etc / "ssh" / "ssh_config").write_text(SSH_CONFIG)
        (etc / "ssh" / "sshd_config").write_text(SSHD_CONFIG)
        for name in ("ssh_host_ecdsa_key", "ssh_host_ecdsa_key.pub"):
            shutil.copy(self.workdir / name, etc / "ssh" / name)
        (etc / "ssh" / "ssh_host_ecdsa_key").chmod(0o600)
        if pod.name == self.launcher:
            (etc / "mpi").mkdir(exist_ok=True)  # the mount point of the ConfigMap

    def _mounts(self, pod: Pod) -> list[str]:
        assert self.workdir is not None
        return [f"mount --bind {self.workdir / 'mpi'} /etc/mpi"] if pod.name == self.launcher else []

    def _holder(self, pod: Pod) -> str:
        return "sleep infinity" if pod.name == self.launcher else f"{SSHD} -De"


class TrainJobPods(Pods):
    """A TrainJob's pods (Trainer v2, torch runtime on a JobSet): ``nodes`` pods, no ssh at all.

    Pod ``i`` is ``<job>-node-0-<i>`` in Service ``<job>``; its container environment holds
    what Trainer's torch plugin injects: ``PET_NNODES``, ``PET_NPROC_PER_NODE``,
    ``PET_NODE_RANK`` (the Job's completion index), ``PET_MASTER_ADDR``
    (``<job>-node-0-0.<job>``) and ``PET_MASTER_PORT`` (29500).
    """

    MASTER_PORT = 29500

    def __init__(self, job: str = "train", *, nodes: int = 2, nproc_per_node: int = 1, namespace: str = "default",
                 rate: str | None = "2gbit") -> None:
        self.job = job
        pods = [Pod(f"{job}-node-0-{i}", service=job, namespace=namespace, where=f"h{i + 1}",
                    env={"PET_NNODES": str(nodes), "PET_NPROC_PER_NODE": str(nproc_per_node),
                         "PET_NODE_RANK": str(i), "PET_MASTER_ADDR": f"{job}-node-0-0.{job}",
                         "PET_MASTER_PORT": str(self.MASTER_PORT)}) for i in range(nodes)]
        super().__init__(pods, rate=rate, slots=nproc_per_node)
        self.nodes = [p.name for p in pods]
