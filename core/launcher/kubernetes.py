"""What Kubernetes gives ddlrun: an MPIJob launcher pod's hostfile, a TrainJob pod's place among the nodes.

Kubeflow's MPI Operator (``kubeflow.org/v2beta1`` MPIJob) mounts its ConfigMap at
``/etc/mpi`` in the launcher pod (``hostfile``: ``<job>-worker-<i>.<job>.<ns>.svc slots=N``
for Open MPI, ``...svc:N`` for MPICH and Intel MPI; ``discover_hosts.sh`` for elastic jobs)
and names the hostfile in the launcher's environment for the MPI it was told
(``OMPI_MCA_orte_default_hostfile``, ``HYDRA_HOST_FILE``, ``I_MPI_HYDRA_HOST_FILE``), beside
``K_MPI_JOB_ROLE=launcher``. Kubeflow Trainer's torch runtime (TrainJob on a JobSet) runs
no ssh and gives every pod torchrun's ``PET_NNODES``, ``PET_NPROC_PER_NODE``,
``PET_NODE_RANK``, ``PET_MASTER_ADDR`` and ``PET_MASTER_PORT``.

The functions here are pure over :class:`ddl.base.config.JobEnv`, the flags and the file
texts their callers read; ``ddlrun`` (:mod:`ddl.launcher.cli`) calls them.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections.abc import Callable, Mapping

from ddl.base.config import JobEnv
from ddl.launcher.command import LaunchError
from ddl.launcher.hosts import HostSlots, format_host_list, parse_hostfile

#: Where the MPI Operator mounts its ConfigMap in the launcher pod.
MPI_CONFIG_DIR = "/etc/mpi"
DEFAULT_HOSTFILE = f"{MPI_CONFIG_DIR}/hostfile"
DISCOVER_HOSTS = f"{MPI_CONFIG_DIR}/discover_hosts.sh"
#: How long ddlrun waits in an MPIJob launcher for its workers to resolve and accept ssh (s):
#: pods of a fresh job wait for their images and their node; minutes are common.
DEFAULT_WAIT_S = 300.0
#: Trainer's torch runtime spells the master port so (``constants.ContainerTrainerPort``).
TRAINER_MASTER_PORT = 29500
#: The flags of torchrun that ddlrun shares, and the Trainer variable each replaces.
NODE_FLAGS: dict[str, str] = {
    "nnodes": "PET_NNODES",
    "nproc_per_node": "PET_NPROC_PER_NODE",
    "node_rank": "PET_NODE_RANK",
    "master_addr": "PET_MASTER_ADDR",
    "master_port": "PET_MASTER_PORT",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """ddlrun's flags for Kubernetes pods and torchrun-style nodes (torchrun's names and spellings)."""
    group = parser.add_argument_group(
        "nodes without ssh (Kubeflow TrainJob, torchrun-style)",
        "every node runs the same ddlrun; node 0 starts the world and the others join it, no ssh "
        "(default: Kubeflow Trainer's PET_* variables)")
    for name, variable in NODE_FLAGS.items():
        dash = name.replace("_", "-")
        spellings = dict.fromkeys([f"--{dash}", f"--{name}"])  # torchrun takes both
        group.add_argument(*spellings, dest=name, metavar=variable.removeprefix("PET_"),
                           help=f"torchrun's --{dash} ({variable})")
    parser.add_argument("--wait-for-workers", dest="wait_for_workers", type=float, metavar="SECONDS",
                        help="wait this long for the hosts to resolve and accept ssh (and, without ssh, for "
                             f"every node to join) before launching (default {DEFAULT_WAIT_S:.0f} in a Kubeflow "
                             "MPIJob or TrainJob, 0 elsewhere: an unknown host is an error at once)")


# -- MPIJob ------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, kw_only=True)
class MpiJobHostfile:
    """The hostfile an MPIJob's launcher pod names, and why ddlrun took it."""

    path: str
    source: str


