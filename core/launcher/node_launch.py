"""One MPI world from ddlrun on every node, without ssh: the loops around :mod:`ddl.launcher.node_protocol`.

Kubeflow Trainer's TrainJob (torch runtime on a JobSet) starts the same container on every
node and gives it no ssh; torchrun's answer is a rendezvous. ddlrun's: node 0 collects the
other nodes on the master port, starts MPICH's ``mpiexec -launcher manual -genvnone`` over
their host names, and hands each node the ``hydra_pmi_proxy`` command hydra printed for it;
each node runs its proxy itself, which connects back to mpiexec, so MPICH's own process
management (PMI, the output, the cleanup when a rank fails) runs unchanged. ``-genvnone``:
each node's ranks keep their own pod's environment (its ``HOSTNAME``, devices, ``PET_NODE_RANK``),
plus the ``DDL_*`` settings node 0 passes to all.

Every loop here is thin: what to do with a message is :mod:`ddl.launcher.node_protocol`'s.
"""

from __future__ import annotations

import contextlib
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from types import FrameType
from typing import IO, Any

from ddl.launcher.command import Launch, LaunchError
from ddl.launcher.kubernetes import NodePlace
from ddl.launcher.node_protocol import (
    LAUNCH_END,
    Assign,
    Done,
    Hello,
    NodeProtocolError,
    Refuse,
    Roster,
    admit,
    decode,
    encode,
    hosts_argument,
    parse_launch_lines,
    reachable_proxy,
    waiting_line,
)
from ddl.launcher.readiness import REPORT_EVERY_S

#: How long node 0 waits for mpiexec to print its proxy commands.
LAUNCH_LINES_TIMEOUT_S = 60.0
#: How long a node whose proxy ended waits for the job's status from node 0.
DONE_GRACE_S = 60.0
LOST_NODE_STATUS = 1


class NodeLaunchError(RuntimeError):
    """The nodes could not form a world; the message says which node and why."""


Report = Callable[[str], None]


def manual_argv(argv: list[str]) -> list[str]:
    """hydra's ``mpiexec`` line with the manual launcher and each node's own environment.

    Example:
        >>> manual_argv(["/v/bin/mpiexec", "-n", "2", "-hosts", "a:1,b:1", "python", "t.py"])
        ['/v/bin/mpiexec', '-launcher', 'manual', '-genvnone', '-n', '2', '-hosts', 'a:1,b:1', 'python', 't.py']
    """
    return [argv[0], "-launcher", "manual", "-genvnone", *argv[1:]]


# -- node 0 ------------------------------------------------------------------------------------

def run_master(place: NodePlace, make_launch: Callable[[list[tuple[str, int]]], Launch], *, timeout: float,
               report: Report, proxy_env: Mapping[str, str], hostname: str | None = None) -> int:
    """Collect the nodes, start the world over them, run proxy 0; returns the job's exit status.

    Args:
        place: this node's place (node rank 0).
        make_launch: the mpiexec launch for the joined hosts ((name, ranks) in node order).
        timeout: seconds to wait for every node to join.
        report: prints a line of ddlrun's log.
        proxy_env: the environment of this node's own proxy, which its ranks inherit.

    Raises:
        NodeLaunchError: nodes missing at the timeout, the port is taken, or mpiexec printed
            no proxy commands.
    """
    me = Hello(0, place.nnodes, place.nproc_per_node, hostname or socket.gethostname())
    roster = Roster(place.nnodes, place.nproc_per_node, {0: me})
    try:
        server = socket.create_server(("", place.master_port), family=socket.AF_INET)
    except OSError as exc:
        raise NodeLaunchError(f"node 0 cannot listen on port {place.master_port} ({exc}); give a free "
                              "--master-port (PET_MASTER_PORT) on every node") from None
    connections: dict[int, socket.socket] = {}
    try:
        report(f"node 0 of {place.nnodes} ({me.hostname}): listening on port {place.master_port} "
               f"for {place.nnodes - 1} node(s) ({place.source})")
        roster = _collect(server, roster, connections, timeout=timeout, report=report)
        server.close()
        launch = make_launch(hosts_argument(roster))
        return _run_world(place, launch, connections, report=report, proxy_env=proxy_env)
    finally:
        server.close()
        for conn in connections.values():
            with contextlib.suppress(OSError):
                conn.close()


