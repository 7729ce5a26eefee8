"""One host's agent in an elastic job: its liveness for ``ddlrun``, and warm interpreters forked into ranks.

``ddlrun --elastic`` starts one agent per host (``mpiexec -n 1`` on that host) and keeps
it for the whole job. The agent

- connects to ``ddlrun`` over TCP, beats every half second, and leaves (killing its ranks)
  when it has heard nothing for the timeout: a host cut off from ``ddlrun`` fences itself;
- imports the training script's top-level modules once (:mod:`ddl.launcher.preload`);
- serves the rank stubs each world's ``mpiexec`` starts on this host (a unix socket in the
  host's store folder): each stub hands over its stdio and PMI socket, and the agent forks
  a rank that runs the program with the stub's environment, then reports how it ended;
- relays what ranks report (synced, commit, reset, done) to ``ddlrun``, and ``ddlrun``'s
  announcement of new hosts to the ranks; kills a world's ranks when ``ddlrun`` says stop.

Why a rank ended is part of the report: ``exit`` (its own status), ``signal`` (killed by
something else: the host is suspect), ``stop`` (``ddlrun`` asked), ``stub`` (its stub
vanished: ``mpiexec`` tore the world down because of a failure elsewhere).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import os
import selectors
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from ddl.launcher.preload import allow_mpi, imports_of, preload, python_target, run_target
from ddl.runtime.elastic_wire import AGENT_SOCKET, LineReader, Message, host_folder, send

BEAT_SECONDS = 0.5
#: How long a rank of a world that lost a host may take to leave by itself (its waiting
#: collectives raise HorovodInternalError) before it is killed; a rank blocked inside an
#: MPI call cannot leave and costs the recovery this much.
LOST_GRACE_SECONDS = 0.5
_PR_SET_PDEATHSIG = 1


@dataclasses.dataclass
class Launch:
    """What a stub asked for: the program, its environment and folder, and the descriptors it handed over."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    fds: list[int]  # stdin, stdout, stderr, then the PMI socket when the stub had one
    world: int
    rank: int


@dataclasses.dataclass
class Rank:
    """A forked rank, its stub's connection, and its own link (once it connects)."""

    pid: int
    world: int
    rank: int
    stub: socket.socket
    link: socket.socket | None = None
    killed_because: str | None = None
    kill_at: float | None = None  # told its world lost a host: killed then if still running


