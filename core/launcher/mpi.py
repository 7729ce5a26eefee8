"""Which MPI library mpi4py loads, and the mpiexec that belongs to that library.

mpi4py 4.1's binary wheels carry one extension per MPI ABI (MPICH, Open MPI) and load
the first ``libmpi`` they find (the virtualenv's ``lib/``, then the system's); an mpi4py
built from source links the MPI whose ``mpicc`` built it. Either way the launcher must
be that library's own: another MPI's mpiexec starts N singletons, or nothing.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from ddl.launcher.command import Flavour, MpiInfo, flavour_from_version
from ddl.wire.mpi_library import loaded_library_path, read_maps

#: Launcher names to try in each bin folder, in order; the generic name comes first.
LAUNCHER_NAMES: dict[Flavour, tuple[str, ...]] = {
    "mpich": ("mpiexec", "mpiexec.hydra", "mpiexec.mpich", "mpirun", "mpirun.mpich"),
    "openmpi": ("mpiexec", "mpirun", "mpirun.openmpi", "mpiexec.openmpi"),
}


class MpiNotFoundError(RuntimeError):
    """No mpiexec, or no MPI library that mpi4py can load; the message says what to install."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class MpiLibrary:
    """The MPI library mpi4py loaded (without ``MPI_Init``) and how mpi4py was built."""

    flavour: Flavour
    version: str
    path: str | None
    standard: str
    mpi4py_version: str
    mpi4py_extension: str
    mpi4py_build: dict[str, str]

    @property
    def first_line(self) -> str:
        return self.version.strip().splitlines()[0].strip() if self.version.strip() else ""


def load_library() -> MpiLibrary:
    """Import ``mpi4py.MPI`` without initialising MPI and describe the library it loaded.

    An initialised launcher would be an MPI process itself, and its PMI variables would
    leak into mpiexec's environment; so ``MPI_Init`` is skipped.

    Raises:
        MpiNotFoundError: mpi4py is missing or cannot load an MPI library.
        LaunchError: the library is neither Open MPI nor an MPICH derivative.
    """
    try:
        import mpi4py

        if "mpi4py.MPI" not in sys.modules:
            mpi4py.rc.initialize = False
            mpi4py.rc.finalize = False
        from mpi4py import MPI

        version = str(MPI.Get_library_version()).replace("\x00", "")  # Open MPI's ends in a NUL
        standard = "{}.{}".format(*MPI.Get_version())
    except Exception as exc:  # ImportError, or RuntimeError when libmpi cannot be loaded
        raise MpiNotFoundError(
            f"mpi4py cannot load an MPI library ({exc}); run `pip install mpich` in this "
            "environment, or make your MPI's libmpi findable (module load, LD_LIBRARY_PATH)"
        ) from None
    build = {str(k): str(v) for k, v in dict(getattr(mpi4py, "get_config", dict)()).items()}
    return MpiLibrary(
        flavour=flavour_from_version(version),
        version=version,
        path=loaded_library_path(read_maps()),
        standard=standard,
        mpi4py_version=str(mpi4py.__version__),
        mpi4py_extension=str(getattr(MPI, "__file__", "")),
        mpi4py_build=build,
    )


def mpiexec_candidates(
    *, flavour: Flavour, library_path: str | None, python_executable: str, path_dirs: Iterable[str]
) -> list[Path]:
    """Where this MPI's launcher may be, most likely first (existence is not checked).

    The ``bin/`` folders above the loaded library come first (a virtualenv's ``lib/`` has
    its ``bin/`` beside it; ``/usr/lib/x86_64-linux-gnu/libmpi.so.40`` has ``/usr/bin``),
    then the interpreter's folder, then ``PATH``.

    Example:
        >>> [str(p) for p in mpiexec_candidates(flavour="mpich", library_path="/v/lib/libmpi.so.12",
        ...  python_executable="/v/bin/python", path_dirs=[])][:2]
        ['/v/bin/mpiexec', '/v/bin/mpiexec.hydra']
    """
    folders: list[Path] = []
    if library_path:
        for path in dict.fromkeys([Path(library_path), Path(os.path.realpath(library_path))]):
            folders += [parent / "bin" for parent in list(path.parents)[:4]]
    folders.append(Path(python_executable).parent)
    folders += [Path(entry) for entry in path_dirs if entry]
    candidates: list[Path] = []
    for folder in dict.fromkeys(folders):
        candidates += [folder / name for name in LAUNCHER_NAMES[flavour]]
    return candidates