def mpijob_hostfile(job: JobEnv, *, exists: Callable[[str], bool]) -> MpiJobHostfile | None:
    """The hostfile to launch over in an MPI Operator launcher pod, or None elsewhere.

    The first hostfile variable set (``HYDRA_HOST_FILE``, ``OMPI_MCA_orte_default_hostfile``,
    ``I_MPI_HYDRA_HOST_FILE``, ``PRTE_MCA_prte_default_hostfile``: the operator sets the one
    of the MPI it was told); else, with ``K_MPI_JOB_ROLE=launcher``, ``/etc/mpi/hostfile``
    when it exists.

    Example:
        >>> mpijob_hostfile(JobEnv(mpijob_role="launcher",
        ...                        hostfiles=(("OMPI_MCA_orte_default_hostfile", "/etc/mpi/hostfile"),)),
        ...                 exists=lambda p: True).path
        '/etc/mpi/hostfile'
    """
    role = f"K_MPI_JOB_ROLE={job.mpijob_role}, " if job.mpijob_role else ""
    if job.hostfiles:
        name, path = job.hostfiles[0]
        who = "the MPI Operator in this MPIJob's launcher pod" if job.mpijob_role == "launcher" else "the environment"
        return MpiJobHostfile(path=path, source=f"{role}{name}={path}, set by {who}")
    if job.mpijob_role == "launcher" and exists(DEFAULT_HOSTFILE):
        return MpiJobHostfile(path=DEFAULT_HOSTFILE, source=f"{role}the MPI Operator's ConfigMap")
    return None


def mpijob_hosts(hostfile: MpiJobHostfile, text: str) -> tuple[tuple[HostSlots, ...], list[str]]:
    """The hosts of the hostfile's text (either operator format) and a note saying where they came from.

    Raises:
        HostListError: the text is malformed or lists no host.

    Example:
        >>> hosts, _ = mpijob_hosts(MpiJobHostfile(path="/etc/mpi/hostfile", source="test"),
        ...                         "j-worker-0.j.ns.svc:2\\nj-worker-1.j.ns.svc:2\\n")
        >>> [str(h) for h in hosts]
        ['j-worker-0.j.ns.svc:2', 'j-worker-1.j.ns.svc:2']
    """
    hosts = parse_hostfile(text, source=hostfile.path)
    return hosts, [f"hosts {format_host_list(hosts)} from {hostfile.path} ({hostfile.source})"]


def discovery_script(*, given: str | None, in_mpijob: bool, exists: Callable[[str], bool]) -> str | None:
    """The host discovery script of an elastic run: the one given, else the MPI Operator's.

    Example:
        >>> discovery_script(given=None, in_mpijob=True, exists=lambda p: True)
        '/etc/mpi/discover_hosts.sh'
    """
    if given:
        return given
    if in_mpijob and exists(DISCOVER_HOSTS):
        return DISCOVER_HOSTS
    return None


def wait_timeout(flag: float | None, *, on_platform: bool) -> float:
    """Seconds to wait for workers: the flag's, else the default on Kubernetes, else none.

    Raises:
        LaunchError: a negative flag.
    """
    if flag is not None:
        if flag < 0:
            raise LaunchError(f"--wait-for-workers {flag:g}: give seconds >= 0 (0: do not wait)")
        return flag
    return DEFAULT_WAIT_S if on_platform else 0.0


# -- TrainJob and torchrun-style nodes -----------------------------------------------------------

