"""One host's agent in an elastic job: its liveness for ``ddlrun``, and warm interpreters forked into ranks.

``ddlrun --elastic`` starts one agent per host of its list (``mpiexec -n 1`` on that host)
and keeps it for the whole job. The agent

- connects to ``ddlrun`` over TCP and beats (its rate follows ``--elastic-timeout``:
  :mod:`ddl.launcher.elastic.timing`); it ends its ranks when it has heard nothing from
  ``ddlrun`` for the timeout: a host cut off from ``ddlrun`` fences itself;
- imports the training script's top-level modules once (:mod:`ddl.launcher.elastic.preload`);
- serves the rank stubs each world's ``mpiexec`` starts on this host (a unix socket in
  this list entry's folder): each stub hands over its stdio and PMI socket, and the agent
  forks a rank that runs the program with the stub's environment, then reports how it ended;
- relays what ranks report to ``ddlrun``, and ``ddlrun``'s announcements and stops to the ranks.

What to do with each message is :mod:`ddl.launcher.elastic.agent_machine`'s (pure); this
loop only reads sockets, forks, kills and sends.
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

from ddl.base.config import BY_FIELD, announced_world
from ddl.launcher.elastic import agent_machine as machine
from ddl.launcher.elastic.preload import allow_mpi, imports_of, preload, python_target, run_target
from ddl.launcher.elastic.timing import Timing
from ddl.runtime.elastic.protocol import (
    AgentHello,
    AgentWarm,
    AnnounceHosts,
    Beat,
    ForwardSignal,
    LaunchRank,
    Message,
    Ping,
    ProtocolError,
    Quit,
    RankBeat,
    RankLink,
    RankReport,
    Route,
    StopWorld,
)
from ddl.runtime.elastic.wire import AGENT_SOCKET, LineReader, host_folder, send

_PR_SET_PDEATHSIG = 1


@dataclasses.dataclass
class Forked:
    """What a forked rank must run: the program, its environment and folder, and the stub's descriptors."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    fds: list[int]  # stdin, stdout, stderr, then the PMI socket when the stub had one