def _collect(server: socket.socket, roster: Roster, connections: dict[int, socket.socket], *, timeout: float,
             report: Report) -> Roster:
    start = last = time.monotonic()
    last_line = ""
    server.settimeout(1.0)
    while not roster.complete:
        elapsed = time.monotonic() - start
        if elapsed >= timeout:
            raise NodeLaunchError(f"gave up after {elapsed:.0f} s (--wait-for-workers {timeout:g}): node(s) "
                                  f"{', '.join(map(str, roster.missing))} of {roster.nnodes} never joined; check that "
                                  "their pods run ddlrun with the same master address and port")
        line = waiting_line(roster, elapsed=elapsed, timeout=timeout)
        if line.split(" (")[0] != last_line.split(" (")[0] or time.monotonic() - last >= REPORT_EVERY_S:
            report(line)
            last_line, last = line, time.monotonic()
        try:
            conn, peer = server.accept()
        except TimeoutError:
            continue
        _drop_closed(connections)
        try:
            conn.settimeout(10.0)
            hello = decode(_read_line(conn))
            if not isinstance(hello, Hello):
                raise NodeProtocolError(f"expected a hello, got {hello.kind!r}")
        except (OSError, NodeProtocolError) as exc:
            report(f"ignoring a connection from {peer[0]}: {exc}")
            conn.close()
            continue
        roster, refusal = admit(roster, hello, connected=connections)
        if refusal is not None:
            report(f"refused: {refusal.reason}")
            with contextlib.suppress(OSError):
                conn.sendall(encode(refusal))
            conn.close()
            continue
        if hello.node_rank in connections:
            connections.pop(hello.node_rank).close()
        conn.settimeout(None)
        connections[hello.node_rank] = conn
        report(f"node {hello.node_rank} joined from {hello.hostname} ({peer[0]})")
    return roster


def _run_world(place: NodePlace, launch: Launch, connections: dict[int, socket.socket], *, report: Report,
               proxy_env: Mapping[str, str]) -> int:
    argv = manual_argv(launch.argv)
    report(f"all {place.nnodes} nodes joined; starting {len(argv) and argv[0]} with the manual launcher")
    mpiexec = subprocess.Popen(argv, env=launch.env, stdout=subprocess.PIPE)
    assert mpiexec.stdout is not None
    with _forwarding_signals(mpiexec):
        try:
            lines = _launch_lines(mpiexec.stdout, mpiexec)
            proxies = parse_launch_lines(lines)
            missing = [rank for rank in range(place.nnodes) if rank not in proxies]
            if missing:
                raise NodeProtocolError(f"mpiexec printed no proxy command for node(s) {missing}: {lines}")
        except (NodeProtocolError, NodeLaunchError) as exc:
            _end(mpiexec)
            _tell_all(connections, Done(LOST_NODE_STATUS))
            raise NodeLaunchError(f"mpiexec -launcher manual did not start the world: {exc}") from None
        for rank, conn in connections.items():
            with contextlib.suppress(OSError):
                conn.sendall(encode(Assign(tuple(reachable_proxy(proxies[rank], place.master_addr)))))
        own = subprocess.Popen(proxies[0], env=dict(proxy_env))
        pump = threading.Thread(target=_copy, args=(mpiexec.stdout, sys.stdout.buffer), daemon=True)
        pump.start()
        lost = _watch_nodes(mpiexec, connections)
        if lost is not None:
            report(f"node {lost} went away (its pod ended or lost the network): ending the job")
            _end(mpiexec)
        code = mpiexec.wait()
        pump.join(timeout=5)
        _end(own, grace=10.0)
    status = LOST_NODE_STATUS if lost is not None else (128 - code if code < 0 else code)
    _tell_all(connections, Done(status))
    report(f"the job ended with status {status}")
    return status


