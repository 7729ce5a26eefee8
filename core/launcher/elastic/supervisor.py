"""``ddlrun --elastic``'s supervisor: a thin loop that feeds events to the host, world and job machines and carries out their actions.

What to do is decided by pure functions: :mod:`~ddl.launcher.elastic.host` (each host's
agent: connection, import, heartbeats), :mod:`~ddl.launcher.elastic.world` (the running
world: its ranks' reports and ends) and :mod:`~ddl.launcher.elastic.job_machine` (when to start
the next world, what a closed one means) and :mod:`~ddl.launcher.elastic.discovery` (what
a discovery run means). This loop reads one queue — the agents' messages
(:mod:`~ddl.launcher.elastic.server`) and discovery's outcomes — starts processes, kills
them, sends and logs. Nothing in it waits: discovery runs in a thread of its own, the pings
that keep the agents alive in another, killed processes are reaped on later ticks. An
unexpected exception ends the job with one line and status 1, never a traceback. See
:mod:`ddl.launcher.elastic` for how a job recovers.
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
import traceback
import uuid
from collections.abc import Mapping
from types import FrameType

from ddl.base.config import BY_FIELD
from ddl.launcher.command import PYTHON_NAMES, Launch, LaunchOptions, MpiInfo, build_launch
from ddl.launcher.elastic import discovery as discovery_machine
from ddl.launcher.elastic import host as host_machine
from ddl.launcher.elastic import job_machine
from ddl.launcher.elastic import world as world_machine
from ddl.launcher.elastic.flags import ElasticOptions
from ddl.launcher.elastic.membership import Membership, WorldPlan
from ddl.launcher.elastic.server import (
    Event,
    EventServer,
    Gone,
    kill_now,
    kill_process,
    start_process,
)
from ddl.launcher.hosts import HostSlots, format_host_list
from ddl.launcher.tcp_listener import reachable_address
from ddl.runtime.elastic.protocol import (
    AgentHello,
    AgentWarm,
    AnnounceHosts,
    Message,
    Quit,
    RankEnded,
    RankProgress,
    RankStarted,
    StopWhy,
    StopWorld,
)

LOCALHOST = "localhost"


@dataclasses.dataclass
class SupervisedAgent:
    """One host's agent process and what the host machine knows of it."""

    state: host_machine.HostState
    process: subprocess.Popen[bytes]


@dataclasses.dataclass
class RunningWorld:
    state: world_machine.WorldState
    process: subprocess.Popen[bytes]


