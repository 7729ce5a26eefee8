"""Process-wide state: ``init`` builds the communicator, topology and context once; ``shutdown`` undoes it.

Without ``mpiexec`` (or without a loadable MPI) the world is one process and every
collective still works. With more than one rank, no rank is left waiting for one that
is gone: ``init`` waits a bounded time for the world to form (:mod:`ddl.runtime.rank_watch`);
a rank whose program ends tells the others as it shuts down (they raise
:class:`~ddl.base.errors.RankLeftError` at once); an uncaught exception on any rank
prints its traceback and leaves the same way, or aborts the job when the others do not
answer. Under ``ddlrun`` each step is also told to the rank's keeper (:mod:`ddl.base.notes`).
"""

from __future__ import annotations

import atexit
import dataclasses
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from ddl import __version__
from ddl.base import allocator, notes
from ddl.base.config import (
    BY_FIELD,
    Config,
    JobEnv,
    allocator_choice,
    job_from_env,
    settings_differences,
)
from ddl.base.cpus import available_cpus
from ddl.base.errors import SettingsMismatchError, WorldMismatchError
from ddl.base.topology import build_topology, host_keys
from ddl.engine import codec
from ddl.engine.collectives import Collectives
from ddl.engine.context import Context
from ddl.engine.engine import Engine
from ddl.engine.timeline import Timeline
from ddl.reduction.calibration import calibrate
from ddl.reduction.trials import Trials
from ddl.runtime import rank_watch, running
from ddl.runtime.abort_hooks import AbortHooks
from ddl.runtime.process_sets import close_all, init_sets
from ddl.runtime.running import (
    collectives,
    context,
    current_engine,
    engine,
    is_initialized,
    topology,
)
from ddl.runtime.world_check import check_world, one_host_refusal
from ddl.wire.comm import MPIComm, SelfComm, world_comm
from ddl.wire.mpi_library import describe_loaded_mpi
from ddl.wire.splits import shared_node_leader

VERSION = __version__  # one place for the version: the package

__all__ = ["collectives", "context", "current_engine", "engine", "init", "is_initialized", "shutdown", "topology"]

_lock = threading.Lock()
_hooks = AbortHooks()
#: How long a rank that raised an uncaught exception waits for the others to let it
#: leave (they notice at their next collective) before it aborts the job instead.
LEAVE_TIMEOUT = 5.0


def init(comm: Any = None, process_sets: Sequence[Any] | None = None, *, topology: str | None = None,
         algorithm: str | None = None) -> Context:
    """Start ddl (idempotent): world communicator, topology, default algorithm.

    Args:
        comm: Horovod's argument: None (or the whole world as an mpi4py communicator
            or a list of every rank); a subset of the world is not supported.
        process_sets: :class:`ddl.ProcessSet` objects to add once started.
        topology: multi-ring dims, innermost first (``"4x16"``); overrides ``DDL_TOPOLOGY``.
        algorithm: default allreduce algorithm; overrides ``DDL_ALGORITHM``.

    Raises:
        TopologyError: the topology is malformed or does not multiply to the world size.
        ValueError: unknown algorithm, or a second ``init`` asks for another topology.
        SettingsMismatchError: ranks were started with different settings that change
            the sequence of MPI calls (raised on every rank, naming them).

    Example:
        >>> import ddl
        >>> _ = ddl.init()
        >>> ddl.size() >= 1
        True
    """
    ctx = _init(topology, algorithm)
    _check_comm(comm, ctx.topology.size)
    init_sets(process_sets)
    return ctx


def _check_comm(comm: Any, size: int) -> None:
    """Horovod's ``init(comm=...)``: ddl runs on the whole world only."""
    if comm is None:
        return
    if isinstance(comm, (list, tuple)):
        if sorted(comm) == list(range(size)):
            return
    elif hasattr(comm, "Get_size") and comm.Get_size() == size:
        return
    raise NotImplementedError(f"ddl.init runs on every rank of the job; init(comm={comm!r}) on a subset is not "
                              "supported: call init() everywhere and use add_process_set(ranks) for the subset")