class Agent:
    """The agent of one host of ddlrun's list (see the module docstring); :meth:`serve` runs it."""

    def __init__(self, *, address: tuple[str, int], job: str, root: str, host: str, timing: Timing,
                 command: Sequence[str], cold: bool = False) -> None:
        self.host, self.timing, self.command, self.cold = host, timing, list(command), cold
        # The folder is the list entry's, not the machine's: two entries for one machine are two agents.
        self.folder = host_folder(root, job, host)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.supervisor = socket.create_connection(address, timeout=10)
        self.supervisor.settimeout(2.0)
        self.selector = selectors.DefaultSelector()
        self.readers: dict[socket.socket, LineReader] = {}
        self.stubs: dict[int, socket.socket] = {}  # rank pid -> its stub's connection
        self.links: dict[int, socket.socket] = {}  # rank pid -> its own connection
        self.state = machine.AgentState(host=host, last_heard=time.monotonic())
        self.listener: socket.socket | None = None
        self.socket_inode: int | None = None

    # -- to ddlrun ---------------------------------------------------------------------
    def tell(self, message: Message) -> None:
        with contextlib.suppress(OSError):  # the silence counts: ddlrun's detection and ours handle a lost link
            send(self.supervisor, message)

    def warm_up(self) -> None:
        """Preload the program's modules, beating meanwhile (a thread, joined before any fork)."""
        self.tell(AgentHello(host=self.host, pid=os.getpid(), folder=str(self.folder)))
        done = threading.Event()

        def beat() -> None:
            seq = 0
            while not done.wait(self.timing.beat):
                seq += 1
                self.tell(Beat(host=self.host, seq=seq))

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
        self.tell(AgentWarm(host=self.host, seconds=round(time.perf_counter() - start, 3), imported=imported,
                            failed=failed))

    # -- the loop ------------------------------------------------------------------------
    def serve(self) -> Forked | None:
        """Run until ``ddlrun`` says quit or goes silent (returns None), or, in a forked
        rank, return what that rank must run."""
        path = self.folder / AGENT_SOCKET
        path.unlink(missing_ok=True)  # a socket left by a crashed agent of this very list entry
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.socket_inode = path.stat().st_ino
        self.listener.listen(64)
        self.selector.register(self.listener, selectors.EVENT_READ, "listener")
        self.selector.register(self.supervisor, selectors.EVENT_READ, "supervisor")
        self.readers[self.supervisor] = LineReader(Route.SUPERVISOR_TO_AGENT)
        self.state = dataclasses.replace(self.state, last_heard=time.monotonic())
        while True:
            for key, _ in self.selector.select(timeout=min(0.1, self.timing.beat / 2)):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if key.data == "listener":
                    conn, _ = sock.accept()
                    self.readers[conn] = LineReader(Route.STUB_TO_AGENT, Route.RANK_TO_AGENT)
                    self.selector.register(conn, selectors.EVENT_READ, "local")
                    continue
                outcome = self._readable(sock, key.data)
                if outcome is not None:
                    return outcome if isinstance(outcome, Forked) else None
            for pid, code in self._reaped():
                if self._apply(machine.RankExited(pid, code)):
                    return None
            if self._apply(machine.AgentTick(time.monotonic())):
                return None

    def _apply(self, event: machine.AgentEvent) -> bool:
        """Run ``event`` through the machine and carry out its actions; True when the agent ended."""
        self.state, actions = machine.step(self.state, event, self.timing)
        for action in actions:
            if isinstance(action, machine.TellSupervisor):
                self.tell(action.message)
            elif isinstance(action, machine.KillRank):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(action.pid, action.sig)
            elif isinstance(action, machine.TellRank):
                link = self.links.get(action.pid)
                if link is not None:
                    self._to(link, action.message)
            elif isinstance(action, machine.TellStub):
                stub = self.stubs.pop(action.pid, None)
                if stub is not None:
                    self._to(stub, action.message)
                    self._forget(stub)
            elif isinstance(action, machine.Log):
                print(f"ddl agent on {self.host}: {action.text}", file=sys.stderr, flush=True)
            else:
                print(f"ddl agent on {self.host}: {action.why}", file=sys.stderr, flush=True)
                self.end()
                return True
        return False

    def _readable(self, sock: socket.socket, kind: str) -> Forked | bool | None:
        reader = self.readers[sock]
        try:
            messages = reader.receive(sock, with_fds=kind == "local")
        except (OSError, ProtocolError) as exc:
            if isinstance(exc, ProtocolError):
                print(f"ddl agent on {self.host}: {exc}", file=sys.stderr, flush=True)
            messages = None
        if messages is None:
            return self._closed(sock, kind)
        for message in messages:
            if kind == "supervisor":
                assert isinstance(message, (Ping, StopWorld, AnnounceHosts, Quit))  # the reader takes no other route
                if self._apply(machine.FromSupervisor(message, time.monotonic())):
                    return True
            else:
                forked = self._from_local(sock, message, reader)
                if forked is not None:
                    return forked
        return None

    def _closed(self, sock: socket.socket, kind: str) -> bool | None:
        self._forget(sock)
        if kind == "supervisor":
            return True if self._apply(machine.SupervisorGone(time.monotonic())) else None
        for pid, stub in list(self.stubs.items()):
            if stub is sock:  # mpiexec ended the stub (a failure elsewhere tore the world down)
                del self.stubs[pid]
                self._apply(machine.StubGone(pid))
        for pid, link in list(self.links.items()):
            if link is sock:
                del self.links[pid]
        return None

    def _forget(self, sock: socket.socket) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(sock)
        self.readers.pop(sock, None)
        sock.close()

    def _from_local(self, sock: socket.socket, message: Message, reader: LineReader) -> Forked | None:
        if isinstance(message, LaunchRank):
            fds, reader.fds = reader.fds, []
            env = dict(message.env)
            env[BY_FIELD["elastic_store"].env] = str(self.folder)  # the rank's commits and its link to this agent
            return self._fork(Forked(argv=list(message.argv), env=env, cwd=message.cwd, fds=fds), sock)
        if isinstance(message, ForwardSignal):
            pid = next((p for p, s in self.stubs.items() if s is sock), None)
            if pid is not None:
                self._apply(machine.StubSignalled(pid, message.sig))
        elif isinstance(message, RankLink):
            if message.pid in self.state.ranks:
                self.links[message.pid] = sock
                self._apply(machine.RankLinked(message.pid, time.monotonic()))
        elif isinstance(message, (RankReport, RankBeat)):
            pid = next((p for p, s in self.links.items() if s is sock), None)
            if pid is not None:
                self._apply(machine.RankSaid(pid, message, time.monotonic()))
        return None

    def _to(self, sock: socket.socket, message: Message) -> None:
        with contextlib.suppress(OSError):
            send(sock, message)

    # -- ranks -----------------------------------------------------------------------------
    def _fork(self, forked: Forked, stub: socket.socket) -> Forked | None:
        world = BY_FIELD["elastic_world"].read(forked.env)
        announced = announced_world(forked.env)
        rank = announced.rank if announced is not None and announced.rank is not None else -1
        sys.stdout.flush()
        sys.stderr.flush()
        agent_pid = os.getpid()
        pid = os.fork()
        if pid == 0:
            self._become_rank(agent_pid, keep=forked.fds)
            return forked
        for fd in forked.fds:
            os.close(fd)
        self.stubs[pid] = stub
        self._apply(machine.RankForked(pid, world, rank))
        return None

    def _become_rank(self, agent_pid: int, keep: list[int]) -> None:
        """In the forked child: die with the agent, drop the agent's sockets and handlers."""
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != agent_pid:  # the agent died before the line above took effect
            os._exit(1)
        for sock in [*self.readers, self.listener]:
            if sock is not None and sock.fileno() not in keep:
                sock.close()
        self.selector.close()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def _reaped(self) -> list[tuple[int, int]]:
        """(pid, exit code) of this agent's ranks that ended; only their pids are waited for, never
        ``-1``: children of modules the agent preloaded are theirs to reap."""
        out = []
        for pid in list(self.state.ranks):
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                out.append((pid, -int(signal.SIGKILL)))  # reaped elsewhere: it is gone, cause unknown
                continue
            if done:
                out.append((pid, os.waitstatus_to_exitcode(status)))
        return out

    def end(self) -> None:
        """Kill every rank, wait for them, remove this host's folder."""
        for pid in list(self.state.ranks):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            for pid, _ in self._reaped():
                self.state = dataclasses.replace(self.state, ranks={p: e for p, e in self.state.ranks.items()
                                                                    if p != pid})
            if not self.state.ranks:
                break
            time.sleep(0.02)
        if self.listener is not None:
            self.listener.close()
        try:
            ours = self.socket_inode is None or (self.folder / AGENT_SOCKET).stat().st_ino == self.socket_inode
        except OSError:
            ours = True
        if not ours:
            return  # a newer agent of this host took the folder over (this one was frozen meanwhile): its, now
        shutil.rmtree(self.folder, ignore_errors=True)
        parent = self.folder.parent
        with contextlib.suppress(OSError):
            parent.rmdir()  # the job's folder, once no host of this machine uses it


