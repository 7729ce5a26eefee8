"""ddlrun's steps on Kubernetes: hosts from an MPIJob's ConfigMap, the wait for its workers, a TrainJob's nodes.

The decisions are the pure functions of :mod:`ddl.launcher.kubernetes`,
:mod:`ddl.launcher.readiness` and :mod:`ddl.launcher.node_protocol`; this module does
their reading, printing and running for :mod:`ddl.launcher.cli`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ddl.base.config import JobEnv
from ddl.launcher.command import Launch, LaunchOptions, MpiInfo, build_launch
from ddl.launcher.hosts import (
    HostListError,
    HostSlots,
    format_host_list,
    ranks_per_host,
    read_hostfile,
)
from ddl.launcher.kubernetes import (
    MpiJobHostfile,
    NodePlace,
    discovery_script,
    mpijob_hostfile,
    visible_gpus,
)
from ddl.launcher.node_launch import NodeLaunchError, refuse_open_mpi, run_master, run_node
from ddl.launcher.openmpi import with_open_mpi_settings
from ddl.launcher.readiness import (
    WorkersNotReady,
    is_local,
    probe_host,
    ssh_command,
    wait_for_hosts,
)

#: The exit status when the hosts or nodes never became ready (as for an unusable MPI).
NOT_READY = 1


@dataclasses.dataclass(frozen=True)
class PodHosts:
    """Hosts an MPIJob's launcher pod provides, and the notes saying where they came from."""

    hosts: tuple[HostSlots, ...]
    notes: list[str]
    hostfile: MpiJobHostfile
    in_mpijob: bool  # K_MPI_JOB_ROLE=launcher: workers may not run yet, so ddlrun waits for them


def report(line: str) -> None:
    print(f"ddlrun: {line}", file=sys.stderr, flush=True)


def mpijob_hosts(job: JobEnv) -> PodHosts | None:
    """The hosts of this MPIJob launcher pod's hostfile, or None outside one.

    Raises:
        HostListError: the hostfile cannot be read or is malformed.
    """
    hostfile = mpijob_hostfile(job, exists=os.path.exists)
    if hostfile is None:
        return None
    hosts = read_hostfile(hostfile.path)
    return PodHosts(hosts=hosts, notes=[f"hosts {format_host_list(hosts)} from {hostfile.path} ({hostfile.source})"],
                    hostfile=hostfile, in_mpijob=job.mpijob_role == "launcher")


def mpijob_discovery(args: Any, job: JobEnv) -> None:
    """In an MPIJob's launcher pod, default ``--host-discovery-script`` to the operator's
    ``discover_hosts.sh`` and ``--slots`` (it lists bare names) to the hostfile's slots per worker."""
    script = discovery_script(given=args.host_discovery_script, in_mpijob=job.mpijob_role == "launcher",
                              exists=os.path.exists)
    if script is None or script == args.host_discovery_script:
        return
    args.host_discovery_script = script
    report(f"hosts from {script} (the MPI Operator's discover_hosts.sh; K_MPI_JOB_ROLE=launcher)")
    if args.slots is None:
        with contextlib.suppress(HostListError):
            pod = mpijob_hosts(job)
            if pod is not None:
                args.slots = max(host.slots for host in pod.hosts)
                report(f"--slots {args.slots}: the slots per worker of {pod.hostfile.path}")


def wait_for_workers(hosts: tuple[HostSlots, ...], np: int, *, mpi: MpiInfo, env: Mapping[str, str],
                     timeout: float) -> int | None:
    """Wait until the hosts that get ranks resolve and accept the MPI's ssh; None when ready, else the exit status."""
    used = [host.name for host, count in zip(hosts, ranks_per_host(hosts, np), strict=True) if count > 0]
    ssh = ssh_command(mpi.flavour, env)
    here = socket.gethostname()
    probing = "resolve and accept ssh" if ssh else "resolve"
    report(f"checking that {len(used)} host(s) {probing} before launching (up to {timeout:g} s, --wait-for-workers)")
    try:
        wait_for_hosts(used, timeout=timeout, report=report,
                       probe=lambda host: probe_host(host, ssh=ssh, local=is_local(host, here)))
    except WorkersNotReady as exc:
        report(f"error: {exc}")
        return NOT_READY
    return None


def finish_launch(launch: Launch, *, mpi: MpiInfo, base_env: Mapping[str, str], hosts_given: bool) -> Launch:
    """The launch with Open MPI's settings (see :mod:`ddl.launcher.openmpi`)."""
    return with_open_mpi_settings(launch, mpi=mpi, base_env=base_env, rdma_devices=_rdma_devices(),
                                  hosts_given=hosts_given)


def gpus_here() -> int:
    """NVIDIA GPUs this container sees (for ``--nproc-per-node gpu/auto``)."""
    try:
        return visible_gpus(os.listdir("/dev"))
    except OSError:
        return 0


def run_nodes(place: NodePlace, *, command: tuple[str, ...], settings: Mapping[str, object], verbose: bool,
              mpi: MpiInfo, base_env: Mapping[str, str], cpu_count: int, is_root: bool, timeout: float,
              python_executable: str) -> int:
    """Node mode: node 0 starts the world over every node's host, the others join it.

    Returns:
        The job's exit status; :data:`NOT_READY` when the world never formed.
    """
    try:
        refuse_open_mpi(mpi.flavour)
    except ValueError as exc:
        report(f"error: {exc}")
        return 2
    try:
        if not place.is_master:
            return run_node(place, env=base_env, timeout=timeout, report=report)

        # hydra runs with -genvnone: each node's ranks keep their own environment (its DDL_HOSTNAME
        # too), and get only what ddlrun's flags set, the same on every node.
        own_env = {name: value for name, value in base_env.items() if not name.startswith("DDL_")}

        def make_launch(hosts: list[tuple[str, int]]) -> Launch:
            given: dict[str, Any] = dict(settings)
            options = LaunchOptions(np=place.np, command=command, hosts=tuple(HostSlots(n, s) for n, s in hosts),
                                    verbose=verbose, **given)
            launch = build_launch(options, mpi=mpi, cpu_count=cpu_count, base_env=own_env,
                                  python_executable=python_executable, is_root=is_root)
            if verbose:
                for note in launch.notes:
                    report(note)
            return launch

        return run_master(place, make_launch, timeout=timeout, report=report, proxy_env=base_env)
    except NodeLaunchError as exc:
        report(f"error: {exc}")
        return NOT_READY


def _rdma_devices() -> bool:
    try:
        return any(Path("/sys/class/infiniband").iterdir())
    except OSError:
        return False


__all__ = ["PodHosts", "finish_launch", "gpus_here", "mpijob_discovery", "mpijob_hosts", "run_nodes",
           "wait_for_workers"]
