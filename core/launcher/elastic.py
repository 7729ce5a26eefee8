"""``ddlrun --elastic``: a supervisor that runs one ``mpiexec`` world per membership and carries the state across.

The MPI that pip installs (MPICH 5, ch4) cannot keep a world going once a rank is lost
(``MPIR_CVAR_ENABLE_FT=1`` fails at ``MPI_Init``; without it the survivors die at their
next call to the lost rank), so ddl recovers by *supervised relaunch*:

1. one agent per host (:mod:`ddl.launcher.agent`), started once and kept: host liveness
   (beats every 0.5 s) and warm, pre-imported interpreters that each rank is forked from;
2. one ``mpiexec`` per world, whose ranks are stubs (:mod:`ddl.launcher.stub`) handing
   over to their host's agent; ``-disable-auto-cleanup``: ddlrun, not hydra, ends worlds;
3. on a lost host (its agent's connection closes, it falls silent for ``--elastic-timeout``,
   or a rank there is killed by a signal), ddlrun stops the world's other ranks and starts
   the next world on the hosts left, if at least ``--min-np`` ranks remain; the ranks sync
   from the newest commit kept on a survivor's tmpfs (:mod:`ddl.runtime.elastic`);
4. when discovery lists new (or returning) hosts, their agents warm up first; then ddlrun
   announces the change, every rank leaves at its next commit (status 75), and the next
   world includes them, up to ``--max-np``.

A rank that exits with an error of its own (not a lost host) ends the job with its status,
as without ``--elastic``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import queue
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from types import FrameType
from typing import Any

from ddl.launcher.agents import (
    AgentHandle,
    EventServer,
    advertised_address,
    kill_process,
    start_process,
)
from ddl.launcher.command import PYTHON_NAMES, LaunchOptions, MpiInfo, build_launch
from ddl.launcher.elastic_flags import ElasticOptions
from ddl.launcher.hosts import HostSlots, format_host_list
from ddl.launcher.membership import DiscoveryError, Membership, WorldPlan, run_discovery
from ddl.runtime.elastic_wire import RESET_EXIT, Message

LOCALHOST = "localhost"
#: How long a rank's own error waits for news of a lost host before it counts as the program's.
SETTLE_SECONDS = 1.5
#: How often ddlrun tells each agent it is still there (agents leave after --elastic-timeout of silence).
PING_SECONDS = 0.5
#: How long the ranks of an ending world may take to end before their mpiexec is killed.
ENDING_SECONDS = 10.0


@dataclasses.dataclass
class World:
    """One ``mpiexec`` world and what its ranks reported."""

    number: int
    plan: WorldPlan
    process: Any
    started: float
    exits: dict[int, tuple[int, str]] = dataclasses.field(default_factory=dict)  # rank -> (code, cause)
    forked: set[int] = dataclasses.field(default_factory=set)
    synced: set[int] = dataclasses.field(default_factory=set)
    ending: str | None = None  # "lost", "reset", "error" or "done"
    ending_since: float = 0.0
    lost_hosts: set[str] = dataclasses.field(default_factory=set)
    error: tuple[int, int, float] | None = None  # rank, status, when
    announced: bool = False
    mpiexec_ended: float | None = None
    first_commit_logged: bool = False

    def running(self) -> list[int]:
        return [r for r in range(self.plan.np) if r not in self.exits]


class Supervisor:
    """Runs an elastic job to its end; :meth:`run` returns ddlrun's exit status."""

    def __init__(self, options: ElasticOptions, *, mpi: MpiInfo, base_env: Mapping[str, str],
                 python_executable: str, cpu_count: int, is_root: bool) -> None:
        self.options = options
        self.mpi, self.base_env = mpi, dict(base_env)
        self.python, self.cpu_count, self.is_root = python_executable, cpu_count, is_root
        self.job = uuid.uuid4().hex[:12]
        self.membership = Membership(max_np=options.max_np, cooldown=options.cooldown)
        self.server = EventServer()
        self.agents: dict[str, AgentHandle] = {}
        self.by_cid: dict[int, str] = {}
        self.world: World | None = None
        self.worlds = 0
        self.resets = 0
        self.result: int | None = None
        self.t0 = time.monotonic()
        self.next_discovery = 0.0
        self.next_ping = 0.0
        self.address = ""
        self.last_plan: WorldPlan | None = None
        command = list(options.command)
        if command and command[0] in PYTHON_NAMES:
            command[0] = python_executable
        self.command = command

    # -- logging ----------------------------------------------------------------------
    def log(self, message: str) -> None:
        print(f"ddlrun: elastic [{time.monotonic() - self.t0:8.3f} s] {message}", file=sys.stderr, flush=True)

    # -- the job ------------------------------------------------------------------------
    def run(self) -> int:
        """Run worlds until the program finishes, fails, or too few ranks remain."""
        if self.mpi.flavour != "mpich":
            print("ddlrun: error: --elastic drives MPICH's mpiexec (hydra); this MPI is Open MPI. Install the "
                  "pip MPICH (`pip install mpich`, then reinstall mpi4py) or run without --elastic",
                  file=sys.stderr)
            return 2
        previous = {sig: signal.signal(sig, self._interrupted) for sig in (signal.SIGINT, signal.SIGTERM)}
        source = (f"discovery script {self.options.discovery_script}" if self.options.discovery_script
                  else f"hosts {format_host_list(self.options.hosts)}" if self.options.hosts else "this host")
        self.log(f"job {self.job} started at unix time {time.time():.3f}; hosts from {source}; "
                 f"{self.options.min_np} to {self.options.max_np} ranks")
        try:
            self._discover(force=True)
            names = [h.name for h in self.membership.listed if h.name != LOCALHOST]
            self.address = advertised_address(names)
            self._ensure_agents()
            while self.result is None:
                try:
                    cid, message = self.server.events.get(timeout=0.1)
                except queue.Empty:
                    pass
                else:
                    self._event(cid, message)
                self._tick()
        finally:
            self._shutdown()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return self.result

    def _interrupted(self, signum: int, frame: FrameType | None) -> None:
        self.log(f"interrupted by signal {signum}; ending every rank and agent")
        self.result = 128 + signum

    def _tick(self) -> None:
        now = time.monotonic()
        if now >= self.next_discovery:
            self._discover()
            self._ensure_agents()
        self._check_agents(now)
        if now >= self.next_ping:
            self.next_ping = now + PING_SECONDS
            for agent in self.agents.values():
                if agent.cid is not None and agent.lost is None:
                    self.server.send(agent.cid, {"t": "ping"})
        if self.world is None:
            self._maybe_start_world(now)
        else:
            self._check_world(now)

    # -- discovery and agents -------------------------------------------------------------
    def _discover(self, *, force: bool = False) -> None:
        self.next_discovery = time.monotonic() + self.options.discovery_interval
        if self.options.discovery_script:
            try:
                hosts = run_discovery(self.options.discovery_script, default_slots=self.options.slots)
            except DiscoveryError as exc:
                if force:
                    raise
                self.log(f"{exc}; keeping the last list")
                return
        else:
            hosts = self.options.hosts or (HostSlots(LOCALHOST, self.options.max_np),)
        before = {h.name for h in self.membership.eligible()}
        back = self.membership.observe(hosts, time.monotonic())
        for host in back:
            self.log(f"host {host} may take part again (listed again by discovery, or its cooldown passed)")
        after = {h.name for h in self.membership.eligible()}
        if after - before and not force:
            self.log(f"discovery: new host(s) {', '.join(sorted(after - before))}")
        if before - after:
            self.log(f"discovery: host(s) {', '.join(sorted(before - after))} no longer listed")

    def _ensure_agents(self) -> None:
        """An agent on every eligible host (warm spares too: a join then costs no import)."""
        for host in self.membership.eligible():
            agent = self.agents.get(host.name)
            if agent is None or agent.lost is not None:
                self._start_agent(host.name)

    def _start_agent(self, host: str) -> None:
        command = (self.python, "-m", "ddl.launcher.agent", "--connect", f"{self.address}:{self.server.port}",
                   "--job", self.job, "--root", self.options.store_root, "--host", host,
                   "--timeout", f"{self.options.timeout:g}", *(["--cold"] if self.options.cold_start else []),
                   "--", *self.command)
        launch = self._launch(1, () if host == LOCALHOST else (HostSlots(host, 1),), command, {})
        self.agents[host] = AgentHandle(host=host, process=start_process(launch.argv, launch.env),
                                        started=time.monotonic())
        self.agents[host].heard()
        if self.options.verbose:
            self.log(f"agent starting on {host}")

    def _launch(self, np: int, hosts: tuple[HostSlots, ...], command: tuple[str, ...],
                env: Mapping[str, str]) -> Any:
        options = LaunchOptions(np=np, command=command, hosts=hosts, verbose=self.options.verbose,
                                **{k: v for k, v in self.options.settings.items() if k != "verbose"})
        return build_launch(options, mpi=self.mpi, cpu_count=self.cpu_count, base_env={**self.base_env, **env},
                            python_executable=self.python, is_root=self.is_root)

    def _check_agents(self, now: float) -> None:
        for agent in list(self.agents.values()):
            if agent.lost is not None:
                continue
            limit = self.options.start_timeout if agent.cid is None or not agent.warm else self.options.timeout
            if now - agent.last_heard > limit:
                what = "did not connect" if agent.cid is None else "was silent"
                self._agent_lost(agent, f"its agent {what} for {limit:g} s")
            elif agent.process.poll() is not None and agent.cid is None:
                self._agent_lost(agent, f"its agent's mpiexec ended with status {agent.process.returncode}")

    def _agent_lost(self, agent: AgentHandle, why: str) -> None:
        agent.lost = why
        if agent.cid is not None:
            self.server.drop(agent.cid)
        kill_process(agent.process)
        self.membership.fail(agent.host, time.monotonic())
        world = self.world
        if world is not None and agent.host in world.plan.names:
            self._world_failure(world, agent.host, why)
        else:
            self.log(f"host {agent.host} lost ({why}); it was not in a running world")

    # -- events ----------------------------------------------------------------------------
    def _event(self, cid: int, message: Message | None) -> None:
        host = self.by_cid.get(cid)
        if message is None:
            agent = self.agents.get(host) if host else None
            if agent is not None and agent.cid == cid and agent.lost is None:
                self._agent_lost(agent, "its agent's connection closed")
            return
        kind = message["t"]
        if kind == "hello":
            host = str(message["host"])
            agent = self.agents.get(host)
            if agent is None or agent.lost is not None:
                self.server.drop(cid)  # an agent ddlrun has given up on
                return
            agent.cid, agent.folder = cid, str(message.get("folder"))
            self.by_cid[cid] = host
        agent = self.agents.get(host) if host else None
        if agent is None or agent.cid != cid:
            return
        agent.heard()
        if kind == "warm":
            agent.warm, agent.warm_seconds = True, float(message["seconds"])
            failed = message.get("failed") or {}
            extra = f"; could not preload {', '.join(sorted(failed))}" if failed else ""
            self.log(f"agent on {agent.host} ready (preloaded in {agent.warm_seconds:.1f} s){extra}")
        elif kind in ("started", "exit", "synced", "commit", "reset", "done"):
            self._rank_event(kind, message)

    def _rank_event(self, kind: str, message: Message) -> None:
        world = self.world
        if world is None or int(message["world"]) != world.number:
            return
        rank = int(message["rank"])
        if kind == "started":
            world.forked.add(rank)
        elif kind == "synced":
            world.synced.add(rank)
            if len(world.synced) == world.plan.np:
                serial = int(message["serial"])
                self.log(f"world {world.number}: every rank synced, "
                         + (f"from commit {serial}" if serial else "nothing committed yet")
                         + f" ({time.monotonic() - world.started:.2f} s after mpiexec started)")
        elif kind == "commit" and not world.first_commit_logged and rank == 0:
            world.first_commit_logged = True
            self.log(f"world {world.number}: first commit ({int(message['serial'])})")
        elif kind == "reset" and message.get("why") == "HorovodInternalError":
            if world.ending is None:  # a collective failed there: the others cannot reach a commit
                self.log(f"world {world.number}: rank {rank} left after a failed collective (HorovodInternalError); "
                         f"stopping the other ranks, the next world resumes from commit {int(message['serial'])}")
                self._end_world(world, "reset", stop=True)
        elif kind == "reset" and rank == 0:
            self.log(f"world {world.number}: the ranks leave at commit {int(message['serial'])} for the next world")
        elif kind == "exit":
            if self.options.verbose:
                self.log(f"world {world.number}: rank {rank} ended ({message['cause']}, status {message['code']})")
            self._rank_exit(world, rank, int(message["code"]), str(message["cause"]))

    def _rank_exit(self, world: World, rank: int, code: int, cause: str) -> None:
        world.exits[rank] = (code, cause)
        host = world.plan.host_of(rank)
        if cause == "signal" and world.ending is None:
            self.membership.fail(host, time.monotonic())
            self._world_failure(world, host, f"rank {rank} was killed by signal {-code}")
        elif cause == "exit" and code == RESET_EXIT and world.ending is None:
            self._end_world(world, "reset", stop=False)
        elif cause == "exit" and code not in (0, RESET_EXIT) and world.error is None:
            world.error = (rank, code, time.monotonic())
        elif cause == "stub" and world.ending is None and world.error is None:
            # mpiexec ended this rank's stub by itself: MPI_Abort (an uncaught exception), or a
            # failure elsewhere that will show as a lost host within the settling time.
            world.error = (rank, 0, time.monotonic())

    # -- worlds ----------------------------------------------------------------------------
    def _ready(self) -> list[str]:
        return [name for name, agent in self.agents.items() if agent.usable]

    def _maybe_start_world(self, now: float) -> None:
        plan = self.membership.plan(ready=self._ready(), previous=self._previous_hosts())
        first = self.worlds == 0
        wanted = (self.options.np or min(self.options.max_np, sum(h.slots for h in self.membership.eligible()))
                  if first else self.options.min_np)
        starting = any(a.lost is None and not a.warm for a in self.agents.values())
        if plan.np >= wanted or (plan.np >= self.options.min_np and not starting):
            self._start_world(plan)
        elif first and (now - self.t0 > self.options.start_timeout
                        or not starting and not self.options.discovery_script):
            if plan.np >= self.options.min_np:
                self._start_world(plan)
            else:
                self._fail(f"only {plan} ready after {now - self.t0:.0f} s; --min-np {self.options.min_np} "
                           "needs more: check the hosts and their agents' output above")
        elif not first and not starting:
            self._fail(f"{plan} left, but --min-np is {self.options.min_np}; ending the job (no more hosts "
                       "are listed: add hosts to the discovery script, or lower --min-np)")

    def _previous_hosts(self) -> tuple[str, ...]:
        return self.last_plan.names if self.last_plan else ()

    def _start_world(self, plan: WorldPlan) -> None:
        self.worlds += 1
        env = {"DDL_ELASTIC_WORLD": str(self.worlds)}
        user_calibration = "DDL_CALIBRATION" in self.base_env or self.options.settings.get("calibration")
        first_agent = self.agents.get(plan.names[0])
        if not user_calibration and first_agent is not None and first_agent.folder:
            # Reused when the same hosts meet again: rank 0 alone reads and writes it, on its host.
            digest = hashlib.sha1(format_host_list(plan.hosts).encode()).hexdigest()[:12]
            env["DDL_CALIBRATION"] = os.path.join(first_agent.folder, f"calibration-{digest}.json")
        stub = (self.python, "-m", "ddl.launcher.stub", "--root", self.options.store_root, "--job", self.job,
                "--", *self.command)
        hosts = () if plan.names == (LOCALHOST,) else plan.hosts
        launch = self._launch(plan.np, hosts, stub, env)
        argv = [*launch.argv[:3], "-disable-auto-cleanup", *launch.argv[3:]]
        self.world = World(number=self.worlds, plan=plan, process=start_process(argv, launch.env),
                           started=time.monotonic())
        self.last_plan = plan
        self.log(f"world {self.worlds}: starting {plan}")

    def _world_failure(self, world: World, host: str, why: str) -> None:
        world.lost_hosts.add(host)
        self.log(f"world {world.number}: lost host {host} ({why}); stopping its other ranks")
        if world.ending in (None, "reset", "error"):
            self._end_world(world, "lost", stop=True)

    def _end_world(self, world: World, why: str, *, stop: bool) -> None:
        world.ending, world.ending_since = why, time.monotonic()
        if stop:
            for name in world.plan.names:
                agent = self.agents.get(name)
                if agent is not None and agent.cid is not None and agent.lost is None:
                    self.server.send(agent.cid, {"t": "stop", "world": world.number, "why": why})

    def _check_world(self, now: float) -> None:
        world = self.world
        assert world is not None
        if world.ending is None:
            if len(world.exits) == world.plan.np and all(code == 0 for code, _ in world.exits.values()):
                world.ending = "done"
            elif world.error is not None and now - world.error[2] > SETTLE_SECONDS:
                rank, code, _ = world.error
                how = (f"rank {rank} exited with status {code}" if code else
                       f"mpiexec ended rank {rank} (MPI_Abort: an uncaught exception on some rank)")
                self.log(f"world {world.number}: {how}: an error of the program, not a lost host; ending the job")
                self._end_world(world, "error", stop=True)
            elif world.process.poll() is not None and len(world.exits) < world.plan.np:
                # Ranks report their end through the agents before their stubs end; allow a moment.
                world.mpiexec_ended = world.mpiexec_ended or now
                if now - world.mpiexec_ended > 2.0:
                    self._mpiexec_ended(world, now)
            elif now - world.started > self.options.start_timeout and len(world.synced) < world.plan.np:
                self._start_timed_out(world)
            else:
                self._maybe_announce(world)
            return
        alive = [r for r in world.running() if world.plan.host_of(r) not in world.lost_hosts]
        if alive and now - world.ending_since < ENDING_SECONDS:
            if world.ending == "reset" and now - world.ending_since > 2 * self.options.timeout:
                self._end_world(world, "reset", stop=True)  # ranks that did not leave at the commit
            return
        self._close_world(world)

    def _mpiexec_ended(self, world: World, now: float) -> None:
        # mpiexec ended but some ranks never reported an end: they never reached their agent.
        missing = [r for r in world.running() if r not in world.forked]
        hosts = sorted({world.plan.host_of(r) for r in missing})
        if hosts and len(hosts) < len(world.plan.names):
            for host in hosts:
                self.membership.fail(host, now)
                self._world_failure(world, host, f"mpiexec ended (status {world.process.returncode}) before "
                                                 "its ranks started there")
        else:
            self.log(f"world {world.number}: mpiexec ended with status {world.process.returncode} before every "
                     "rank reported; ending the job")
            self._end_world(world, "error", stop=True)
            world.error = world.error or (-1, world.process.returncode or 1, now)

    def _start_timed_out(self, world: World) -> None:
        hosts = sorted({world.plan.host_of(r) for r in range(world.plan.np) if r not in world.forked})
        if hosts and len(hosts) < len(world.plan.names):
            for host in hosts:
                self.membership.fail(host, time.monotonic())
                self._world_failure(world, host, f"its ranks did not start in {self.options.start_timeout:g} s")
        else:
            self.log(f"world {world.number}: the ranks did not all sync in {self.options.start_timeout:g} s "
                     "(--start-timeout); ending the job")
            world.error = world.error or (-1, 1, time.monotonic())
            self._end_world(world, "error", stop=True)

    def _maybe_announce(self, world: World) -> None:
        if world.announced or len(world.synced) < world.plan.np:
            return
        desired = self.membership.plan(ready=self._ready(), previous=world.plan.names)
        if desired.hosts == world.plan.hosts or desired.np < self.options.min_np:
            return
        gone = [n for n in world.plan.names if n not in desired.names]
        if desired.np <= world.plan.np and not gone:
            return
        world.announced = True
        self.log(f"world {world.number}: hosts changed, next world {desired}; every rank leaves at its next commit")
        for name in world.plan.names:
            agent = self.agents.get(name)
            if agent is not None and agent.cid is not None and agent.lost is None:
                self.server.send(agent.cid, {"t": "update", "world": world.number})

    def _close_world(self, world: World) -> None:
        kill_process(world.process, wait=3.0 if world.ending == "done" else 0.0)
        self.world = None
        why = world.ending
        if why == "done":
            self.log(f"world {world.number}: every rank finished; the job is done")
            self.result = 0
            return
        if why == "error":
            code = world.error[1] if world.error else 0
            self.result = code or world.process.returncode or 1
            return
        self.resets += 1
        if self.options.reset_limit is not None and self.resets > self.options.reset_limit:
            self._fail(f"{self.resets} resets, more than --reset-limit {self.options.reset_limit}")
            return
        self.log(f"world {world.number} ended ({why}); planning the next")

    def _fail(self, message: str) -> None:
        print(f"ddlrun: error: elastic: {message}", file=sys.stderr, flush=True)
        self.result = 1

    def _shutdown(self) -> None:
        if self.world is not None:
            self._end_world(self.world, "done", stop=True)
            kill_process(self.world.process, grace=1.0)
        for agent in self.agents.values():
            if agent.cid is not None and agent.lost is None:
                self.server.send(agent.cid, {"t": "quit"})
        deadline = time.monotonic() + 5
        for agent in self.agents.values():
            left = max(0.0, deadline - time.monotonic())
            with contextlib.suppress(subprocess.TimeoutExpired):
                agent.process.wait(timeout=left)
            kill_process(agent.process)
        self.server.close()

