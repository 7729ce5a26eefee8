"""ddlrun, the launcher: a thin front of the mpiexec of the MPI that mpi4py uses.

Its command line and environment come from :func:`build_launch`, a pure function;
:func:`main` parses ``ddlrun``'s flags, finds MPI and runs the result. The names here are
imported on first use, so that the processes ddlrun starts on every host (rank keepers,
elastic stubs) pay nothing for the modules they do not need.

Example:
    >>> from ddl.launcher import LaunchOptions, MpiInfo, build_launch
    >>> launch = build_launch(LaunchOptions(np=2, command=("train",), topology="2"),
    ...                       mpi=MpiInfo(flavour="mpich", mpiexec="mpiexec"), cpu_count=4,
    ...                       base_env={}, python_executable="python", is_root=False)
    >>> launch.argv, launch.env
    (['mpiexec', '-n', '2', 'train'], {'DDL_TOPOLOGY': '2'})
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_LAZY: dict[str, str] = {
    **dict.fromkeys(("Launch", "LaunchError", "LaunchOptions", "MpiInfo", "build_launch", "ddl_environment",
                     "flavour_from_version", "placement", "validate_options"), "ddl.launcher.command"),
    **dict.fromkeys(("HostListError", "HostSlots", "format_host_list", "parse_host_list", "parse_hostfile",
                     "read_hostfile"), "ddl.launcher.hosts"),
    **dict.fromkeys(("SlurmError", "allocation_hosts", "expand_hostlist", "expand_tasks_per_node"),
                    "ddl.launcher.slurm"),
}

if TYPE_CHECKING:
    from ddl.launcher.command import (
        Launch,
        LaunchError,
        LaunchOptions,
        MpiInfo,
        build_launch,
        ddl_environment,
        flavour_from_version,
        placement,
        validate_options,
    )
    from ddl.launcher.hosts import (
        HostListError,
        HostSlots,
        format_host_list,
        parse_host_list,
        parse_hostfile,
        read_hostfile,
    )
    from ddl.launcher.slurm import (
        SlurmError,
        allocation_hosts,
        expand_hostlist,
        expand_tasks_per_node,
    )


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ddl.launcher' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def main(argv: list[str] | None = None) -> int:
    """Run ``ddlrun`` with ``argv``; see :func:`ddl.launcher.cli.main`.

    Imported lazily so that ``python -m ddl.launcher.cli`` does not load ``cli`` twice.
    """
    from ddl.launcher.cli import main as cli_main

    return cli_main(argv)


__all__ = [
    "HostListError", "HostSlots", "Launch", "LaunchError", "LaunchOptions", "MpiInfo",
    "build_launch", "ddl_environment", "flavour_from_version", "format_host_list", "main",
    "parse_host_list", "parse_hostfile", "placement", "read_hostfile", "validate_options",
    "SlurmError", "allocation_hosts", "expand_hostlist", "expand_tasks_per_node",
]