class Supervisor:
    """Runs an elastic job to its end; :meth:`run` returns ddlrun's exit status."""

    def __init__(self, options: ElasticOptions, *, mpi: MpiInfo, base_env: Mapping[str, str],
                 python_executable: str, cpu_count: int, is_root: bool) -> None:
        self.options, self.timing = options, options.timing
        self.mpi, self.base_env = mpi, dict(base_env)
        self.python, self.cpu_count, self.is_root = python_executable, cpu_count, is_root
        self.job = uuid.uuid4().hex[:12]
        self.membership = Membership(max_np=options.max_np, cooldown=options.cooldown)
        self.server = EventServer()
        self.agents: dict[str, SupervisedAgent] = {}
        self.host_by_connection: dict[int, str] = {}
        self.world: RunningWorld | None = None
        self.worlds = 0
        self.resets = 0
        self.result: int | None = None
        self.t0 = time.monotonic()
        self.next_discovery = 0.0  # hosts given by flags: looked at again (cooldowns) at this time
        self.discovery = discovery_machine.DiscoveryState()
        self.runner: discovery_machine.DiscoveryRunner | None = None
        self.address = ""
        self.last_plan: WorldPlan | None = None
        self.dying: list[subprocess.Popen[bytes]] = []  # killed, not reaped yet
        self.done_world: subprocess.Popen[bytes] | None = None  # ended by itself: its output may still come
        self.turned = time.monotonic()  # the loop's last turn (the pinger's proof of life)
        command = list(options.command)
        if command and command[0] in PYTHON_NAMES:
            command[0] = python_executable
        self.command = command

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
                 f"{self.options.min_np} to {self.options.max_np} ranks; a heartbeat every {self.timing.beat:g} s, "
                 f"a host silent for {self.timing.lost_after:g} s is lost")
        try:
            self.server.start_pinging(self.timing.beat, while_=self._loop_turns)
            self._begin()
            while self.result is None:
                self.turned = time.monotonic()
                self._drain(wait=min(0.05, self.timing.beat / 2))
                self._tick(time.monotonic())
        except Exception as exc:  # noqa: BLE001 - one line and a status, never a traceback from ddlrun
            self._internal_error(exc)
        finally:
            try:
                self._shutdown()
            except Exception as exc:  # noqa: BLE001
                self._internal_error(exc)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        assert self.result is not None
        return self.result

    def _internal_error(self, exc: Exception) -> None:
        frame = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
        where = f" at {os.path.basename(frame.filename)}:{frame.lineno}" if frame else ""
        print(f"ddlrun: error: elastic: ddlrun failed ({type(exc).__name__}: {exc}{where}); ending the job. "
              "This is a bug of ddl: please report it with ddlrun's output (-v for more)", file=sys.stderr, flush=True)
        self.result = 1 if self.result in (None, 0) else self.result

    def _loop_turns(self) -> bool:
        return time.monotonic() - self.turned < self.timing.loop_stuck_after

    def _begin(self) -> None:
        """Hosts from the flags are known at once; a discovery script's come as its first event."""
        script = self.options.discovery_script
        if script:
            self.runner = discovery_machine.DiscoveryRunner(script, default_slots=self.options.slots,
                                                interval=self.options.discovery_interval,
                                                timeout=self.options.discovery_timeout, post=self.server.events.put)
            self.runner.start()
            return
        self._observe(self.options.hosts or (HostSlots(LOCALHOST, self.options.max_np),), first=True)

    def _interrupted(self, signum: int, frame: FrameType | None) -> None:
        self.log(f"interrupted by signal {signum}; ending every rank and agent")
        self.result = 128 + signum

    def _drain(self, *, wait: float) -> None:
        """Every event that arrived (waiting up to ``wait`` for the first): all of them are in
        before a tick judges silences, so beats that came while the loop was busy count."""
        try:
            event = self.server.events.get(timeout=wait)
        except queue.Empty:
            return
        while self.result is None:
            if isinstance(event, (discovery_machine.Discovered, discovery_machine.DiscoveryFailed)):
                self._discovery_event(event)
            else:
                self._event(event)
            try:
                event = self.server.events.get_nowait()
            except queue.Empty:
                return

    def _tick(self, now: float) -> None:
        self.dying = [p for p in self.dying if p.poll() is None]
        if not self.options.discovery_script and now >= self.next_discovery:
            self.next_discovery = now + self.options.discovery_interval
            self._observe(self.options.hosts or (HostSlots(LOCALHOST, self.options.max_np),))  # cooldowns
        for agent in list(self.agents.values()):
            code = agent.process.poll()
            if code is not None:
                self._host_event(agent, host_machine.ProcessEnded(code, now))
            self._host_event(agent, host_machine.HostTick(now))
        if self.result is not None:
            return
        if not self.discovery.known and self.options.discovery_script:
            return  # no list yet: nothing to plan
        if self.world is None:
            self._maybe_start_world(now)
        else:
            desired = self.membership.plan(ready=self._ready(), previous=self.world.state.plan.names)
            tick = world_machine.WorldTick(now, self.world.process.poll(),
                               desired if desired.np >= self.options.min_np else None)
            self._world_event(tick)

    # -- discovery and agents -------------------------------------------------------------
    def _discovery_event(self, event: discovery_machine.DiscoveryEvent) -> None:
        self.discovery, actions = discovery_machine.step(self.discovery, event, slow_after=self.timing.elastic_timeout,
                                             script=self.options.discovery_script or "")
        for action in actions:
            if isinstance(action, discovery_machine.DiscoveryNote):
                self.log(action.text)
            elif isinstance(action, discovery_machine.FailJob):
                self._finish(job_machine.Finish(1, action.message))
            else:
                self._observe(action.hosts, first=not self.address)

    def _observe(self, hosts: tuple[HostSlots, ...], *, first: bool = False) -> None:
        """Take a list of hosts (discovery's, or the flags'), log what changed, start missing agents."""
        before = {h.name for h in self.membership.eligible()}
        for host in self.membership.observe(hosts, time.monotonic()):
            self.log(f"host {host} may take part again (listed again by discovery, or its cooldown passed)")
        for host in self.membership.left:
            self.log(f"discovery no longer lists failed host {host}; it may take part again once listed again")
        after = {h.name for h in self.membership.eligible()}
        if after - before and not first:
            self.log(f"discovery: new host(s) {', '.join(sorted(after - before))}")
        if before - after:
            self.log(f"discovery: host(s) {', '.join(sorted(before - after))} no longer listed")
        if first:
            # Asked once, before any agent exists (a name lookup: nothing is waiting yet).
            self.address = reachable_address([h.name for h in self.membership.listed if h.name != LOCALHOST])
        self._ensure_agents()

    def _ensure_agents(self) -> None:
        """An agent on every eligible host (warm spares too: a join then costs no import)."""
        for host in self.membership.eligible():
            agent = self.agents.get(host.name)
            if agent is None or agent.state.phase is host_machine.HostPhase.LOST:
                self._start_agent(host.name)

    def _start_agent(self, host: str) -> None:
        command = (self.python, "-m", "ddl.launcher.elastic.agent", "--connect",
                   f"{self.address}:{self.server.port}", "--job", self.job, "--root", self.options.store_root,
                   "--host", host, "--timeout", f"{self.timing.elastic_timeout:g}",
                   *(["--cold"] if self.options.cold_start else []), "--", *self.command)
        launch = self._launch(1, () if host == LOCALHOST else (HostSlots(host, 1),), command, {})
        self.agents[host] = SupervisedAgent(host_machine.HostState(name=host, last_heard=time.monotonic()),
                                  start_process(launch.argv, launch.env))
        if self.options.verbose:
            self.log(f"agent starting on {host}")

    def _launch(self, np: int, hosts: tuple[HostSlots, ...], command: tuple[str, ...], env: Mapping[str, str],
                *, supervised: bool = False) -> Launch:
        options = LaunchOptions(np=np, command=command, hosts=hosts, verbose=self.options.verbose,
                                supervised=supervised,
                                **{k: v for k, v in self.options.settings.items() if k != "verbose"})
        return build_launch(options, mpi=self.mpi, cpu_count=self.cpu_count, base_env={**self.base_env, **env},
                            python_executable=self.python, is_root=self.is_root)

    def _ready(self) -> list[str]:
        return [name for name, agent in self.agents.items() if agent.state.ready]

    def _send(self, agent: SupervisedAgent, message: Message) -> None:
        connection = agent.state.usable_connection
        if connection is not None:
            self.server.send(connection, message)

    # -- events ----------------------------------------------------------------------------
    def _event(self, event: Event) -> None:
        what = event.what
        if isinstance(what, AgentHello):
            agent = self.agents.get(what.host)
            if agent is None:
                self.server.drop(event.connection)  # an agent of a host ddlrun no longer runs
                return
            self.host_by_connection[event.connection] = what.host
            self._host_event(agent, host_machine.Connected(event.connection, what.folder, event.at))
            return
        name = self.host_by_connection.get(event.connection)
        agent = self.agents.get(name) if name else None
        if agent is None or agent.state.connection != event.connection:
            return  # a connection ddlrun dropped, or of an agent replaced since
        if isinstance(what, Gone):
            self._host_event(agent, host_machine.Closed(event.at, what.why))
            return
        self._host_event(agent, host_machine.Heard(event.at))
        if isinstance(what, AgentWarm):
            self._host_event(agent, host_machine.Warmed(what.seconds, tuple(what.failed), event.at))
        elif isinstance(what, (RankStarted, RankEnded, RankProgress)):
            self._rank_event(what, event.at)

    def _rank_event(self, message: RankStarted | RankEnded | RankProgress, at: float) -> None:
        world = self.world
        if world is None or message.world != world.state.number:
            return  # a late word from a world already closed
        if isinstance(message, RankStarted):
            self._world_event(world_machine.WorldRankStarted(message.rank))
        elif isinstance(message, RankProgress):
            self._world_event(world_machine.WorldRankProgress(message.rank, message.step, message.serial, at, message.reason,
                                                  message.detail))
        else:
            if self.options.verbose:
                self.log(f"world {world.state.number}: rank {message.rank} ended ({message.cause.value}, "
                         f"status {message.code})")
            self._world_event(world_machine.WorldRankEnded(message.rank, message.code, message.cause, at))

    # -- carrying out the machines' actions ------------------------------------------------------
    def _host_event(self, agent: SupervisedAgent, event: host_machine.HostEvent) -> None:
        agent.state, actions = host_machine.step(agent.state, event, self.timing)
        for action in actions:
            if isinstance(action, host_machine.HostNote):
                self.log(action.text)
            elif isinstance(action, host_machine.DropConnection):
                self.server.drop(action.connection)
            else:
                self._host_lost(agent, action.why)

    def _host_lost(self, agent: SupervisedAgent, why: str) -> None:
        if agent.state.connection is not None:
            self.server.drop(agent.state.connection)
        self._kill(agent.process)
        host, now = agent.state.name, time.monotonic()
        self.membership.fail(host, now)
        if self.world is not None and host in self.world.state.plan.names:
            self._world_event(world_machine.HostLost(host, why, now))
        else:
            self.log(f"host {host} lost ({why}); it was not in a running world")

    def _world_event(self, event: world_machine.WorldEvent) -> None:
        world = self.world
        assert world is not None
        world.state, actions = world_machine.step(world.state, event, self.timing)
        for action in actions:
            if isinstance(action, world_machine.WorldNote):
                self.log(action.text)
            elif isinstance(action, world_machine.StopRanks):
                self._to_world_hosts(world, StopWorld(world=action.world, why=action.why, lost=list(action.lost)))
            elif isinstance(action, world_machine.Announce):
                self._to_world_hosts(world, AnnounceHosts(world=action.world))
            elif isinstance(action, world_machine.FailHost):
                self.membership.fail(action.host, time.monotonic())
            else:
                self._close_world(world, action)

    def _to_world_hosts(self, world: RunningWorld, message: Message) -> None:
        for name in world.state.plan.names:
            agent = self.agents.get(name)
            if agent is not None:
                self._send(agent, message)

    # -- worlds ----------------------------------------------------------------------------
    def _maybe_start_world(self, now: float) -> None:
        plan = self.membership.plan(ready=self._ready(), previous=self.last_plan.names if self.last_plan else ())
        starting = any(a.state.phase in (host_machine.HostPhase.STARTING, host_machine.HostPhase.IMPORTING)
                       for a in self.agents.values())
        decision = job_machine.start_decision(
            plan=plan, first=self.worlds == 0, np=self.options.np, max_np=self.options.max_np,
            min_np=self.options.min_np, listed_slots=sum(h.slots for h in self.membership.eligible()),
            hosts_starting=starting, elapsed=now - self.t0, start_timeout=self.timing.start_timeout,
            discovery=bool(self.options.discovery_script))
        if isinstance(decision, job_machine.StartWorld):
            self._start_world(decision.plan)
        elif isinstance(decision, job_machine.Finish):
            self._finish(decision)

    def _start_world(self, plan: WorldPlan) -> None:
        if plan.np < max(1, self.options.min_np):
            raise RuntimeError(f"asked to start a world of {plan} under --min-np {self.options.min_np}")
        self.worlds += 1
        env = {BY_FIELD["elastic_world"].env: str(self.worlds)}
        calibration = BY_FIELD["calibration"].env
        first_agent = self.agents.get(plan.names[0])
        user_calibration = calibration in self.base_env or self.options.settings.get("calibration")
        if not user_calibration and first_agent is not None and first_agent.state.folder:
            # Reused when the same hosts meet again: rank 0 alone reads and writes it, on its host.
            digest = hashlib.sha1(format_host_list(plan.hosts).encode()).hexdigest()[:12]
            env[calibration] = os.path.join(first_agent.state.folder, f"calibration-{digest}.json")
        per_rank = ",".join(plan.host_of(r) for r in range(plan.np))
        stub = (self.python, "-m", "ddl.launcher.elastic.stub", "--root", self.options.store_root, "--job", self.job,
                "--hosts", per_rank, "--", *self.command)
        hosts = () if plan.names == (LOCALHOST,) else plan.hosts
        launch = self._launch(plan.np, hosts, stub, env, supervised=True)
        state = world_machine.WorldState(number=self.worlds, plan=plan, started=time.monotonic())
        self.world = RunningWorld(state, start_process(launch.argv, launch.env))
        self.last_plan = plan
        self.log(f"world {self.worlds}: starting {plan}")

    def _close_world(self, world: RunningWorld, close: world_machine.Close) -> None:
        self.world = None
        if close.ending is world_machine.Ending.DONE:
            self.done_world = world.process  # its mpiexec may still forward output: waited for at the end
            self.log(f"world {close.world}: every rank finished; the job is done")
        else:
            self._kill(world.process)
        self.resets, finish = job_machine.after_close(close.ending, status=close.status, mpiexec_status=world.process.returncode,
                                               resets=self.resets, reset_limit=self.options.reset_limit)
        if finish is not None:
            self._finish(finish)
        else:
            self.log(f"world {close.world} ended ({close.ending.value}); planning the next")

    def _finish(self, finish: job_machine.Finish) -> None:
        if finish.message:
            print(f"ddlrun: error: elastic: {finish.message}", file=sys.stderr, flush=True)
        self.result = finish.status

    def _kill(self, process: subprocess.Popen[bytes]) -> None:
        """Kill a process group now and reap it on a later tick: the loop never waits for a kill."""
        kill_now(process)
        self.dying.append(process)

    def _shutdown(self) -> None:
        if self.runner is not None:
            self.runner.stop()
        world = self.world
        if world is not None:
            world.state, _ = world_machine.step(world.state, world_machine.Shutdown(time.monotonic()), self.timing)
            self._to_world_hosts(world, StopWorld(world=world.state.number, why=StopWhy.DONE, lost=[]))
            kill_process(world.process, grace=1.0)
        if self.done_world is not None:
            kill_process(self.done_world, wait=3.0)
        for agent in self.agents.values():
            self._send(agent, Quit())
        deadline = time.monotonic() + 5
        for agent in self.agents.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                agent.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            kill_process(agent.process)
        for process in self.dying:
            kill_process(process)
        self.server.close()
