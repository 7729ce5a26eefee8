"""Refuse a world of one when the scheduler started several tasks (``srun --mpi=none``).

Each such task would train its own model and report success: a silent waste of the
allocation. MPI cannot tell (every task is a valid singleton); Slurm's variables can.
"""

from __future__ import annotations

from ddl.base.config import Config, JobEnv, job_from_env
from ddl.base.errors import DDLError


class SingletonWorldError(DDLError):
    """Several tasks of one Slurm step each started as a world of one rank."""


def check_world(world_size: int, config: Config, job: JobEnv | None = None) -> None:
    """Raise when this process is one of several ``srun`` tasks but MPI sees a world of 1.

    Args:
        world_size: the size of ``MPI_COMM_WORLD`` (1 for a singleton).
        config: ``allow_singletons`` (``DDL_ALLOW_SINGLETONS=1``) turns the check off.
        job: what Slurm and the MPI launcher said (default: read from the environment).

    Raises:
        SingletonWorldError: ``world_size == 1``, the process is a task ``srun`` started
            (``SLURM_PROCID``), its step has more than one task, and no MPI launcher
            started it (an ``mpiexec -n 1`` inside an allocation is fine).

    Example:
        >>> check_world(1, Config(), JobEnv(slurm_job_id="5", slurm_step_tasks=4, slurm_procid=2))
        ... # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ddl.runtime.world_check.SingletonWorldError: Slurm started 4 tasks ...
    """
    job = job_from_env() if job is None else job
    # SLURM_STEP_NUM_TASKS, not SLURM_NTASKS: a batch script's own process has
    # SLURM_NTASKS=4 and SLURM_PROCID=0 too, and may rightly run alone.
    tasks = job.slurm_step_tasks
    if world_size != 1 or config.allow_singletons or job.mpi_launched:
        return
    if not job.in_slurm or job.slurm_procid is None or tasks is None or tasks <= 1:
        return
    raise SingletonWorldError(
        f"Slurm started {tasks} tasks in this step (SLURM_JOB_ID={job.slurm_job_id}, this is "
        f"SLURM_PROCID={job.slurm_procid}) but MPI sees a world of 1: each task would train "
        "alone. The step's MPI plugin did not connect them: with the pip MPICH run "
        "`srun --mpi=pmi2 ...` (it speaks PMI-1, which Slurm's pmi2 plugin serves), or start the "
        "job with `ddlrun` inside the allocation. Independent runs on purpose: set "
        "DDL_ALLOW_SINGLETONS=1"
    )