def launcher_flavour(version_text: str) -> Flavour | None:
    """The flavour of an ``mpiexec --version`` text, or None when it is neither.

    Example:
        >>> launcher_flavour("mpirun (Open MPI) 4.1.4"), launcher_flavour("HYDRA build details:")
        ('openmpi', 'mpich')
    """
    if "Open MPI" in version_text or "OpenRTE" in version_text:
        return "openmpi"
    if "HYDRA" in version_text or "Intel(R) MPI" in version_text:
        return "mpich"
    return None


def launcher_version(version_text: str) -> str:
    """A one-line name and version from an ``mpiexec --version`` text.

    Example:
        >>> launcher_version("HYDRA build details:\n    Version:   5.0.2\n")
        'HYDRA 5.0.2'
    """
    found = re.search(r"^\s*Version:\s*(\S+)", version_text, re.MULTILINE)
    if "HYDRA" in version_text and found:
        return f"HYDRA {found.group(1)}"
    return next((line.strip() for line in version_text.splitlines() if line.strip()), "unknown")


def probe_launcher(mpiexec: Path) -> str:
    """``mpiexec --version``'s output (empty when it cannot run in 10 s)."""
    try:
        done = subprocess.run([str(mpiexec), "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout + done.stderr


def find_mpiexec(
    *,
    flavour: Flavour,
    library_path: str | None,
    python_executable: str,
    path_dirs: Iterable[str],
    probe: Callable[[Path], str] = probe_launcher,
) -> tuple[Path, str]:
    """The first executable candidate whose ``--version`` is ``flavour``'s, and that text.

    Raises:
        MpiNotFoundError: no candidate exists, or only other MPIs' launchers do (named).
    """
    others: list[str] = []
    seen: set[str] = set()
    for candidate in mpiexec_candidates(flavour=flavour, library_path=library_path,
                                        python_executable=python_executable, path_dirs=path_dirs):
        real = os.path.realpath(candidate)
        if real in seen or not (candidate.is_file() and os.access(candidate, os.X_OK)):
            continue
        seen.add(real)
        text = probe(candidate)
        found = launcher_flavour(text)
        if found == flavour:
            return candidate, text
        others.append(f"{candidate} ({found or 'unknown'})")
    library = library_path or "its libmpi"
    if others:
        raise MpiNotFoundError(
            f"mpi4py uses {flavour} ({library}) but the launchers found belong to another MPI: "
            f"{', '.join(others)}; put {flavour}'s bin folder first on PATH, or reinstall mpi4py "
            "for the MPI you mean to use"
        )
    raise MpiNotFoundError(
        f"no mpiexec for {flavour} ({library}) beside it, beside {python_executable} or on PATH; "
        "run `pip install mpich` in this environment, or put your MPI's bin folder on PATH"
    )


def detect_mpi(*, python_executable: str, path: list[str]) -> MpiInfo:
    """The MPI mpi4py loads and its own mpiexec, as :class:`MpiInfo`.

    Args:
        python_executable: the interpreter the ranks will run.
        path: the ``PATH`` folders to search last (ddlrun passes its own).

    Raises:
        MpiNotFoundError: see :func:`load_library` and :func:`find_mpiexec`.
        LaunchError: the library is neither Open MPI nor an MPICH derivative.
    """
    library = load_library()
    mpiexec, _ = find_mpiexec(flavour=library.flavour, library_path=library.path,
                              python_executable=python_executable, path_dirs=path)
    return MpiInfo(flavour=library.flavour, mpiexec=str(mpiexec), library=library.first_line)
