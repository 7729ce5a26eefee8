"""Runtime configuration: the frozen :class:`Config`, read from ``DDL_*`` environment variables.

This is the only module that reads ``os.environ``. :class:`Config`'s fields are the
settings table (:mod:`ddl.base.settings`): each declares its variable, default, parser,
``ddlrun`` flag and whether ranks must agree on it. What Slurm and MPI launchers tell a
process about its job (``SLURM_*``, ``PMI_*``) is read here too, by :func:`job_from_env`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from ddl.base.settings import (
    Setting,
    boolean,
    on_off_or_path,
    one_of,
    positive,
    setting,
    table,
    text,
    whole,
)

DEFAULT_SEGMENT_BYTES = 1 << 20
DEFAULT_FUSION_BYTES = 64 << 20
DEFAULT_SHM_BYTES = 8 << 20


@dataclasses.dataclass(frozen=True)
class Config:
    """Settings fixed at ``ddl.init()``; each field is a row of the settings table."""

    topology: str | None = setting(
        "DDL_TOPOLOGY", None, text, "multi-ring dims, innermost first, e.g. 4x16 (4 ranks per host x 16 hosts); "
        "unset: discovered from the hosts", flag="--topology", agreed=True, metavar="DIMS")
    algorithm: str = setting(
        "DDL_ALGORITHM", "auto", text, "default allreduce algorithm: {algorithms}", flag="--algorithm",
        agreed=True, metavar="NAME")
    segment_bytes: int = setting(
        "DDL_SEGMENT_BYTES", DEFAULT_SEGMENT_BYTES, whole(1, DEFAULT_SEGMENT_BYTES),
        "largest single message of a scheduled algorithm (bounds each rank's scratch buffer)",
        flag="--segment-bytes", agreed=True, metavar="BYTES", unit="bytes")
    fusion_threshold: int = setting(
        "DDL_FUSION_THRESHOLD", DEFAULT_FUSION_BYTES, whole(0, DEFAULT_FUSION_BYTES),
        "largest fused allreduce buffer (0: no fusion)", flag="--fusion-threshold", agreed=True,
        metavar="BYTES", unit="bytes")
    shm_bytes: int = setting(
        "DDL_SHM_BYTES", DEFAULT_SHM_BYTES, whole(4096, DEFAULT_SHM_BYTES),
        "largest shared-memory slot per rank for the shm algorithm; longer buffers go through it in pieces",
        flag="--shm-bytes", agreed=True, metavar="BYTES", unit="bytes")
    calibration: str | None = setting(
        "DDL_CALIBRATION", None, on_off_or_path,
        "cost model behind auto: measured at init (unset or 'on'), 'off' for fixed constants, or a file "
        "to reuse (written when missing or stale)", flag="--calibration", agreed=True,
        agree_as=lambda v: "off" if v == "off" else "on", metavar="FILE|on|off")
    auto_trials: str = setting(
        "DDL_AUTO_TRIALS", "on", one_of("on", "off"),
        "re-check auto's algorithm per message size from timed runs during training (the model's pick and every "
        "algorithm priced within 4x of it, three runs each, agreed by every rank); 'off': keep the choice priced at init (off too "
        "where DDL_CALIBRATION=off)", flag="--auto-trials", agreed=True, metavar="on|off")
    shared_negotiation: str = setting(
        "DDL_SHARED_NEGOTIATION", "on", one_of("on", "off"),
        "where every rank is on one host (3 ranks or more, outside elastic worlds), exchange the engine's negotiation records "
        "through shared memory rather than MPI's allgather (one store and one read of the others' records a "
        "cycle, and 4 KiB calls ride in them up to 64 ranks); 'off': MPI's allgather",
        flag="--shared-negotiation", agreed=True, metavar="on|off")
    stall_timeout: float = setting(
        "DDL_STALL_TIMEOUT", 60.0, positive(60.0),
        "seconds a tensor may be missing on some ranks, or a wait for the others may last (a frozen rank), "
        "before the job aborts (a warning at half of it for a missing tensor)",
        flag="--stall-timeout", metavar="SECONDS", unit="seconds")
    cycle_time: float = setting(
        "DDL_CYCLE_TIME_MS", 0.002, positive(2.0, 1e-3),
        "milliseconds the engine waits to batch submissions before a cycle", flag="--cycle-time-ms",
        metavar="MS", unit="ms")
    join_average: str = setting(
        "DDL_JOIN_AVERAGE", "size", one_of("size", "contributors"),
        "what an Average divides by while some ranks have called join(): 'size' (every rank of the set, "
        "Horovod's rule) or 'contributors' (the ranks that have not joined: equal to one process over the "
        "same batches)", flag="--join-average", agreed=True, metavar="size|contributors")
    timeline: str | None = setting(
        "DDL_TIMELINE", None, text, "write a Chrome-trace JSON of every collective (rank 0)",
        flag="--timeline", metavar="FILE")
    verbose: bool = setting(
        "DDL_VERBOSE", False, boolean, "print the topology, algorithms and cost model on rank 0",
        flag="--verbose", metavar="", unit="bool")
    init_timeout: float = setting(
        "DDL_INIT_TIMEOUT", 300.0, positive(300.0),
        "seconds ddl.init waits for every rank to start MPI before it ends this rank with a message (a rank "
        "that failed before its ddl.init would otherwise leave the others waiting forever; under ddlrun its "
        "exit ends the job at once)", flag="--init-timeout", metavar="SECONDS", unit="seconds")
    malloc: str = setting(
        "DDL_MALLOC", "keep", one_of("keep", "system"),
        "'keep': ddl.init raises glibc's trim and mmap thresholds, so the large blocks a training step frees "
        "stay in the process instead of being unmapped and faulted in again next step (skipped where "
        "MALLOC_*_ or GLIBC_TUNABLES malloc settings or a preloaded allocator say otherwise); 'system': "
        "leave the C library's policy alone", metavar="keep|system")
    abort_on_exception: bool = setting(
        "DDL_ABORT_ON_EXCEPTION", True, boolean,
        "an uncaught exception on one rank aborts the whole job (so no rank waits forever)", unit="bool")
    hostname: str | None = setting(
        "DDL_HOSTNAME", None, text, "the host name that groups ranks into hosts (containers that share one, tests)")
    allow_singletons: bool = setting(
        "DDL_ALLOW_SINGLETONS", False, boolean,
        "let a Slurm step of several tasks run as independent one-rank worlds (srun --mpi=none sweeps)",
        unit="bool")
    monitor: str | None = setting(
        "DDL_MONITOR", None, text,
        "set by ddlrun: HOST:PORT/TOKEN where each rank's keeper reports the rank's output, its progress "
        "through init and shutdown, and how it ended", metavar="ADDRESS")
    notes_fd: str | None = setting(
        "DDL_NOTES_FD", None, text,
        "set by ddlrun's rank keeper: FD:PID, the file descriptor on which ddl tells the keeper (process PID, "
        "the rank's parent) how far the rank got (init, shutdown) and why it is leaving; ignored in any other "
        "process (the rank's own children)", metavar="FD:PID")
    elastic_world: int = setting(
        "DDL_ELASTIC_WORLD", 0, whole(0, 1),
        "set by ddlrun --elastic: this world's number (1 for the first, one more after each change of "
        "hosts); 0 outside an elastic job", metavar="N")
    elastic_store: str | None = setting(
        "DDL_ELASTIC_STORE", None, text,
        "set by ddlrun --elastic: this host's folder (on tmpfs) for the committed elastic state and the "
        "agent's socket; unset: elastic state lives in memory only", metavar="DIR")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Config:
        """Read the configuration from ``env`` (default: the process environment).

        Raises:
            SettingError: a variable holds a value of the wrong form; the message names it.
        """
        env = os.environ if env is None else env
        return cls(**{s.field: s.read(env) for s in SETTINGS})

    def sequence_settings(self, *, topology: str | None, version: str) -> dict[str, str]:
        """The settings that change which MPI calls a rank makes, and in what order.

        Ranks must agree on every one of them (``init`` compares them): a rank that
        fuses differently, cuts other segments, calibrates when another does not, or
        runs another ddl version would wait forever in a call the others never make.
        ``topology`` is the spec ``init`` uses (its argument wins over the variable).
        """
        out = {"ddl version": version}
        for s in SETTINGS:
            if s.agreed:
                value = topology if s.field == "topology" else getattr(self, s.field)
                out[s.env] = s.agreed_text(value)
        return out


#: The settings table, in declaration order.
SETTINGS: tuple[Setting, ...] = table(Config)
#: Rows by :class:`Config` field name.
BY_FIELD: dict[str, Setting] = {s.field: s for s in SETTINGS}


def settings_differences(per_rank: list[dict[str, str]]) -> list[str]:
    """'DDL_FUSION_THRESHOLD: rank 0: 67108864; rank 1: 0' for each differing setting."""
    out = []
    for key in per_rank[0]:
        groups: dict[str, list[int]] = {}
        for rank, settings in enumerate(per_rank):
            groups.setdefault(settings.get(key, "(missing)"), []).append(rank)
        if len(groups) > 1:
            parts = [f"rank{'s' if len(r) > 1 else ''} {','.join(map(str, r[:8]))}{'...' if len(r) > 8 else ''}: {v}"
                     for v, r in groups.items()]
            out.append(f"{key}: " + "; ".join(parts))
    return out


#: glibc's own variables for the thresholds ddl.base.allocator sets.
MALLOC_VARIABLES: tuple[str, ...] = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_",
                                     "MALLOC_MMAP_MAX_")
#: Allocators a user may preload in place of glibc's (PyTorch's CPU tuning guide names the first two).
PRELOADED_ALLOCATORS: tuple[str, ...] = ("jemalloc", "tcmalloc", "mimalloc")


def allocator_choice(env: Mapping[str, str] | None = None) -> str | None:
    """The allocator policy the user already chose, as text naming where (None: none chosen):
    glibc's malloc variables, ``GLIBC_TUNABLES`` with malloc settings, or an allocator in
    ``LD_PRELOAD``. ``ddl.init()`` then leaves the allocator as it is."""
    env = os.environ if env is None else env
    for name in MALLOC_VARIABLES:
        if env.get(name, "").strip():
            return f"{name}={env[name].strip()}"
    tunables = env.get("GLIBC_TUNABLES", "")
    if "glibc.malloc." in tunables:
        return f"GLIBC_TUNABLES={tunables}"
    preload = env.get("LD_PRELOAD", "")
    if any(lib in preload for lib in PRELOADED_ALLOCATORS):
        return f"LD_PRELOAD={preload}"
    return None


#: Variables an MPI launcher sets in each rank it starts (hydra and Slurm's PMI-1/2,
#: Open MPI, PMIx): their presence means the process was started as an MPI rank.
MPI_RANK_VARIABLES: tuple[str, ...] = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK")

#: The world size a launcher announces to each process it starts, innermost launcher
#: first (an ``mpiexec`` inside an ``srun`` step overrides the step's PMI variables, not
#: its SLURM_* ones): (variable, who sets it).
ANNOUNCED_SIZE_VARIABLES: tuple[tuple[str, str], ...] = (
    ("PMI_SIZE", "the PMI launcher (MPICH's or Intel MPI's mpiexec/hydra, ddlrun, or srun --mpi=pmi2)"),
    ("OMPI_COMM_WORLD_SIZE", "Open MPI's mpirun/mpiexec (or prterun)"),
)


#: Variables that name a hostfile for an MPI launcher, as Kubeflow's MPI Operator sets them
#: in an MPIJob's launcher (MPICH's hydra, Open MPI 4's ORTE, Intel MPI), then PRRTE's (Open MPI 5).
HOSTFILE_VARIABLES: tuple[str, ...] = ("HYDRA_HOST_FILE", "OMPI_MCA_orte_default_hostfile",
                                       "I_MPI_HYDRA_HOST_FILE", "PRTE_MCA_prte_default_hostfile")
#: The variables Kubeflow Trainer's torch runtime sets in every pod of a TrainJob (torchrun's).
PET_VARIABLES: tuple[str, ...] = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR",
                                  "PET_MASTER_PORT")


@dataclasses.dataclass(frozen=True)
class Announced:
    """What the launcher that started this process said the world is.

    Attributes:
        size: the number of processes it started in this world (None: it did not say).
        rank: this process's index among them (None: it did not say).
        source: the variables read, as ``NAME=value`` text, and who sets them.
    """

    size: int | None
    rank: int | None
    source: str


@dataclasses.dataclass(frozen=True)
class JobEnv:
    """What the scheduler and the MPI launcher tell this process about its job.

    Attributes:
        slurm_job_id: ``SLURM_JOB_ID``; None outside a Slurm allocation.
        slurm_nodelist: ``SLURM_JOB_NODELIST`` in Slurm's compressed form (``h[1-2]``).
        slurm_tasks_per_node: ``SLURM_TASKS_PER_NODE`` (``2(x2)``), or None when the
            allocation was made without a task count.
        slurm_ntasks: ``SLURM_NTASKS`` (the job's, or inside ``srun`` the step's).
        slurm_step_tasks: ``SLURM_STEP_NUM_TASKS``, set only in tasks ``srun`` started.
        slurm_procid: ``SLURM_PROCID`` (this task's index in its step).
        mpi_launched: one of :data:`MPI_RANK_VARIABLES` is set.
        announced: the world the launcher announced (see :func:`announced_world`), or
            None for a process no launcher started (``python train.py``).
        mpijob_role: ``K_MPI_JOB_ROLE`` (``launcher`` or ``worker``), set by Kubeflow's MPI
            Operator in an MPIJob's pods; None elsewhere.
        hostfiles: the hostfile variables that are set, as (name, path) in
            :data:`HOSTFILE_VARIABLES`' order (the MPI Operator sets one per MPI).
        pet: Kubeflow Trainer's torch variables that are set (``PET_NNODES``, ...), as
            (name, value) in :data:`PET_VARIABLES`' order, unparsed.
    """

    slurm_job_id: str | None = None
    slurm_nodelist: str | None = None
    slurm_tasks_per_node: str | None = None
    slurm_ntasks: int | None = None
    slurm_step_tasks: int | None = None
    slurm_procid: int | None = None
    mpi_launched: bool = False
    announced: Announced | None = None
    mpijob_role: str | None = None
    hostfiles: tuple[tuple[str, str], ...] = ()
    pet: tuple[tuple[str, str], ...] = ()

    @property
    def in_slurm(self) -> bool:
        return self.slurm_job_id is not None


def job_from_env(env: Mapping[str, str] | None = None) -> JobEnv:
    """Read :class:`JobEnv` from ``env`` (default: the process environment).

    Malformed counts read as unknown (None): they come from the scheduler, not the user,
    and the checks that use them only refuse on a clear signal.

    Example:
        >>> job_from_env({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4"}).slurm_ntasks
        4
    """
    env = os.environ if env is None else env
    return JobEnv(
        slurm_job_id=_str(env, "SLURM_JOB_ID") or _str(env, "SLURM_JOBID"),
        slurm_nodelist=_str(env, "SLURM_JOB_NODELIST") or _str(env, "SLURM_NODELIST"),
        slurm_tasks_per_node=_str(env, "SLURM_TASKS_PER_NODE"),
        slurm_ntasks=_count(env, "SLURM_NTASKS") or _count(env, "SLURM_NPROCS"),
        slurm_step_tasks=_count(env, "SLURM_STEP_NUM_TASKS"),
        slurm_procid=_count(env, "SLURM_PROCID", minimum=0),
        mpi_launched=any(_str(env, name) is not None for name in MPI_RANK_VARIABLES),
        announced=announced_world(env),
        mpijob_role=_str(env, "K_MPI_JOB_ROLE"),
        hostfiles=_set_pairs(env, HOSTFILE_VARIABLES),
        pet=_set_pairs(env, PET_VARIABLES),
    )


def announced_world(env: Mapping[str, str]) -> Announced | None:
    """The world size (and rank) the launcher of this process announced, or None.

    Read from the innermost launcher's variables: hydra/PMI (``PMI_SIZE``, ``PMI_RANK``),
    Open MPI (``OMPI_COMM_WORLD_SIZE``, ``OMPI_COMM_WORLD_RANK``), a Slurm step's task
    (``SLURM_STEP_NUM_TASKS``, ``SLURM_PROCID``: set only in tasks ``srun`` started, not
    in a batch script's own process), and PMIx's ``PMIX_RANK`` (a rank, no size).

    Example:
        >>> announced_world({"PMI_SIZE": "2", "PMI_RANK": "1"}).size
        2
        >>> announced_world({"HOME": "/root"}) is None
        True
    """
    rank_names = {"PMI_SIZE": "PMI_RANK", "OMPI_COMM_WORLD_SIZE": "OMPI_COMM_WORLD_RANK"}
    for name, who in ANNOUNCED_SIZE_VARIABLES:
        size = _count(env, name)
        if size is not None:
            rank = _count(env, rank_names[name], minimum=0)
            return Announced(size, rank, f"{name}={size}, set by {who}")
    pmix_rank = _count(env, "PMIX_RANK", minimum=0)
    step_tasks, procid = _count(env, "SLURM_STEP_NUM_TASKS"), _count(env, "SLURM_PROCID", minimum=0)
    if step_tasks is not None and procid is not None:
        return Announced(step_tasks, procid if pmix_rank is None else pmix_rank,
                         f"SLURM_STEP_NUM_TASKS={step_tasks}, set by srun")
    if pmix_rank is not None:
        return Announced(None, pmix_rank, f"PMIX_RANK={pmix_rank}, set by a PMIx launcher")
    return None


#: Prefixes of the variables that steer how MPI moves data (shown by ``ddl doctor``).
TRANSPORT_PREFIXES: tuple[str, ...] = ("UCX_", "FI_", "OMPI_MCA_", "MPIR_CVAR_", "MPICH_", "I_MPI_")


def transport_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The set variables that choose MPI's transports (``UCX_TLS``, ``FI_PROVIDER``, ...), sorted.

    Example:
        >>> transport_env({"UCX_TLS": "tcp", "HOME": "/root"})
        {'UCX_TLS': 'tcp'}
    """
    env = os.environ if env is None else env
    return {name: env[name] for name in sorted(env) if name.startswith(TRANSPORT_PREFIXES)}


def notes_fd(env: Mapping[str, str] | None = None, *, parent: int | None = None) -> int:
    """The descriptor of ``DDL_NOTES_FD`` when this process is the rank its keeper started (the
    keeper is its parent), else 0; read without the other settings, so a rank whose other
    ``DDL_*`` values are wrong still reports how it ended.

    Example:
        >>> notes_fd({"DDL_NOTES_FD": "7:4242"}, parent=4242), notes_fd({"DDL_NOTES_FD": "7:4242"}, parent=1)
        (7, 0)
    """
    raw = BY_FIELD["notes_fd"].read(os.environ if env is None else env) or ""
    fd, _, pid = raw.partition(":")
    if not (fd.isdigit() and pid.isdigit()):
        return 0
    return int(fd) if int(pid) == (os.getppid() if parent is None else parent) else 0


def environment() -> dict[str, str]:
    """A copy of this process's whole environment (what a process hands on to one it starts for it)."""
    return dict(os.environ)


def search_path(env: Mapping[str, str] | None = None) -> list[str]:
    """The folders of ``PATH``, where the launcher looks for mpiexec last."""
    env = os.environ if env is None else env
    return [entry for entry in env.get("PATH", "").split(os.pathsep) if entry]


def _str(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name, "").strip()
    return value or None


def _set_pairs(env: Mapping[str, str], names: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    return tuple((name, value) for name in names if (value := _str(env, name)) is not None)


def _count(env: Mapping[str, str], name: str, *, minimum: int = 1) -> int | None:
    raw = env.get(name, "").strip()
    return int(raw) if raw.isdigit() and int(raw) >= minimum else None
