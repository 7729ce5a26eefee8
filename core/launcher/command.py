"""ddlrun's mpiexec command line and child environment, built by pure functions."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

from ddl.base.config import SETTINGS, Config, JobEnv
from ddl.base.errors import TopologyError
from ddl.base.settings import Setting
from ddl.base.topology import check_spec_size, parse_spec
from ddl.launcher.hosts import HostSlots, format_host_list, ranks_per_host, total_slots
from ddl.launcher.slurm import allocation_hosts
from ddl.reduction.algorithms import NAMES, check_name

Flavour = Literal["mpich", "openmpi"]

#: The variable that makes idle ranks yield their core instead of busy-polling.
YIELD_VARIABLES: dict[Flavour, str] = {
    "mpich": "MPIR_CVAR_ENABLE_HEAVY_YIELD",
    "openmpi": "OMPI_MCA_mpi_yield_when_idle",
}
#: COMMAND words replaced by ddlrun's own interpreter.
PYTHON_NAMES: tuple[str, ...] = ("python", "python3")


class LaunchError(ValueError):
    """The launch was asked for something inconsistent; the message says what and how to fix it."""


#: The settings ``ddlrun`` takes as flags (every one ranks must agree on among them), by field.
FLAGGED: dict[str, Setting] = {s.field: s for s in SETTINGS if s.flag}


def setting_help(row: Setting) -> str:
    """A setting's help with what only the launcher's layer knows filled in (the algorithm names)."""
    return row.help.format(algorithms=", ".join(NAMES))


class LaunchOptions:
    """What the user asked ddlrun for.

    Attributes:
        np: number of ranks.
        command: the program each rank runs, as written.
        hosts: hosts with slots (from ``-H`` or ``--hostfile``); empty for this host only.
        verbose: explain the launch (and set ``DDL_VERBOSE=1`` in the ranks).
        settings: the flagged settings given (:data:`FLAGGED` field -> value); each
            becomes its ``DDL_*`` variable. Also readable as attributes (``options.topology``).
        supervised: a supervisor (``ddlrun --elastic``), not the launcher, ends the world
            when a rank ends: MPICH's ``-disable-auto-cleanup`` (Open MPI has no such mode).
    """

    def __init__(self, *, np: int, command: tuple[str, ...], hosts: tuple[HostSlots, ...] = (),
                 verbose: bool = False, supervised: bool = False, **settings: object) -> None:
        unknown = sorted(set(settings) - set(FLAGGED))
        if unknown:
            raise TypeError(f"LaunchOptions got unknown settings {unknown}; ddlrun's are {sorted(FLAGGED)}")
        self.np = np
        self.command = tuple(command)
        self.hosts = tuple(hosts)
        self.verbose = verbose
        self.supervised = supervised
        self.settings: dict[str, object] = {k: v for k, v in settings.items() if v is not None and v is not False}
        if verbose:
            self.settings["verbose"] = True

    def __getattr__(self, name: str) -> Any:
        if name in FLAGGED:
            return self.__dict__.get("settings", {}).get(name)
        raise AttributeError(name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LaunchOptions) and vars(self) == vars(other)

    def __repr__(self) -> str:
        extra = "".join(f", {k}={v!r}" for k, v in self.settings.items())
        extra += ", supervised=True" if self.supervised else ""
        return f"LaunchOptions(np={self.np}, command={self.command!r}, hosts={self.hosts!r}{extra})"


@dataclasses.dataclass(frozen=True, kw_only=True)
class MpiInfo:
    """The MPI that mpi4py uses: its flavour, its ``mpiexec`` and its version line."""

    flavour: Flavour
    mpiexec: str
    library: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Launch:
    """What to run: the full argv, the full child environment, and why (for ``--verbose``)."""

    argv: list[str]
    env: dict[str, str]
    notes: list[str]


def flavour_from_version(version: str) -> Flavour:
    """The flavour from ``MPI.Get_library_version()``'s text.

    Raises:
        LaunchError: neither Open MPI nor an MPICH derivative.

    Example:
        >>> flavour_from_version("Open MPI v5.0.3, package: ...")
        'openmpi'
    """
    if "Open MPI" in version:
        return "openmpi"
    if any(name in version for name in ("MPICH", "MVAPICH", "Intel(R) MPI")):
        return "mpich"
    first = version.strip().splitlines()[0] if version.strip() else "(empty)"
    raise LaunchError(
        f"mpi4py uses an MPI library ddlrun does not know ({first!r}); ddlrun drives MPICH "
        "(and derivatives) and Open MPI. Run its mpiexec yourself, or `pip install mpich` "
        "and reinstall mpi4py"
    )


def validate_options(options: LaunchOptions) -> None:
    """Check the options against each other before anything starts.

    Raises:
        LaunchError: ``np < 1``, no command, too few host slots, a malformed topology or one
            whose product is not ``np``, an unknown algorithm, or a value ``ddl.base.config``
            would refuse (``--segment-bytes 0``).
    """
    if options.np < 1:
        raise LaunchError(f"-np {options.np} is not a rank count; give at least 1, e.g. -np 2")
    if not options.command:
        raise LaunchError("no COMMAND given; put the program after the options, e.g. ddlrun -np 2 python train.py")
    if options.hosts and total_slots(options.hosts) < options.np:
        raise LaunchError(
            f"-np {options.np} needs {options.np} slots but the hosts give "
            f"{total_slots(options.hosts)} ({format_host_list(options.hosts)}); add slots "
            "(host:SLOTS) or lower -np"
        )
    if options.topology is not None:
        try:
            spec = parse_spec(options.topology)
        except TopologyError as exc:
            raise LaunchError(f"--topology: {exc}") from None
        try:
            check_spec_size(spec, options.np, source="--topology")
        except TopologyError:
            raise LaunchError(
                f"--topology {options.topology!r} multiplies to {spec.size} but -np is "
                f"{options.np}; give dims whose product is {options.np} (e.g. --topology "
                f"{options.np}) or run -np {spec.size}"
            ) from None
    if options.algorithm is not None:
        try:
            check_name(options.algorithm)
        except ValueError as exc:
            raise LaunchError(f"--algorithm: {exc}") from None
    for field, value in options.settings.items():
        row = FLAGGED[field]
        try:  # the one reader of DDL_* judges each value, as the ranks will
            Config.from_env({row.env: _env_text(value)})
        except ValueError as exc:
            raise LaunchError(f"{row.flag} {value}: {exc}") from None


def ddl_environment(options: LaunchOptions) -> dict[str, str]:
    """The ``DDL_*`` variables the options set (the settings table names each one).

    Unset options (None, False) set nothing; True becomes ``"1"``.

    Example:
        >>> ddl_environment(LaunchOptions(np=4, command=("x",), topology="2x2", verbose=True))
        {'DDL_TOPOLOGY': '2x2', 'DDL_VERBOSE': '1'}
    """
    return {FLAGGED[field].env: _env_text(value) for field, value in options.settings.items()}


def _env_text(value: object) -> str:
    return "1" if value is True else str(value)


def placement(
    np: int | None, hosts: tuple[HostSlots, ...], job: JobEnv
) -> tuple[int, tuple[HostSlots, ...], list[str]]:
    """The rank count and hosts to launch, and where they came from (for ``--verbose``).

    ``-H``/``--hostfile`` win; otherwise, inside a Slurm allocation, its nodes with their
    task counts as slots (``SLURM_JOB_NODELIST``, ``SLURM_TASKS_PER_NODE``); otherwise
    this host. Without ``-np`` every slot gets a rank; outside Slurm and without hosts
    ``-np`` is required.

    Raises:
        LaunchError: no ``-np`` and nothing to count slots from.
        SlurmError: the Slurm variables cannot be read (a :class:`HostListError`).

    Example:
        >>> placement(None, (), JobEnv(slurm_job_id="9", slurm_nodelist="n[1-2]",
        ...                            slurm_tasks_per_node="2(x2)"))[:2]
        (4, (HostSlots(name='n1', slots=2), HostSlots(name='n2', slots=2)))
    """
    notes: list[str] = []
    if not hosts and job.in_slurm:
        hosts = allocation_hosts(job)
        notes.append(
            f"hosts {format_host_list(hosts)} from Slurm job {job.slurm_job_id} "
            f"(SLURM_JOB_NODELIST={job.slurm_nodelist}, SLURM_TASKS_PER_NODE={job.slurm_tasks_per_node})"
        )
    if np is None:
        if not hosts:
            raise LaunchError(
                "no -np given and no hosts to count slots from; give -np N (e.g. -np 2), "
                "-H host:SLOTS,... or --hostfile, or run inside a Slurm allocation"
            )
        np = total_slots(hosts)
        notes.append(f"-np {np}: every slot of {format_host_list(hosts)}")
    return np, hosts, notes


def busiest_host_ranks(options: LaunchOptions) -> int:
    """The most ranks any one host runs (all ``np`` when no hosts are given)."""
    if not options.hosts:
        return options.np
    return max(ranks_per_host(options.hosts, options.np))


def build_launch(
    options: LaunchOptions,
    *,
    mpi: MpiInfo,
    cpu_count: int,
    base_env: Mapping[str, str],
    python_executable: str,
    is_root: bool,
    wrap: tuple[str, ...] = (),
) -> Launch:
    """Build the mpiexec argv and the child environment for ``options``.

    Args:
        options: what the user asked for; validated here first.
        mpi: the MPI flavour and the mpiexec to run.
        cpu_count: cores on this machine; more ranks than that on a host is oversubscribed.
        base_env: the environment to start from (ddlrun's own); the user's settings win
            over ddlrun's defaults, flags win over ``DDL_*`` already set.
        python_executable: replaces a COMMAND that starts with ``python``/``python3``.
        is_root: ddlrun runs as root (Open MPI then needs ``--allow-run-as-root``).
        wrap: a program every rank's command runs under (ddlrun's rank keeper), placed
            before it once ``python`` has become ``python_executable``.

    Returns:
        The :class:`Launch`; nothing is run.

    Raises:
        LaunchError: see :func:`validate_options`; or a supervised world on Open MPI.

    Example:
        >>> mpi = MpiInfo(flavour="mpich", mpiexec="/venv/bin/mpiexec")
        >>> build_launch(LaunchOptions(np=2, command=("python", "t.py")), mpi=mpi, cpu_count=8,
        ...              base_env={}, python_executable="/venv/bin/python", is_root=False).argv
        ['/venv/bin/mpiexec', '-n', '2', '/venv/bin/python', 't.py']
    """
    validate_options(options)
    notes = [f"MPI: {mpi.flavour} ({mpi.library or 'version unknown'}), mpiexec {mpi.mpiexec}"]
    env = dict(base_env)
    for field, value in options.settings.items():
        row = FLAGGED[field]
        env[row.env] = _env_text(value)
        notes.append(f"{row.env}={env[row.env]} (from {row.flag})")

    mpi_flags: list[str] = []
    if options.supervised:
        if mpi.flavour != "mpich":
            raise LaunchError("a supervised world (ddlrun --elastic) needs MPICH's hydra, which can leave a world "
                              "to its supervisor (-disable-auto-cleanup); this MPI is Open MPI")
        mpi_flags.append("-disable-auto-cleanup")
        notes.append("-disable-auto-cleanup: ddlrun, not hydra, ends the world when a rank ends")
    busiest = busiest_host_ranks(options)
    if busiest > cpu_count:
        mpi_flags += _oversubscribe(mpi.flavour, busiest, cpu_count, options, base_env, env, notes)
    if mpi.flavour == "openmpi" and is_root:
        mpi_flags.append("--allow-run-as-root")
        notes.append("running as root: Open MPI refuses that unless given --allow-run-as-root")

    if options.hosts:
        mpi_flags += _host_flags(mpi.flavour, options.hosts, env)
        notes.append(f"hosts {format_host_list(options.hosts)}; DDL_* and yield variables passed to every host")

    command = list(options.command)
    if command[0] in PYTHON_NAMES:
        notes.append(
            f"COMMAND starts with {command[0]!r}: running {python_executable} instead, so every "
            "rank uses ddlrun's interpreter and virtualenv (and the MPI mpi4py was built for)"
        )
        command[0] = python_executable
    argv = [mpi.mpiexec, "-n", str(options.np), *mpi_flags, *wrap, *command]
    return Launch(argv=argv, env=env, notes=notes)


def _oversubscribe(
    flavour: Flavour,
    busiest: int,
    cpu_count: int,
    options: LaunchOptions,
    base_env: Mapping[str, str],
    env: dict[str, str],
    notes: list[str],
) -> list[str]:
    where = "the busiest host" if options.hosts else "this host"
    variable = YIELD_VARIABLES[flavour]
    why = (
        f"{busiest} ranks on {where} but {cpu_count} cores here: oversubscribed, and ranks that "
        "busy-poll for messages starve the ones with work (measured with MPICH: 4 ranks on 2 "
        "cores, ~5 ms per small allreduce, ~0.7 ms when idle ranks yield)"
    )
    if variable in base_env:
        notes.append(f"{why}; keeping your {variable}={base_env[variable]}")
    else:
        env[variable] = "1"
        notes.append(f"{why}; setting {variable}=1 so idle ranks yield the core")
    if flavour == "openmpi":
        notes.append("adding --oversubscribe: Open MPI refuses more ranks than slots without it")
        return ["--oversubscribe"]
    return []


def _host_flags(flavour: Flavour, hosts: tuple[HostSlots, ...], env: Mapping[str, str]) -> list[str]:
    hosts_text = format_host_list(hosts)
    names = sorted(name for name in env if name.startswith("DDL_"))
    if YIELD_VARIABLES[flavour] in env:
        names.append(YIELD_VARIABLES[flavour])
    if flavour == "openmpi":
        flags = ["-H", hosts_text]
        for name in names:
            flags += ["-x", name]
        return flags
    flags = ["-hosts", hosts_text]
    for name in names:
        flags += ["-genv", name, env[name]]
    return flags