def _launch_lines(stream: IO[bytes], mpiexec: subprocess.Popen[bytes]) -> list[str]:
    """mpiexec's lines up to ``HYDRA_LAUNCH_END`` (nothing else comes before it)."""
    lines: list[str] = []
    timer = threading.Timer(LAUNCH_LINES_TIMEOUT_S, mpiexec.kill)
    timer.start()
    try:
        for raw in stream:
            line = raw.decode(errors="replace").rstrip("\n")
            if line.strip() == LAUNCH_END:
                return lines
            lines.append(line)
    finally:
        timer.cancel()
    raise NodeLaunchError(f"mpiexec ended (status {mpiexec.wait()}) before printing its proxy commands: {lines}")


def _watch_nodes(mpiexec: subprocess.Popen[bytes], connections: Mapping[int, socket.socket]) -> int | None:
    """Until mpiexec ends; returns the node rank whose connection closed first, if one did."""
    with selectors.DefaultSelector() as selector:
        for rank, conn in connections.items():
            selector.register(conn, selectors.EVENT_READ, rank)
        while mpiexec.poll() is None:
            for key, _ in selector.select(timeout=0.5):
                try:
                    data = connections[int(key.data)].recv(1)
                except OSError:
                    data = b""
                if not data:
                    return int(key.data)
    return None


def _tell_all(connections: Mapping[int, socket.socket], message: Done) -> None:
    for conn in connections.values():
        with contextlib.suppress(OSError):
            conn.sendall(encode(message))


def _drop_closed(connections: dict[int, socket.socket]) -> None:
    """Forget nodes whose connection closed while others joined (a pod that restarted)."""
    for rank, conn in list(connections.items()):
        try:
            conn.setblocking(False)
            gone = conn.recv(1, socket.MSG_PEEK) == b""
        except BlockingIOError:
            gone = False
        except OSError:
            gone = True
        finally:
            with contextlib.suppress(OSError):
                conn.setblocking(True)
        if gone:
            connections.pop(rank).close()


# -- nodes 1..N-1 ------------------------------------------------------------------------------

def run_node(place: NodePlace, *, env: Mapping[str, str], timeout: float, report: Report,
             hostname: str | None = None) -> int:
    """Join node 0, run the proxy it assigns, return the job's status as node 0 reports it.

    Raises:
        NodeLaunchError: node 0 unreachable until the timeout, or it refused this node.
    """
    me = Hello(place.node_rank, place.nnodes, place.nproc_per_node, hostname or socket.gethostname())
    conn = _connect(place, timeout=timeout, report=report)
    with conn:
        conn.sendall(encode(me))
        report(f"node {place.node_rank} of {place.nnodes} ({me.hostname}): joined {place.master_addr}:"
               f"{place.master_port}; waiting for the other nodes")
        conn.settimeout(None)
        reader = conn.makefile("rb")
        try:
            answer = decode(reader.readline())
        except NodeProtocolError as exc:
            raise NodeLaunchError(f"node 0 ended or answered wrongly before starting the world ({exc})") from None
        if isinstance(answer, Refuse):
            raise NodeLaunchError(f"node 0 refused this node: {answer.reason}")
        if isinstance(answer, Done):
            report(f"node 0 ended the job before starting it (status {answer.status})")
            return answer.status if answer.status else LOST_NODE_STATUS
        if not isinstance(answer, Assign) or not answer.proxy:
            raise NodeLaunchError(f"node 0 sent {answer!r} where a proxy command was due")
        if shutil.which(answer.proxy[0]) is None:
            raise NodeLaunchError(f"node 0 asks this node to run {answer.proxy[0]}, which is not here: run the same "
                                  "image (the same ddl install and path) on every node")
        proxy = subprocess.Popen(list(answer.proxy), env=dict(env))
        with _forwarding_signals(proxy):
            return _follow(proxy, reader, report=report)