class Agent:
    """The agent of this host (see the module docstring); :meth:`serve` runs it."""

    def __init__(self, *, address: tuple[str, int], job: str, root: str, host: str, timeout: float,
                 command: Sequence[str], cold: bool = False) -> None:
        self.host, self.timeout, self.command, self.cold = host, timeout, list(command), cold
        self.folder = host_folder(root, job, socket.gethostname())
        self.folder.mkdir(parents=True, exist_ok=True)
        self.supervisor = socket.create_connection(address, timeout=10)
        self.supervisor.settimeout(2.0)
        self.selector = selectors.DefaultSelector()
        self.readers: dict[socket.socket, LineReader] = {}
        self.ranks: dict[int, Rank] = {}
        self.pending_links: set[socket.socket] = set()
        self.update_world = 0
        self.last_heard = time.monotonic()
        self.next_beat = 0.0
        self.listener: socket.socket | None = None

    # -- to ddlrun ---------------------------------------------------------------------
    def tell(self, message: Message) -> None:
        with contextlib.suppress(OSError):  # the silence counts: ddlrun's timeout and ours handle a lost link
            send(self.supervisor, {**message, "host": self.host, "at": time.time()})

    def warm_up(self) -> None:
        """Preload the program's modules, beating meanwhile (a thread, joined before any fork)."""
        self.tell({"t": "hello", "pid": os.getpid(), "folder": str(self.folder)})
        done = threading.Event()

        def beat() -> None:
            while not done.wait(BEAT_SECONDS):
                self.tell({"t": "beat"})

        beater = threading.Thread(target=beat, name="ddl-agent-beat", daemon=True)
        beater.start()
        start = time.perf_counter()
        target = None if self.cold else python_target(self.command)
        names = imports_of(target) if target else []
        if target is not None and target.kind == "path":
            sys.path[0] = os.path.dirname(os.path.abspath(target.target))
        imported, failed = preload(names)
        done.set()
        beater.join()
        sys.stdout.flush()
        sys.stderr.flush()
        self.tell({"t": "warm", "seconds": round(time.perf_counter() - start, 3), "imported": imported,
                   "failed": failed})

    # -- the loop ------------------------------------------------------------------------
    def serve(self) -> Launch | None:
        """Run until ``ddlrun`` says quit or goes silent (returns None), or, in a forked
        rank, return what that rank must run."""
        path = self.folder / AGENT_SOCKET
        path.unlink(missing_ok=True)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(64)
        self.selector.register(self.listener, selectors.EVENT_READ, "listener")
        self.selector.register(self.supervisor, selectors.EVENT_READ, "supervisor")
        self.readers[self.supervisor] = LineReader()
        self.last_heard = time.monotonic()
        while True:
            for key, _ in self.selector.select(timeout=0.1):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if key.data == "listener":
                    conn, _ = sock.accept()
                    self.readers[conn] = LineReader()
                    self.selector.register(conn, selectors.EVENT_READ, "local")
                    continue
                launch_or_end = self._readable(sock, key.data)
                if launch_or_end is not None:
                    return launch_or_end if isinstance(launch_or_end, Launch) else None
            self._reap()
            now = time.monotonic()
            for rank in self.ranks.values():
                if rank.kill_at is not None and now >= rank.kill_at and rank.killed_because is None:
                    self._kill(rank, "stop")
            if now >= self.next_beat:
                self.tell({"t": "beat"})
                self.next_beat = now + BEAT_SECONDS
            if now - self.last_heard > self.timeout:
                print(f"ddl agent on {self.host}: nothing from ddlrun for {self.timeout:g} s; ending this "
                      "host's ranks (it may be cut off from the job)", file=sys.stderr, flush=True)
                self.end()
                return None

    def _readable(self, sock: socket.socket, kind: str) -> Launch | bool | None:
        reader = self.readers[sock]
        try:
            messages = reader.receive(sock, with_fds=kind == "local")
        except (OSError, ValueError):
            messages = None
        if messages is None:
            return self._closed(sock, kind)
        for message in messages:
            if kind == "supervisor":
                if self._from_supervisor(message):
                    return True
            else:
                launch = self._from_local(sock, message, reader)
                if launch is not None:
                    return launch
        return None

    def _closed(self, sock: socket.socket, kind: str) -> bool | None:
        self._forget(sock)
        if kind == "supervisor":
            print(f"ddl agent on {self.host}: ddlrun closed the connection; ending", file=sys.stderr, flush=True)
            self.end()
            return True
        for rank in self.ranks.values():
            if rank.stub is sock and rank.killed_because is None:
                # mpiexec ended the stub (a failure elsewhere tore the world down): end its rank.
                self._kill(rank, "stub")
            if rank.link is sock:
                rank.link = None
        return None

    def _forget(self, sock: socket.socket) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(sock)
        self.readers.pop(sock, None)
        self.pending_links.discard(sock)
        sock.close()

    def _from_supervisor(self, message: Message) -> bool:
        self.last_heard = time.monotonic()
        kind = message["t"]
        if kind == "update":
            self.update_world = max(self.update_world, int(message["world"]))
            for rank in self.ranks.values():
                if rank.world <= self.update_world and rank.link is not None:
                    self._to(rank.link, {"t": "update"})
        elif kind == "stop":
            lost = message.get("why") == "lost"
            for rank in self.ranks.values():
                if rank.world > int(message["world"]) or rank.killed_because is not None:
                    continue
                if lost and rank.link is not None and rank.kill_at is None:
                    # Its collectives raise HorovodInternalError first (elastic.run restores and
                    # leaves); one blocked inside an MPI call is killed when the grace ends.
                    self._to(rank.link, {"t": "lost", "why": "a host of this elastic world was lost"})
                    rank.kill_at = time.monotonic() + LOST_GRACE_SECONDS
                elif not lost or rank.link is None:
                    self._kill(rank, "stop")
        elif kind == "quit":
            self.end()
            return True
        return False

    def _from_local(self, sock: socket.socket, message: Message, reader: LineReader) -> Launch | None:
        kind = message["t"]
        if kind == "launch":
            fds, reader.fds = reader.fds, []
            env = dict(message["env"])
            env["DDL_ELASTIC_STORE"] = str(self.folder)  # the rank's commits and its link to this agent
            launch = Launch(argv=list(message["argv"]), env=env, cwd=str(message["cwd"]), fds=fds,
                            world=int(env.get("DDL_ELASTIC_WORLD", "0")), rank=int(env.get("PMI_RANK", "-1")))
            return self._fork(launch, sock)
        if kind == "signal":
            for rank in self.ranks.values():
                if rank.stub is sock and rank.killed_because is None:
                    self._kill(rank, "stub", signal.Signals(int(message["sig"])))
        elif kind == "rank":
            linked = self.ranks.get(int(message["pid"]))
            if linked is not None:
                linked.link = sock
                if linked.world <= self.update_world:
                    self._to(sock, {"t": "update"})
        else:  # synced, commit, reset, done: progress, for ddlrun
            sender = next((r for r in self.ranks.values() if r.link is sock), None)
            if sender is not None:
                self.tell({**message, "world": sender.world, "rank": sender.rank})
        return None

    def _to(self, sock: socket.socket, message: Message) -> None:
        with contextlib.suppress(OSError):
            send(sock, message)

    # -- ranks -----------------------------------------------------------------------------
    def _fork(self, launch: Launch, stub: socket.socket) -> Launch | None:
        sys.stdout.flush()
        sys.stderr.flush()
        agent_pid = os.getpid()
        pid = os.fork()
        if pid == 0:
            self._become_rank(agent_pid, keep=launch.fds)
            return launch
        for fd in launch.fds:
            os.close(fd)
        self.ranks[pid] = Rank(pid=pid, world=launch.world, rank=launch.rank, stub=stub)
        self.tell({"t": "started", "world": launch.world, "rank": launch.rank, "pid": pid})
        return None

    def _become_rank(self, agent_pid: int, keep: list[int]) -> None:
        """In the forked child: die with the agent, drop the agent's sockets and handlers."""
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != agent_pid:  # the agent died before the line above took effect
            os._exit(1)
        for sock in [*self.readers, *self.pending_links, self.listener]:
            if sock is not None and sock.fileno() not in keep:
                sock.close()
        self.selector.close()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def _kill(self, rank: Rank, why: str, sig: signal.Signals = signal.SIGKILL) -> None:
        rank.killed_because = why
        with contextlib.suppress(ProcessLookupError):
            os.kill(rank.pid, sig)

    def _reap(self) -> None:
        while self.ranks:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            rank = self.ranks.pop(pid, None)
            if rank is None:
                continue
            code = os.waitstatus_to_exitcode(status)
            cause = rank.killed_because or ("signal" if code < 0 else "exit")
            self.tell({"t": "exit", "world": rank.world, "rank": rank.rank, "code": code, "cause": cause})
            self._to(rank.stub, {"t": "exit", "code": code})
            self._forget(rank.stub)

    def end(self) -> None:
        """Kill every rank, wait for them, remove this host's folder."""
        for rank in list(self.ranks.values()):
            self._kill(rank, "stop")
        deadline = time.monotonic() + 5
        while self.ranks and time.monotonic() < deadline:
            self._reap()
            time.sleep(0.02)
        if self.listener is not None:
            self.listener.close()
        shutil.rmtree(self.folder, ignore_errors=True)
        parent = self.folder.parent
        with contextlib.suppress(OSError):
            parent.rmdir()  # the job's folder, once no host of this machine uses it


