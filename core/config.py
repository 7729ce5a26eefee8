"""Runtime configuration: one frozen dataclass read from ``DDL_*`` environment variables.

This is the only module that reads ``os.environ``; the launcher maps its flags to these
variables through :data:`LAUNCHER_FLAGS`. What Slurm and MPI launchers tell a process
about its job (``SLURM_*``, ``PMI_*``) is read here too, by :func:`job_from_env`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

DEFAULT_SEGMENT_BYTES = 1 << 20
DEFAULT_FUSION_BYTES = 64 << 20
DEFAULT_SHM_BYTES = 8 << 20


@dataclasses.dataclass(frozen=True)
class Config:
    """Settings fixed at ``ddl.init()``.

    Attributes:
        topology: multi-ring dims spec (``"4x16"``) or None to discover from hosts.
        algorithm: default allreduce algorithm name (``"auto"``).
        segment_bytes: largest single message; bounds the scratch buffer per rank.
        abort_on_exception: an uncaught exception on one rank aborts the whole job.
        hostname: overrides the host name used to group ranks into hosts (tests,
            containers that share a host name).
        verbose: print the chosen topology and algorithms on rank 0.
        fusion_threshold: largest fused allreduce buffer in bytes (0: no fusion).
        stall_timeout: seconds a tensor may be missing on some ranks before the job
            aborts (a warning at half of it).
        cycle_time: seconds an idle engine waits before checking in with the others.
        timeline: path of a Chrome-trace JSON written by rank 0, or None.
        calibration: None measures the cost model behind ``auto`` at init; ``"off"``
            keeps fixed constants; a path loads a matching saved calibration, or
            measures and writes one there.
        allow_singletons: let a Slurm step of several tasks run as independent
            one-rank worlds (e.g. a sweep started with ``srun --mpi=none``).
        shm_bytes: largest shared-memory slot per rank for the ``shm`` algorithm;
            longer buffers go through it in pieces (one barrier each).
    """

    topology: str | None = None
    algorithm: str = "auto"
    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    abort_on_exception: bool = True
    hostname: str | None = None
    verbose: bool = False
    fusion_threshold: int = DEFAULT_FUSION_BYTES
    stall_timeout: float = 60.0
    cycle_time: float = 0.002
    timeline: str | None = None
    calibration: str | None = None
    allow_singletons: bool = False
    shm_bytes: int = DEFAULT_SHM_BYTES

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Config:
        """Read the configuration from ``env`` (default: the process environment).

        Raises:
            ValueError: a variable holds a value of the wrong form; the message names it.
        """
        env = os.environ if env is None else env
        return cls(
            topology=_str(env, "DDL_TOPOLOGY"),
            algorithm=_str(env, "DDL_ALGORITHM") or "auto",
            segment_bytes=_positive_int(env, "DDL_SEGMENT_BYTES", DEFAULT_SEGMENT_BYTES),
            abort_on_exception=_bool(env, "DDL_ABORT_ON_EXCEPTION", True),
            hostname=_str(env, "DDL_HOSTNAME"),
            verbose=_bool(env, "DDL_VERBOSE", False),
            fusion_threshold=_int(env, "DDL_FUSION_THRESHOLD", DEFAULT_FUSION_BYTES, minimum=0),
            stall_timeout=_float(env, "DDL_STALL_TIMEOUT", 60.0),
            cycle_time=_float(env, "DDL_CYCLE_TIME_MS", 2.0) / 1e3,
            timeline=_str(env, "DDL_TIMELINE"),
            calibration=_calibration(env, "DDL_CALIBRATION"),
            allow_singletons=_bool(env, "DDL_ALLOW_SINGLETONS", False),
            shm_bytes=_int(env, "DDL_SHM_BYTES", DEFAULT_SHM_BYTES, minimum=4096),
        )


    def sequence_settings(self, *, topology: str | None, version: str) -> dict[str, str]:
        """The settings that change which MPI calls a rank makes, and in what order.

        Ranks must agree on every one of them (``init`` compares them): a rank that
        fuses differently, cuts other segments, calibrates when another does not, or
        runs another ddl version would wait forever in a call the others never make.
        """
        return {
            "ddl version": version,
            "DDL_TOPOLOGY": str(topology),
            "DDL_ALGORITHM": self.algorithm,
            "DDL_SEGMENT_BYTES": str(self.segment_bytes),
            "DDL_FUSION_THRESHOLD": str(self.fusion_threshold),
            "DDL_CALIBRATION": "off" if self.calibration == "off" else "on",
            "DDL_SHM_BYTES": str(self.shm_bytes),
        }


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


#: Variables an MPI launcher sets in each rank it starts (hydra and Slurm's PMI-1/2,
#: Open MPI, PMIx): their presence means the process was started as an MPI rank.
MPI_RANK_VARIABLES: tuple[str, ...] = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK")


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
    """

    slurm_job_id: str | None = None
    slurm_nodelist: str | None = None
    slurm_tasks_per_node: str | None = None
    slurm_ntasks: int | None = None
    slurm_step_tasks: int | None = None
    slurm_procid: int | None = None
    mpi_launched: bool = False

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
    )


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


def search_path(env: Mapping[str, str] | None = None) -> list[str]:
    """The folders of ``PATH``, where the launcher looks for mpiexec last."""
    env = os.environ if env is None else env
    return [entry for entry in env.get("PATH", "").split(os.pathsep) if entry]


# ddlrun flag (its argparse dest) -> environment variable read above.
LAUNCHER_FLAGS: dict[str, str] = {
    "topology": "DDL_TOPOLOGY",
    "algorithm": "DDL_ALGORITHM",
    "segment_bytes": "DDL_SEGMENT_BYTES",
    "verbose": "DDL_VERBOSE",
    "timeline": "DDL_TIMELINE",
    "fusion_threshold": "DDL_FUSION_THRESHOLD",
    "stall_timeout": "DDL_STALL_TIMEOUT",
    "calibration": "DDL_CALIBRATION",
}


def _str(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name, "").strip()
    return value or None


def _count(env: Mapping[str, str], name: str, *, minimum: int = 1) -> int | None:
    raw = env.get(name, "").strip()
    return int(raw) if raw.isdigit() and int(raw) >= minimum else None


def _calibration(env: Mapping[str, str], name: str) -> str | None:
    value = _str(env, name)
    if value is None or value.lower() == "on":
        return None
    return "off" if value.lower() == "off" else value


def _positive_int(env: Mapping[str, str], name: str, default: int) -> int:
    return _int(env, name, default, minimum=1)


def _int(env: Mapping[str, str], name: str, default: int, *, minimum: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a whole number of bytes; set e.g. {name}={default}") from None
    if value < minimum:
        raise ValueError(f"{name}={raw!r} must be at least {minimum}; set e.g. {name}={default}")
    return value


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number; set e.g. {name}={default:g}") from None
    if not value > 0:
        raise ValueError(f"{name}={raw!r} must be positive; set e.g. {name}={default:g}")
    return value


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={raw!r} is not a boolean; use 1 or 0")