@dataclasses.dataclass(frozen=True, kw_only=True)
class NodePlace:
    """This node's place in a world of ``nnodes`` nodes of ``nproc_per_node`` ranks each."""

    nnodes: int
    node_rank: int
    nproc_per_node: int
    master_addr: str
    master_port: int
    source: str

    @property
    def np(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def is_master(self) -> bool:
        return self.node_rank == 0


def node_place(flags: Mapping[str, str | None], job: JobEnv, *, gpus: int, cpus: int) -> NodePlace | None:
    """This node's place from torchrun's flags, else Trainer's ``PET_*`` variables; None when neither names nodes.

    ``--nproc-per-node`` takes a count or torchrun's words: ``gpu`` (the visible GPUs),
    ``cpu`` (the cores), ``auto`` (GPUs if any, else cores). A flag wins over its variable.

    Raises:
        LaunchError: a value that is not what it should be, named with where it came from
            and what to give instead.

    Example:
        >>> p = node_place({}, JobEnv(pet=(("PET_NNODES", "2"), ("PET_NPROC_PER_NODE", "1"), ("PET_NODE_RANK", "1"),
        ...                               ("PET_MASTER_ADDR", "t-node-0-0.t"), ("PET_MASTER_PORT", "29500"))),
        ...                gpus=0, cpus=4)
        >>> p.nnodes, p.node_rank, p.np, p.master_addr, p.master_port
        (2, 1, 2, 't-node-0-0.t', 29500)
    """
    pet = dict(job.pet)
    values: dict[str, tuple[str, str]] = {}  # field -> (value, where it came from)
    for field, variable in NODE_FLAGS.items():
        flag = flags.get(field)
        if flag is not None:
            values[field] = (str(flag), f"--{field.replace('_', '-')} {flag}")
        elif variable in pet:
            values[field] = (pet[variable], f"{variable}={pet[variable]}")
    if "nnodes" not in values:
        given = sorted(where for where in (w for _, w in values.values()) if where.startswith("--"))
        if given:
            raise LaunchError(f"{', '.join(given)} given without --nnodes (or PET_NNODES); give the node count too")
        return None
    nnodes = _whole(values["nnodes"], minimum=1, what="the number of nodes",
                    hint="a fixed count; for a changing world use ddlrun --elastic")
    node_rank = _whole(values.get("node_rank", ("0", "the default node rank 0")), minimum=0, what="the node rank")
    if node_rank >= nnodes:
        raise LaunchError(f"{values['node_rank'][1]}: node rank {node_rank} is not below the node count {nnodes} "
                          f"({values['nnodes'][1]}); give 0 to {nnodes - 1}")
    nproc = _procs(values.get("nproc_per_node", ("1", "the default of 1 rank per node")), gpus=gpus, cpus=cpus)
    addr_value, addr_where = values.get("master_addr", ("", ""))
    if nnodes > 1 and not addr_value:
        raise LaunchError(f"{values['nnodes'][1]} but no master address; give --master-addr (PET_MASTER_ADDR): "
                          "the host name of node 0 that every node resolves")
    port = _whole(values.get("master_port", (str(TRAINER_MASTER_PORT), f"the default port {TRAINER_MASTER_PORT}")),
                  minimum=1, what="the master port")
    if port > 65535:
        raise LaunchError(f"{values['master_port'][1]}: {port} is not a TCP port; give 1 to 65535")
    source = ", ".join(where for _, where in values.values())
    return NodePlace(nnodes=nnodes, node_rank=node_rank, nproc_per_node=nproc, master_addr=addr_value or "localhost",
                     master_port=port, source=source)


def check_node_options(place: NodePlace, *, np: int | None, hosts_given: bool) -> None:
    """Node mode and ``-np``/``-H`` must agree.

    Raises:
        LaunchError: ``-np`` is not nnodes x nproc_per_node, or hosts were given too.
    """
    if hosts_given:
        raise LaunchError(f"-H/--hostfile with nodes ({place.source}): give one or the other; with nodes every "
                          "node runs ddlrun and node 0 learns the hosts from them")
    if np is not None and np != place.np:
        raise LaunchError(f"-np {np} but {place.nnodes} node(s) x {place.nproc_per_node} rank(s) is {place.np} "
                          f"({place.source}); leave -np out or give -np {place.np}")


def _whole(value: tuple[str, str], *, minimum: int, what: str, hint: str = "") -> int:
    text, where = value
    if not re.fullmatch(r"\d+", text.strip()) or int(text) < minimum:
        extra = f" ({hint})" if hint else ""
        raise LaunchError(f"{where}: {text!r} is not {what}; give a whole number >= {minimum}{extra}")
    return int(text)


def _procs(value: tuple[str, str], *, gpus: int, cpus: int) -> int:
    text, where = value
    word = text.strip().lower()
    if word == "gpu":
        if gpus < 1:
            raise LaunchError(f"{where}: no GPU is visible on this node; give a rank count or 'cpu'")
        return gpus
    if word == "cpu":
        return max(1, cpus)
    if word == "auto":
        return gpus if gpus > 0 else max(1, cpus)
    return _whole(value, minimum=1, what="a rank count per node", hint="or torchrun's 'gpu', 'cpu', 'auto'")


def visible_gpus(device_names: list[str]) -> int:
    """NVIDIA GPUs a container sees, from the names in ``/dev`` (``nvidia0``, ``nvidia1``; not ``nvidiactl``).

    Example:
        >>> visible_gpus(["nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "null"])
        2
    """
    return sum(1 for name in device_names if re.fullmatch(r"nvidia\d+", name))