def _check_world(comm: Any, config: Config, job: JobEnv) -> None:
    """Refuse a world that is not the launcher's (N singletons would train N models)."""
    load_error = getattr(comm, "load_error", None)
    library = describe_loaded_mpi() if load_error is None and isinstance(comm, SelfComm) else None
    check_world(comm.size, config, job, load_error=load_error, library=library)
    if load_error is not None:  # no launcher said otherwise: a world of one is what was asked
        print(f"ddl: MPI unavailable ({load_error}); running as a single process", file=sys.stderr)


def _init(topology: str | None, algorithm: str | None) -> Context:
    with _lock:
        config = Config.from_env()
        source = "topology argument" if topology else BY_FIELD["topology"].env
        spec = topology or config.topology
        if algorithm:
            config = dataclasses.replace(config, algorithm=algorithm)
        running_ctx = running.current_context()
        if running_ctx is not None:
            _check_same(running_ctx, spec, algorithm)
            return running_ctx
        job = job_from_env()
        notes.send(notes.INIT)
        _keep_freed_memory(config)
        comm = _form_world(job, config)
        _check_world(comm, config, job)
        # One gather carries the host names, MPI's nodes and the settings every rank must share.
        mine = config.sequence_settings(topology=spec, version=VERSION)
        node = shared_node_leader(comm.mpi_comm) if isinstance(comm, MPIComm) else 0
        gathered = comm.allgather_object((config.hostname or comm.hostname(), node, mine))
        hostnames = [h for h, _, _ in gathered]
        keys = host_keys([(h, n) for h, n, _ in gathered])
        differences = settings_differences([s for _, _, s in gathered])
        if differences:
            comm.free()
            raise SettingsMismatchError(
                "ranks were started with different settings, which would make them issue different "
                "MPI calls and hang: " + " | ".join(differences)
                + ". Start every rank with the same DDL_* environment (ddlrun passes its own to all ranks)."
            )
        trap = one_host_refusal(hostnames, job) if isinstance(comm, MPIComm) else None
        if trap:  # every rank holds the same host names and variables: all refuse alike
            comm.free()
            raise WorldMismatchError(trap)
        topo = build_topology(comm.rank, keys, spec, source=source)
        if isinstance(comm, MPIComm):
            # Waits poll, then yield the core between polls (then sleep, in the negotiation).
            # Polling without yielding first pays only where each rank has a core: at 4
            # ranks on 2 cores a 4 KiB call took 48 us so, 85 us with 20 us of it (MPI 510 us).
            comm.busy_wait = 20e-6 if topo.local_size <= available_cpus() else 0.0
            comm.remote = frozenset(q for q, h in enumerate(hostnames) if h != hostnames[comm.rank])
            comm.poll_native = topo.local_size <= available_cpus()
            comm.negotiation_blocks = codec.gather_blocks(topo.size, comm.poll_native, bool(config.elastic_world))
            comm.shared_negotiation = config.shared_negotiation == "on" and codec.shared_records(
                topo.size, len({n for _, n, _ in gathered}) == 1, bool(config.elastic_world))
            if not config.elastic_world:  # (an elastic world's heartbeats find a frozen rank in seconds)
                comm.stall_limit = config.stall_timeout
        ctx = Context(comm, topo, config)
        ctx.hostnames = tuple(hostnames)
        timeline = Timeline(config.timeline, rank=comm.rank) if config.timeline and comm.rank == 0 else None
        engine = Engine(ctx, fusion_threshold=config.fusion_threshold, stall_timeout=config.stall_timeout,
                        cycle_time=config.cycle_time, timeline=timeline, start=False)
        try:
            # Probed with the engine thread alive but parked, as collectives later run (a
            # ddl process runs MPI ~20 % slower than a bare one); it starts cycling after.
            calib = calibrate(comm, topo, keys, config.calibration, segment_bytes=config.segment_bytes,
                              shm_bytes=config.shm_bytes)
        except BaseException:
            engine.discard()  # its thread never cycled: nothing to agree on, no wait
            comm.free()
            raise
        ctx.model, ctx.calibration = calib.model, calib
        if config.auto_trials == "on" and config.calibration != "off":
            ctx.trials = Trials()
        engine.start_cycles()
        running.set_running(ctx, engine, Collectives(engine))
        if comm.size > 1 and config.abort_on_exception:
            # In an elastic world an error of the program ends the job (ddlrun --elastic tells it
            # from a lost host by the rank's own end): it aborts at once, as it always did, rather
            # than leaving, which the others would take for a lost peer and recover from.
            leave = None if config.elastic_world else (lambda: _shutdown(failed=True, timeout=LEAVE_TIMEOUT))
            _hooks.install(comm, leave=leave)
        notes.send(notes.READY, f"rank {comm.rank} of {comm.size}")
        if config.verbose and comm.rank == 0:
            print(f"ddl: {comm.size} ranks on {topo.cross_size} host(s), topology {topo}, "
                  f"algorithm {config.algorithm}; {calib.describe()}; allocator: {allocator_policy}",
                  file=sys.stderr, flush=True)
        return ctx


