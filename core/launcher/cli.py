"""The ``ddlrun`` command: parse its flags, find the MPI that mpi4py uses, run its mpiexec.

Exit status: the job's (non-zero if any rank failed; ``128 + N`` if mpiexec died of
signal N), 2 for a usage or configuration error found before anything starts, 127 when
no usable MPI or mpiexec is found.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
from types import FrameType
from typing import Any

from ddl.config import LAUNCHER_FLAGS, job_from_env, search_path
from ddl.launcher.command import (
    Launch,
    LaunchError,
    LaunchOptions,
    build_launch,
    placement,
    validate_options,
)
from ddl.launcher.hosts import HostListError, HostSlots, parse_host_list, read_hostfile
from ddl.launcher.mpi import MpiNotFoundError, detect_mpi

USAGE_ERROR = 2
NOT_FOUND = 127
_FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def build_parser() -> argparse.ArgumentParser:
    """ddlrun's argument parser; the dests of DDL flags are the keys of ``LAUNCHER_FLAGS``."""
    parser = argparse.ArgumentParser(
        prog="ddlrun",
        description="Run COMMAND as N ddl ranks under the mpiexec of the MPI that mpi4py uses.",
        epilog="example: ddlrun -np 4 --topology 2x2 python train.py",
        allow_abbrev=False,
    )
    parser.add_argument("-np", "-n", dest="np", type=int, metavar="N",
                        help="number of ranks (default: all slots of -H/--hostfile or of the Slurm allocation)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("-H", "--hosts", dest="hosts", metavar="HOST:SLOTS,...",
                       help="hosts and their slots, e.g. h1:2,h2:2 (default: this host)")
    where.add_argument("--hostfile", dest="hostfile", metavar="FILE",
                       help="file of hosts, one a line: 'host', 'host:2' or 'host slots=2'")
    parser.add_argument("--topology", dest="topology", metavar="DIMS",
                        help="multi-ring dims, innermost first, e.g. 4x16 (4 per host x 16 hosts)")
    parser.add_argument("--algorithm", dest="algorithm", metavar="NAME",
                        help="default allreduce algorithm: auto, mpi, ring, multiring, halving_doubling")
    parser.add_argument("--segment-bytes", dest="segment_bytes", type=int, metavar="BYTES",
                        help="largest single message (bounds each rank's scratch buffer)")
    parser.add_argument("--timeline", dest="timeline", metavar="FILE",
                        help="write a Chrome-trace JSON of every collective (rank 0)")
    parser.add_argument("--fusion-threshold", dest="fusion_threshold", type=int, metavar="BYTES",
                        help="largest fused allreduce buffer (0: no fusion)")
    parser.add_argument("--stall-timeout", dest="stall_timeout", type=float, metavar="SECONDS",
                        help="abort when a tensor is missing on some ranks this long")
    parser.add_argument("--calibration", dest="calibration", metavar="FILE|off",
                        help="cost model behind auto: measured at init (default), 'off' for fixed "
                             "constants, or a file to reuse (written when missing or stale)")
    parser.add_argument("-v", "--verbose", dest="verbose", action="store_true",
                        help="explain the launch, print the mpiexec command line, and set DDL_VERBOSE=1")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="COMMAND ...",
                        help="the program every rank runs; 'python'/'python3' becomes ddlrun's interpreter")
    return parser


def run(launch: Launch) -> int:
    """Run the launch, forwarding SIGINT and SIGTERM to mpiexec; returns its exit status."""
    try:
        child = subprocess.Popen(launch.argv, env=launch.env)
    except OSError as exc:
        _error(f"cannot start {launch.argv[0]} ({exc}); check that it is an executable mpiexec")
        return NOT_FOUND

    def forward(signum: int, frame: FrameType | None) -> None:
        child.send_signal(signum)

    previous: dict[int, Any] = {}  # whatever signal.signal returned, to restore
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, forward) for sig in _FORWARDED_SIGNALS}
    try:
        code = child.wait()
    except KeyboardInterrupt:  # a signal before the handlers were in place
        child.send_signal(signal.SIGINT)
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
    return 128 - code if code < 0 else code


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
    try:
        given = _hosts(args)
        np_, hosts, where = placement(args.np, given, job_from_env())
        options = LaunchOptions(
            np=np_,
            command=tuple(command),
            hosts=hosts,
            **{flag: getattr(args, flag) for flag in LAUNCHER_FLAGS},
        )
        validate_options(options)
        check_resolvable(given)  # names the user typed; a scheduler's own are its business
    except (LaunchError, HostListError) as exc:
        if not command:
            parser.print_usage(sys.stderr)
        _error(str(exc))
        return USAGE_ERROR
    try:
        mpi = detect_mpi(python_executable=sys.executable, path=search_path())
    except MpiNotFoundError as exc:
        _error(str(exc))
        return NOT_FOUND
    except LaunchError as exc:
        _error(str(exc))
        return USAGE_ERROR
    launch = build_launch(
        options,
        mpi=mpi,
        cpu_count=_cpu_count(),
        base_env=os.environ,
        python_executable=sys.executable,
        is_root=_is_root(),
    )
    if options.verbose:
        for note in [*where, *launch.notes]:
            print(f"ddlrun: {note}", file=sys.stderr)
        print(f"ddlrun: running {shlex.join(launch.argv)}", file=sys.stderr, flush=True)
    return run(launch)


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


def _cpu_count() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def _is_root() -> bool:
    return sys.platform != "win32" and os.geteuid() == 0


def _error(message: str) -> None:
    print(f"ddlrun: error: {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