def run_rank(forked: Forked, *, cold: bool = False) -> int:
    """In a forked rank: take the stub's stdio and PMI socket and environment, run the program
    (in this warm interpreter, or with ``exec`` when ``cold`` or not a Python program)."""
    for number, fd in zip((0, 1, 2), forked.fds[:3], strict=False):
        os.dup2(fd, number)
        if fd > 2:
            os.close(fd)
    env = dict(forked.env)
    if len(forked.fds) > 3:
        env["PMI_FD"] = str(forked.fds[3])  # the same socket, at whatever number it arrived
        os.set_inheritable(forked.fds[3], True)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(forked.cwd)
    allow_mpi()
    target = None if cold else python_target(forked.argv)
    if target is None:
        try:
            os.execvpe(forked.argv[0], forked.argv, env)
        except OSError as exc:
            print(f"ddl agent: cannot run {forked.argv[0]}: {exc}", file=sys.stderr, flush=True)
            return 127
    return run_target(target)


def _exit_on_term(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through Agent.end: the ranks go with the agent


def main(argv: list[str] | None = None) -> Any:
    """``python -m ddl.launcher.elastic.agent --connect HOST:PORT --job ID --root DIR --host NAME --timeout S -- COMMAND``."""
    parser = argparse.ArgumentParser(prog="python -m ddl.launcher.elastic.agent", description=__doc__.splitlines()[0])
    parser.add_argument("--connect", required=True, metavar="HOST:PORT")
    parser.add_argument("--job", required=True)
    parser.add_argument("--root", required=True)
    parser.add_argument("--host", required=True, help="this host's name in ddlrun's host list")
    parser.add_argument("--timeout", type=float, required=True, help="ddlrun's --elastic-timeout")
    parser.add_argument("--cold", action="store_true", help="no preloading: every rank starts with exec")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    address, _, port = args.connect.rpartition(":")
    signal.signal(signal.SIGTERM, _exit_on_term)
    agent = Agent(address=(address, int(port)), job=args.job, root=args.root, host=args.host,
                  timing=Timing(elastic_timeout=args.timeout), command=command, cold=args.cold)
    try:
        agent.warm_up()
        forked = agent.serve()
    except BaseException:
        agent.end()
        raise
    if forked is None:
        return 0
    return run_rank(forked, cold=args.cold)


if __name__ == "__main__":
    raise SystemExit(main())