def _connect(place: NodePlace, *, timeout: float, report: Report) -> socket.socket:
    start = last = time.monotonic()
    said = ""
    while True:
        try:
            return socket.create_connection((place.master_addr, place.master_port), timeout=5.0)
        except socket.gaierror as exc:
            why = f"does not resolve ({exc})"
        except OSError as exc:
            why = f"does not answer ({exc.strerror or exc})"
        elapsed = time.monotonic() - start
        if elapsed >= timeout:
            raise NodeLaunchError(f"gave up after {elapsed:.0f} s (--wait-for-workers {timeout:g}): node 0 at "
                                  f"{place.master_addr}:{place.master_port} {why}; check --master-addr and "
                                  "--master-port (PET_MASTER_ADDR, PET_MASTER_PORT) and that node 0 runs ddlrun")
        line = f"node {place.node_rank} of {place.nnodes}: waiting for node 0 at {place.master_addr}:{place.master_port}"
        if why != said or time.monotonic() - last >= REPORT_EVERY_S:
            report(f"{line}, which {why} ({elapsed:.0f} s of {timeout:.0f} s)")
            said, last = why, time.monotonic()
        time.sleep(1.0)


def _follow(proxy: subprocess.Popen[bytes], reader: IO[bytes], *, report: Report) -> int:
    """Until the job's status arrives: the proxy ends when its ranks do; node 0 then says how it went."""
    outcome: dict[str, Any] = {}

    def listen() -> None:
        try:
            message = decode(reader.readline())
            outcome["status"] = message.status if isinstance(message, Done) else LOST_NODE_STATUS
        except (NodeProtocolError, OSError):
            outcome["gone"] = True

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    while proxy.poll() is None and listener.is_alive():
        listener.join(timeout=0.5)
    if "gone" in outcome:
        report("node 0 went away before the job ended: ending this node's ranks")
        _end(proxy)
        return LOST_NODE_STATUS
    listener.join(timeout=DONE_GRACE_S)
    _end(proxy, grace=10.0)
    if "gone" in outcome:
        report(f"node 0 went away as this node's ranks ended (proxy status {proxy.returncode})")
        return LOST_NODE_STATUS
    if "status" not in outcome:
        report(f"no status from node 0 within {DONE_GRACE_S:.0f} s after this node's ranks ended")
        code = proxy.returncode or LOST_NODE_STATUS
        return 128 - code if code < 0 else code
    return int(outcome["status"])


# -- small pieces --------------------------------------------------------------------------------

def _read_line(conn: socket.socket, limit: int = 1 << 16) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
        if len(data) > limit:
            raise NodeProtocolError("a line longer than 64 KiB")
    return data


def _copy(source: IO[bytes], target: IO[bytes]) -> None:
    for chunk in iter(lambda: source.read1(65536) if hasattr(source, "read1") else source.read(65536), b""):
        target.write(chunk)
        target.flush()


def _end(process: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    """Terminate ``process`` if it still runs, kill it after ``grace`` seconds."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextlib.contextmanager
def _forwarding_signals(child: subprocess.Popen[bytes]) -> Any:
    """SIGINT and SIGTERM (a pod's end) go to ``child`` while it runs."""
    def forward(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


def refuse_open_mpi(flavour: str) -> None:
    """The no-ssh world needs hydra's manual launcher.

    Raises:
        LaunchError: under Open MPI.
    """
    if flavour != "mpich":
        raise LaunchError("nodes without ssh (--nnodes, PET_NNODES) need MPICH's hydra (the pip MPICH ddl installs "
                          "by default), whose manual launcher lets each node start its own proxy; Open MPI's "
                          "PRRTE starts its daemons itself (ssh or a scheduler). Use an MPIJob for Open MPI")
