"""The ``ddlrun`` command: parse its flags, find the MPI that mpi4py uses, run its mpiexec.

Every rank runs under a keeper that reports to ddlrun (:mod:`ddl.launcher.watch`): the
job ends within seconds of the first rank that fails, with that rank's status, and each
output line is tagged with its rank.

Exit status: the first failing rank's own (its status, or ``128 + N`` for signal N; 0
when every rank succeeded), ``128 + N`` when ddlrun itself was stopped by signal N, 2
for a usage or configuration error found before anything starts, 127 when no usable
MPI or mpiexec is found, or COMMAND's program or script does not exist.
"""

from __future__ import annotations

import argparse
import os
import shlex
import socket
import sys
from pathlib import Path
from typing import Any

from ddl import __version__
from ddl.base.config import BY_FIELD, environment, job_from_env, search_path
from ddl.base.cpus import available_cpus
from ddl.launcher import kubernetes, platforms
from ddl.launcher.command import (
    FLAGGED,
    Launch,
    LaunchError,
    LaunchOptions,
    MpiInfo,
    build_launch,
    placement,
    setting_help,
    validate_options,
)
from ddl.launcher.elastic import flags as elastic_flags
from ddl.launcher.elastic.supervisor import Supervisor
from ddl.launcher.hosts import HostListError, HostSlots, parse_host_list, read_hostfile
from ddl.launcher.machines import merge_same_machines
from ddl.launcher.mpi import MpiNotFoundError, detect_mpi
from ddl.launcher.preflight import ProgramNotFound, check_command
from ddl.launcher.tcp_listener import reachable_address
from ddl.launcher.watch.output import OutputRouter
from ddl.launcher.watch.server import WatchServer
from ddl.launcher.watch.watched_job import WatchedJob

USAGE_ERROR = 2
NOT_FOUND = 127


