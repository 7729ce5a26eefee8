"""The process ``mpiexec`` starts for each rank of an elastic world: hands the rank to its host's agent.

It connects to the agent's unix socket, passes its stdin, stdout, stderr and PMI socket
(``SCM_RIGHTS``) with its argv, environment and folder, forwards SIGINT/SIGTERM/SIGHUP,
and ends as the rank ended (its status, or its signal), so ``mpiexec`` sees what it would
have seen had it started the rank itself. Standard library only: it starts in ~50 ms.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import time

from ddl.runtime.elastic_wire import AGENT_SOCKET, LineReader, host_folder, send

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


def main(argv: list[str] | None = None) -> int:
    """``python -m ddl.launcher.stub --root DIR --job ID -- COMMAND ...``; returns the rank's status."""
    parser = argparse.ArgumentParser(prog="python -m ddl.launcher.stub")
    parser.add_argument("--root", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    path = str(host_folder(args.root, args.job, socket.gethostname()) / AGENT_SOCKET)
    try:
        sock = connect(path, wait=5.0)
    except OSError as exc:
        print(f"ddl: no elastic agent on {socket.gethostname()} ({path}: {exc}); ddlrun --elastic starts "
              "one per host before each world", file=sys.stderr, flush=True)
        return 1
    fds = [0, 1, 2]
    if os.environ.get("PMI_FD", "").isdigit():
        fds.append(int(os.environ["PMI_FD"]))
    send(sock, {"t": "launch", "argv": command, "env": dict(os.environ), "cwd": os.getcwd()}, fds)

    def forward(signum: int, frame: object) -> None:
        with contextlib.suppress(OSError):
            send(sock, {"t": "signal", "sig": signum})

    for sig in _FORWARDED:
        signal.signal(sig, forward)
    # With -disable-auto-cleanup, hydra tells the processes it started that a peer ended by
    # SIGUSR1 (MPICH's failure notification); the rank's fate is ddlrun's to decide, not ours.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    reader = LineReader()
    while True:
        try:
            messages = reader.receive(sock)
        except InterruptedError:
            continue
        except (OSError, ValueError):
            messages = None
        if messages is None:
            print(f"ddl: the elastic agent on {socket.gethostname()} went away; this rank is gone",
                  file=sys.stderr, flush=True)
            return 1
        for message in messages:
            if message["t"] == "exit":
                return _end_as(int(message["code"]))


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