#: What :func:`_keep_freed_memory` did in this process (``DDL_VERBOSE`` prints it); None before.
allocator_policy: str | None = None


def _keep_freed_memory(config: Config) -> None:
    """``DDL_MALLOC=keep``: keep the blocks a training step frees (:mod:`ddl.base.allocator`),
    unless the user chose an allocator policy already. Once per process."""
    global allocator_policy
    if allocator_policy is None:
        allocator_policy = allocator.policy(config.malloc, allocator_choice())


def _form_world(job: JobEnv, config: Config) -> Any:
    """``MPI_Init`` (through :func:`world_comm`), bounded by ``DDL_INIT_TIMEOUT`` where no
    keeper watches this rank and the launcher announced more than one process."""
    said = job.announced
    watch = None
    if said is not None and (said.size or 0) > 1 and not notes.active() and not _mpi_started():
        watch = rank_watch.start(timeout=config.init_timeout, rank=said.rank, size=said.size,
                                 host=config.hostname or _hostname())
    try:
        comm = world_comm(job.announced)
    except BaseException:
        if watch is not None:
            watch.close()
        raise
    if watch is not None:
        watch.started()
    return comm


def _mpi_started() -> bool:
    mpi = sys.modules.get("mpi4py.MPI")
    return bool(mpi is not None and mpi.Is_initialized())


def _hostname() -> str:
    import socket

    return socket.gethostname()


def shutdown() -> None:
    """Release ddl's communicator; ``init`` may be called again afterwards.

    From the moment it is called, the other ranks see this rank leaving: a collective
    they wait in and this rank will never join raises :class:`~ddl.base.errors.RankLeftError`
    there at once. It returns once every rank has called ``shutdown`` (a rank that is
    slow to get there, saving a checkpoint say, is waited for).
    """
    _shutdown(failed=False, timeout=None)


def _shutdown(*, failed: bool, timeout: float | None) -> bool:
    """:func:`shutdown`; ``failed``: after an uncaught exception (the others' errors say
    so); ``timeout``: give up when the others have not agreed in time (False: ddl is
    then unusable and the caller ends the process)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    if running.current_engine() is not None:
        notes.send(notes.LEAVING, "after an uncaught exception" if failed else "")
        if not close_all(failed=failed, deadline=deadline):
            return False
    with _lock:
        engine, ctx = running.current_engine(), running.current_context()
        if engine is not None:
            # Returns once every rank agreed to stop and the thread ended.
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not engine.stop(failed=failed, timeout=left):
                return False
            if engine.timeline is not None:
                engine.timeline.write()
        if ctx is not None:
            ctx.comm.free()
        _hooks.uninstall()
        running.set_running(None, None, None)
    notes.send(notes.DONE)  # after a failed init too: the keeper then knows the process ended by its own will
    return True


def _check_same(ctx: Context, spec: str | None, algorithm: str | None) -> None:
    if spec is not None:
        from ddl.base.topology import parse_spec

        if parse_spec(spec).dims != ctx.topology.dims:
            raise ValueError(
                f"ddl is already initialized with topology {ctx.topology}; call ddl.shutdown() "
                f"before init(topology={spec!r})"
            )
    if algorithm is not None and algorithm != ctx.config.algorithm:
        raise ValueError(
            f"ddl is already initialized with algorithm {ctx.config.algorithm!r}; pass "
            f"algorithm={algorithm!r} per call, or shutdown() first"
        )


atexit.register(shutdown)
