"""Refuse to train when the world MPI formed is not the world the launcher started.

``mpiexec -n 2 python train.py`` where mpi4py cannot load its MPI, or loads another MPI
than the launcher's, gives every process a valid world of one: each would train its
own model and the job would exit 0. MPI cannot tell (each process is a valid
singleton); the launcher's own variables can (``PMI_SIZE``, ``OMPI_COMM_WORLD_SIZE``,
a Slurm step's ``SLURM_STEP_NUM_TASKS``, ``PMIX_RANK``). A world of one that no
launcher started (a plain ``python train.py``) stays allowed.

A world can also have the right size on the wrong hosts: Open MPI 5 ignores the ORTE
variables Kubeflow's MPI Operator sets (``OMPI_MCA_orte_default_hostfile``), so a plain
``mpirun -np 6`` in an MPIJob's launcher pod runs all six ranks there and the job ends
Complete. :func:`one_host_refusal` catches that from the gathered host names.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path

from ddl.base.config import Config, JobEnv, job_from_env
from ddl.base.errors import WorldMismatchError
from ddl.wire.mpi_library import describe_loaded_mpi, open_mpi_major

__all__ = ["SingletonWorldError", "WorldMismatchError", "check_world", "one_host_refusal"]

#: The ORTE variable Open MPI 4 reads and Open MPI 5 ignores (its PRRTE reads PRTE_MCA_*).
ORTE_HOSTFILE = "OMPI_MCA_orte_default_hostfile"
PRTE_HOSTFILE = "PRTE_MCA_prte_default_hostfile"

#: The name this error had when it covered Slurm steps only; kept for code that catches it.
SingletonWorldError = WorldMismatchError


def check_world(world_size: int, config: Config, job: JobEnv | None = None, *,
                load_error: str | None = None, library: str | None = None) -> None:
    """Raise when MPI's world is not the one the launcher of this process announced.

    Args:
        world_size: the size of ``MPI_COMM_WORLD`` (1 for a singleton or without MPI).
        config: ``allow_singletons`` (``DDL_ALLOW_SINGLETONS=1``) allows independent
            worlds of one on purpose.
        job: what the launcher and Slurm said (default: read from the environment).
        load_error: why mpi4py could not load an MPI library, if it could not.
        library: the MPI library mpi4py loaded ('MPICH Version: 5.0.2 (/v/lib/libmpi.so.12)').

    Raises:
        WorldMismatchError: the launcher announced another size than MPI's, or a rank
            above 0 to a world of one; the message names both, the likely cause and the fix.

    Example:
        >>> check_world(1, Config(), job_from_env({"PMI_SIZE": "1"}))  # mpiexec -n 1: fine
        >>> check_world(1, Config(), job_from_env({"PMI_SIZE": "2"}))  # doctest: +IGNORE_EXCEPTION_DETAIL
        Traceback (most recent call last):
        ddl.runtime.world_check.WorldMismatchError: the launcher started 2 processes (PMI_SIZE=2, ...
    """
    job = job_from_env() if job is None else job
    said = job.announced
    if said is None or config.allow_singletons and world_size == 1:
        return
    if said.size is not None and said.size == world_size:
        return
    if said.size is None and (world_size > 1 or not said.rank):
        return  # PMIx gave a rank only: rank 0 of a world of one is consistent
    raise WorldMismatchError(_message(world_size, said.size, said.rank, said.source, job,
                                      load_error=load_error, library=library))


def _message(world_size: int, size: int | None, rank: int | None, source: str, job: JobEnv, *,
             load_error: str | None, library: str | None) -> str:
    launcher = "srun" if source.startswith("SLURM_") else "the launcher"
    started = f"{launcher} started {size} processes" if size is not None else \
        f"{launcher} started this process as rank {rank}"
    head = f"{started} ({source}) but MPI connected {world_size} (this process sees a world of {world_size})"
    if load_error is not None:
        cause = (f"mpi4py could not load an MPI library ({load_error}), so no process could join the others")
        fix = ("install the MPI mpi4py uses in this environment (`pip install mpich`, which ddl-runtime "
               "brings) or make your cluster's libmpi findable (module load, LD_LIBRARY_PATH), then check "
               "with `ddl doctor`")
    elif world_size == 1:
        cause = (f"mpi4py loaded {library or 'an MPI library'}, which is not the MPI of the launcher that "
                 "started the job, so each process came up alone")
        fix = ("start the job with the mpiexec of the MPI mpi4py uses (`ddlrun -np N ...` finds it), or "
               "reinstall mpi4py for your launcher's MPI (DDL_MPI=system, see the install guide)")
        if source.startswith("SLURM_"):
            fix = ("the step's MPI plugin did not connect the tasks: with the pip MPICH run `srun --mpi=pmi2 ...` "
                   "(it speaks PMI-1, which Slurm's pmi2 plugin serves), or start the job with `ddlrun` "
                   "inside the allocation")
    else:
        cause = f"the MPI world ({library or 'mpi4py'}) and the launcher disagree"
        fix = "start every process with one launcher, the mpiexec of the MPI mpi4py uses (`ddlrun -np N ...`)"
    where = f" (SLURM_JOB_ID={job.slurm_job_id}, SLURM_PROCID={job.slurm_procid})" if job.in_slurm else ""
    return (f"{head}{where}: {cause}. Nothing was trained. To fix: {fix}. Independent single-process runs on "
            "purpose: set DDL_ALLOW_SINGLETONS=1")


def one_host_refusal(hostnames: Sequence[str], job: JobEnv, *, library: str | None = None,
                     read: Callable[[str], str | None] | None = None) -> str | None:
    """Why a world on one host must not train (the Open MPI 5 trap), or None.

    Refuses when every rank runs on one host, the library is Open MPI 5 or later, and
    ``OMPI_MCA_orte_default_hostfile`` names a hostfile (``host slots=N`` lines) over whose
    slots an MPI that read it would have spread this many ranks across several hosts.

    Args:
        hostnames: every rank's host name, gathered at ``init``.
        job: the variables of this process (the hostfile variables among them).
        library: ``MPI.Get_library_version()``'s first line (default: read from mpi4py).
        read: reads the hostfile (default: the file system; None when unreadable).

    Example:
        >>> job = JobEnv(hostfiles=(("OMPI_MCA_orte_default_hostfile", "/etc/mpi/hostfile"),))
        >>> text = "w-0.j.ns.svc slots=1\\nw-1.j.ns.svc slots=1\\n"
        >>> print(one_host_refusal(["j-launcher"] * 2, job, library="Open MPI v5.0.11",
        ...                        read=lambda p: text)[:64])
        Open MPI's mpirun started all 2 ranks on one host (j-launcher)
    """
    if len(hostnames) < 2 or len(set(hostnames)) != 1:
        return None
    named = dict(job.hostfiles)
    if ORTE_HOSTFILE not in named or PRTE_HOSTFILE in named:
        return None
    library = describe_loaded_mpi() if library is None else library
    major = open_mpi_major(library)
    if major is None or major < 5:
        return None
    path = named[ORTE_HOSTFILE]
    text = (read or _read_text)(path)
    spread = None if text is None else _hosts_used(text, len(hostnames))
    if spread is None or len(spread) < 2:
        return None
    shown = ", ".join(spread[:4]) + (f" and {len(spread) - 4} more" if len(spread) > 4 else "")
    return (f"Open MPI's mpirun started all {len(hostnames)} ranks on one host ({hostnames[0]}) although "
            f"{ORTE_HOSTFILE}={path} spreads {len(hostnames)} ranks over {len(spread)} hosts ({shown}): "
            f"{library.split(',')[0]} ignores the ORTE variables (OMPI_MCA_orte_*), which Kubeflow's MPI Operator "
            "still sets, so every rank ran on the launcher (the Open MPI 5 trap: the job would train on one "
            "node and end Complete). Nothing was trained. To fix: start the job with `ddlrun` (it passes the "
            f"hostfile's hosts itself), or `mpirun --hostfile {path} ...`, or set {PRTE_HOSTFILE}={path}; "
            f"to run on one host on purpose, unset {ORTE_HOSTFILE}")


def _hosts_used(text: str, ranks: int) -> list[str] | None:
    """The hosts a hostfile's slots give ``ranks`` ranks, filled in order; None unless every line has a count.

    A line without a count gets as many slots as its host has cores in Open MPI, which
    cannot be told from here: such a file proves nothing.
    """
    hosts: list[tuple[str, int]] = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        found = re.fullmatch(r"(\S+?)(?:\s+slots=|:)(\d+)(?:\s+max[-_]slots=\d+)?", line)
        if not found or int(found.group(2)) < 1:
            return None
        hosts.append((found.group(1), int(found.group(2))))
    used, left = [], ranks
    for name, slots in hosts:
        if left <= 0:
            break
        used.append(name)
        left -= slots
    return used


def _read_text(path: str) -> str | None:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
