"""The process ``mpiexec`` starts for each rank of an elastic world: hands the rank to its host's agent.

It finds the agent of its entry of ddlrun's host list (``--hosts`` names the entry of
each rank, in rank order; the launcher's ``PMI_RANK`` says which is this one), connects
to that agent's unix socket, passes its stdin, stdout, stderr and PMI socket
(``SCM_RIGHTS``) with its argv, environment and folder, forwards SIGINT/SIGTERM/SIGHUP,
and ends as the rank ended (its status, or its signal), so ``mpiexec`` sees what it
would have seen had it started the rank itself. Standard library and ddl's settings
only: it starts in ~50 ms.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import time

from ddl.base.config import announced_world, environment
from ddl.runtime.elastic.protocol import ForwardSignal, LaunchRank, ProtocolError, Route, StubExit
from ddl.runtime.elastic.wire import AGENT_SOCKET, LineReader, host_folder, send

_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def connect(path: str, *, wait: float) -> socket.socket:
    """The agent's socket; retried for ``wait`` seconds (the agent may be a moment late)."""
    deadline = time.monotonic() + wait
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            return sock
        except OSError:
            sock.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def host_of_rank(hosts: str, env: dict[str, str]) -> str:
    """This rank's entry of the host list: ``hosts`` (``h1,h1,h2``: one entry per rank) at ``PMI_RANK``.

    Raises:
        ValueError: the launcher did not say this process's rank, or it is outside the list.

    Example:
        >>> host_of_rank("h1,h1,h2", {"PMI_RANK": "2", "PMI_SIZE": "3"})
        'h2'
    """
    names = hosts.split(",")
    announced = announced_world(env)
    rank = announced.rank if announced is not None else None
    if rank is None or not 0 <= rank < len(names):
        raise ValueError(f"the elastic stub of rank {rank} cannot find its host among {len(names)} ({hosts}); "
                         "it must be started by ddlrun --elastic's mpiexec, which sets PMI_RANK")
    return names[rank]


def main(argv: list[str] | None = None) -> int:
    """``python -m ddl.launcher.elastic.stub --root DIR --job ID --hosts H0,H1,... -- COMMAND ...``; the rank's status."""
    parser = argparse.ArgumentParser(prog="python -m ddl.launcher.elastic.stub")
    parser.add_argument("--root", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--hosts", required=True, help="each rank's entry of ddlrun's host list, in rank order")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    env = environment()
    try:
        host = host_of_rank(args.hosts, env)
    except ValueError as exc:
        print(f"ddl: {exc}", file=sys.stderr, flush=True)
        return 1
    path = str(host_folder(args.root, args.job, host) / AGENT_SOCKET)
    try:
        sock = connect(path, wait=5.0)
    except OSError as exc:
        print(f"ddl: no elastic agent for host {host} on {socket.gethostname()} ({path}: {exc}); ddlrun --elastic "
              "starts one per host before each world", file=sys.stderr, flush=True)
        return 1
    fds = [0, 1, 2]
    if env.get("PMI_FD", "").isdigit():
        fds.append(int(env["PMI_FD"]))
    send(sock, LaunchRank(argv=command, env=env, cwd=os.getcwd()), fds)

    def forward(signum: int, frame: object) -> None:
        with contextlib.suppress(OSError):
            send(sock, ForwardSignal(sig=signum))

    for sig in _FORWARDED:
        signal.signal(sig, forward)
    # With -disable-auto-cleanup, hydra tells the processes it started that a peer ended by
    # SIGUSR1 (MPICH's failure notification); the rank's fate is ddlrun's to decide, not ours.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    reader = LineReader(Route.AGENT_TO_STUB)
    while True:
        try:
            messages = reader.receive(sock)
        except InterruptedError:
            continue
        except (OSError, ProtocolError):
            messages = None
        if messages is None:
            print(f"ddl: the elastic agent of host {host} went away; this rank is gone", file=sys.stderr, flush=True)
            return 1
        for message in messages:
            if isinstance(message, StubExit):
                return _end_as(message.code)


def _end_as(code: int) -> int:
    if code >= 0:
        return code
    sig = -code
    with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP keep their default anyway
        signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)  # end by the same signal, as the rank did
    return 128 + sig


if __name__ == "__main__":
    raise SystemExit(main())