def run_rank(launch: Launch, *, cold: bool = False) -> int:
    """In a forked rank: take the stub's stdio and PMI socket and environment, run the program
    (in this warm interpreter, or with ``exec`` when ``cold`` or not a Python program)."""
    for number, fd in zip((0, 1, 2), launch.fds[:3], strict=False):
        os.dup2(fd, number)
        if fd > 2:
            os.close(fd)
    env = dict(launch.env)
    if len(launch.fds) > 3:
        env["PMI_FD"] = str(launch.fds[3])  # the same socket, at whatever number it arrived
        os.set_inheritable(launch.fds[3], True)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(launch.cwd)
    allow_mpi()
    target = None if cold else python_target(launch.argv)
    if target is None:
        try:
            os.execvpe(launch.argv[0], launch.argv, env)
        except OSError as exc:
            print(f"ddl agent: cannot run {launch.argv[0]}: {exc}", file=sys.stderr, flush=True)
            return 127
    return run_target(target)


def _exit_on_term(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through Agent.end: the ranks go with the agent


def main(argv: list[str] | None = None) -> Any:
    """``python -m ddl.launcher.agent --connect HOST:PORT --job ID --root DIR --host NAME --timeout S -- COMMAND``."""
    parser = argparse.ArgumentParser(prog="python -m ddl.launcher.agent", description=__doc__.splitlines()[0])
    parser.add_argument("--connect", required=True, metavar="HOST:PORT")
    parser.add_argument("--job", required=True)
    parser.add_argument("--root", required=True)
    parser.add_argument("--host", required=True, help="this host's name in ddlrun's host list")
    parser.add_argument("--timeout", type=float, required=True)
    parser.add_argument("--cold", action="store_true", help="no preloading: every rank starts with exec")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    address, _, port = args.connect.rpartition(":")
    signal.signal(signal.SIGTERM, _exit_on_term)
    agent = Agent(address=(address, int(port)), job=args.job, root=args.root, host=args.host,
                  timeout=args.timeout, command=command, cold=args.cold)
    try:
        agent.warm_up()
        launch = agent.serve()
    except BaseException:
        agent.end()
        raise
    if launch is None:
        return 0
    return run_rank(launch, cold=args.cold)


if __name__ == "__main__":
    raise SystemExit(main())