def build_parser() -> argparse.ArgumentParser:
    """ddlrun's argument parser; one flag per row of the settings table that has one."""
    parser = argparse.ArgumentParser(
        prog="ddlrun",
        description="Run COMMAND as N ddl ranks under the mpiexec of the MPI that mpi4py uses.",
        epilog="example: ddlrun -np 4 --topology 2x2 python train.py",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"ddlrun (ddl-runtime) {__version__}")
    parser.add_argument("-np", "-n", dest="np", type=int, metavar="N",
                        help="number of ranks (default: all slots of -H/--hostfile or of the Slurm allocation)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("-H", "--hosts", dest="hosts", metavar="HOST:SLOTS,...",
                       help="hosts and their slots, e.g. h1:2,h2:2 (default: this host)")
    where.add_argument("--hostfile", dest="hostfile", metavar="FILE",
                       help="file of hosts, one a line: 'host', 'host:2' or 'host slots=2'")
    for row in FLAGGED.values():  # one flag per row of the settings table that has one
        flag = str(row.flag)
        if row.field == "verbose":
            parser.add_argument("-v", "--verbose", dest="verbose", action="store_true",
                                help="explain the launch, print the mpiexec command line, and set DDL_VERBOSE=1")
        elif row.is_bool:
            parser.add_argument(flag, dest=row.field, action="store_true", help=f"{setting_help(row)} ({row.env}=1)")
        else:
            parser.add_argument(flag, dest=row.field, metavar=row.metavar,
                                help=f"{setting_help(row)} ({row.env}; default {row.default_text()})")
    output = parser.add_argument_group("output")
    output.add_argument("--tag-output", dest="tag_output", action=argparse.BooleanOptionalAction, default=True,
                        help="prefix each line with its rank, as horovodrun does: [1]<stdout>: (default: on)")
    output.add_argument("--log-dir", "--output-filename", dest="log_dir", metavar="DIR",
                        help="also write each rank's output to DIR/rank.N/stdout and stderr (horovodrun's "
                             "--output-filename layout)")
    elastic_flags.add_arguments(parser)
    kubernetes.add_arguments(parser)
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="COMMAND ...",
                        help="the program every rank runs; 'python'/'python3' becomes ddlrun's interpreter")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``ddlrun`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit status.

    Example:
        >>> main(["-np", "2", "python", "-c", "import ddl; ddl.init()"])  # doctest: +SKIP
        0
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error argparse already printed
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else USAGE_ERROR)
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if args.elastic:
        return _elastic(parser, args, command)
    given_elastic = [f"--{name.replace('_', '-')}" for name in elastic_flags.ELASTIC_ONLY if getattr(args, name) is not None]
    if given_elastic:
        _error(f"{', '.join(given_elastic)} {'applies' if len(given_elastic) == 1 else 'apply'} only with --elastic")
        return USAGE_ERROR
    job = job_from_env()
    try:  # torchrun-style nodes (a Kubeflow TrainJob's PET_* variables): every node runs ddlrun, no ssh
        place = kubernetes.node_place({f: getattr(args, f) for f in kubernetes.NODE_FLAGS}, job,
                                      gpus=platforms.gpus_here(), cpus=available_cpus())
        if place is not None:
            kubernetes.check_node_options(place, np=args.np, hosts_given=bool(args.hosts or args.hostfile))
    except LaunchError as exc:
        _error(str(exc))
        return USAGE_ERROR
    if place is not None and place.nnodes > 1:
        return _nodes(parser, args, command, place)
    try:
        typed = _hosts(args)
        pod = None if typed or job.in_slurm else platforms.mpijob_hosts(job)  # a Kubeflow MPIJob's launcher pod
        given = typed or (pod.hosts if pod else ())
        np_, hosts, where = placement(args.np if place is None else place.np, given, job)
        where = [*(pod.notes if pod else []), *where]
        wait = kubernetes.wait_timeout(args.wait_for_workers, on_platform=pod is not None and pod.in_mpijob)
        options = LaunchOptions(
            np=np_,
            command=tuple(command),
            hosts=hosts,
            verbose=args.verbose,
            **{field: getattr(args, field) for field in FLAGGED if field != "verbose"},
        )
        validate_options(options)
        if not wait:  # names the user typed or set (a scheduler's own are its business)
            check_resolvable(given)
        options.hosts, merged = merge_same_machines(options.hosts)
        check_command(options.command, path_dirs=search_path(), cwd=Path.cwd())
    except ProgramNotFound as exc:
        _error(str(exc))
        return exc.status
    except (LaunchError, HostListError) as exc:
        return _usage_error(parser, command, exc)
    for note in merged:
        print(f"ddlrun: note: {note}", file=sys.stderr)
    mpi = _detect_mpi()
    if isinstance(mpi, int):
        return mpi
    if wait and hosts:  # the pods of a fresh MPIJob come up after its launcher
        waited = platforms.wait_for_workers(hosts, np_, mpi=mpi, env=environment(), timeout=wait)
        if waited is not None:
            return waited
    server = WatchServer()
    monitor = server.address(reachable_address([h.name for h in options.hosts]))
    launch = build_launch(
        options,
        mpi=mpi,
        cpu_count=available_cpus(),
        base_env={**environment(), BY_FIELD["monitor"].env: monitor},
        python_executable=sys.executable,
        is_root=_is_root(),
        wrap=(sys.executable, "-m", "ddl.launcher.watch.keeper", "--"),
    )
    launch = platforms.finish_launch(launch, mpi=mpi, base_env=environment(), hosts_given=bool(hosts))
    if options.verbose:
        for note in [*where, *launch.notes]:
            print(f"ddlrun: {note}", file=sys.stderr)
        print(f"ddlrun: each rank runs under a keeper reporting to {monitor.rsplit('/', 1)[0]}", file=sys.stderr)
        print(f"ddlrun: running {shlex.join(launch.argv)}", file=sys.stderr, flush=True)
    return run_launch(launch, server, np=np_, tagged=args.tag_output,
                      log_dir=Path(args.log_dir) if args.log_dir else None)


def run_launch(launch: Launch, server: WatchServer, *, np: int, tagged: bool, log_dir: Path | None) -> int:
    """Run ``launch`` (its ranks under keepers reporting to ``server``) to its end; the job's status.

    SIGINT, SIGTERM and SIGHUP are passed to mpiexec (a second one kills it); the first
    failing rank ends the job (:mod:`ddl.launcher.watch`).
    """
    router = OutputRouter(np=np, tagged=tagged, log_dir=log_dir, stdout=sys.stdout.buffer, stderr=sys.stderr.buffer)
    return WatchedJob(launch, server, np=np, router=router).run()


def _elastic(parser: argparse.ArgumentParser, args: argparse.Namespace, command: list[str]) -> int:
    """``ddlrun --elastic``: the supervisor of :mod:`ddl.launcher.elastic.supervisor`."""
    try:
        given = _hosts(args)
        hosts = given
        if not hosts:  # an elastic MPIJob: the operator's discover_hosts.sh, its workers' slots
            platforms.mpijob_discovery(args, job_from_env())
        if not hosts and not args.host_discovery_script:
            hosts = placement(args.np or 1, given, job_from_env())[1]  # the Slurm allocation's, if any
        settings = {field: getattr(args, field) for field in FLAGGED if field != "verbose"}
        options = elastic_flags.options_from_args(args, command=tuple(command), hosts=hosts,
                                            settings={k: v for k, v in settings.items() if v not in (None, False)})
        settings_given: dict[str, Any] = dict(options.settings)
        validate_options(LaunchOptions(np=options.max_np, command=options.command, hosts=(), **settings_given))
        check_resolvable(given)
    except (LaunchError, HostListError, ValueError) as exc:
        return _usage_error(parser, command, exc)
    mpi = _detect_mpi()
    if isinstance(mpi, int):
        return mpi
    supervisor = Supervisor(options, mpi=mpi, base_env=environment(), python_executable=sys.executable,
                                    cpu_count=available_cpus(), is_root=_is_root())
    return supervisor.run()


def _nodes(parser: argparse.ArgumentParser, args: argparse.Namespace, command: list[str],
           place: kubernetes.NodePlace) -> int:
    """Node mode (:func:`ddl.launcher.platforms.run_nodes`): this node's part of a world without ssh."""
    settings = {field: getattr(args, field) for field in FLAGGED if field != "verbose"}
    try:
        validate_options(LaunchOptions(np=place.np, command=tuple(command), verbose=args.verbose, **settings))
        wait = kubernetes.wait_timeout(args.wait_for_workers, on_platform=True)
    except LaunchError as exc:
        return _usage_error(parser, command, exc)
    mpi = _detect_mpi()
    if isinstance(mpi, int):
        return mpi
    return platforms.run_nodes(place, command=tuple(command), settings=settings, verbose=args.verbose, mpi=mpi,
                               base_env=environment(), cpu_count=available_cpus(), is_root=_is_root(),
                               timeout=wait, python_executable=sys.executable)


def check_resolvable(hosts: tuple[HostSlots, ...]) -> None:
    """Every host name must resolve here, so a typo stops ddlrun before any rank starts.

    Raises:
        HostListError: a name does not resolve (the message names it and what to check).
    """
    for host in hosts:
        try:
            socket.getaddrinfo(host.name, None)
        except (socket.gaierror, UnicodeError) as exc:
            raise HostListError(
                f"host {host.name!r} does not resolve ({exc}); check the name in -H/--hostfile, "
                "/etc/hosts or DNS"
            ) from None


def _hosts(args: argparse.Namespace) -> tuple[HostSlots, ...]:
    if args.hosts is not None:
        return parse_host_list(args.hosts)
    if args.hostfile is not None:
        return read_hostfile(args.hostfile)
    return ()


def _is_root() -> bool:
    return sys.platform != "win32" and os.geteuid() == 0


def _detect_mpi() -> MpiInfo | int:
    """The MPI to launch with, or the exit status after saying why there is none."""
    try:
        return detect_mpi(python_executable=sys.executable, path=search_path())
    except MpiNotFoundError as exc:
        _error(str(exc))
        return NOT_FOUND
    except LaunchError as exc:
        _error(str(exc))
        return USAGE_ERROR


def _usage_error(parser: argparse.ArgumentParser, command: list[str], exc: Exception) -> int:
    """Say what was wrong with the flags (after the usage line when no COMMAND was given); the exit status."""
    if not command:
        parser.print_usage(sys.stderr)
    _error(str(exc))
    return USAGE_ERROR


def _error(message: str) -> None:
    print(f"ddlrun: error: {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
