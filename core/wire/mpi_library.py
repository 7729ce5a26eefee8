"""Which libmpi file this process has loaded, and a one-line description of it for errors."""

from __future__ import annotations

import os
import re
from pathlib import Path

_LIBMPI = re.compile(r"^lib(?:mpi|mpich|impi)\.(?:so(?:\.\d+)*|dylib|\d+\.dylib)$")


def loaded_library_path(maps: str) -> str | None:
    """The ``libmpi`` file among a ``/proc/self/maps`` text's mapped files, or None.

    Example:
        >>> loaded_library_path("7f00-7f01 r-xp 0 08:01 12 /usr/lib/x86_64-linux-gnu/libmpi.so.40.30.4")
        '/usr/lib/x86_64-linux-gnu/libmpi.so.40.30.4'
    """
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and _LIBMPI.match(os.path.basename(fields[5].strip())):
            return fields[5].strip()
    return None


def read_maps() -> str:
    """This process's ``/proc/self/maps`` (empty where there is none: not Linux)."""
    try:
        return Path("/proc/self/maps").read_text()
    except OSError:
        return ""


def open_mpi_major(version: str) -> int | None:
    """Open MPI's major version from ``MPI.Get_library_version()``'s text; None for another MPI.

    Example:
        >>> open_mpi_major("Open MPI v5.0.11, package: Open MPI user@localhost Distribution"), open_mpi_major("MPICH Version: 5.0.2")
        (5, None)
    """
    found = re.search(r"Open MPI v(\d+)\.", version)
    return int(found.group(1)) if found else None


def describe_loaded_mpi() -> str:
    """'MPICH Version: 5.0.2 (/venv/lib/libmpi.so.12)': the library mpi4py loaded, for messages.

    Call only after ``mpi4py.MPI`` imported; returns 'an unknown MPI' when it cannot tell.
    """
    try:
        from mpi4py import MPI

        text = str(MPI.Get_library_version()).replace("\x00", "").strip()
    except Exception:  # only for a message: never fail here
        return "an unknown MPI"
    first = " ".join(text.splitlines()[0].split()) if text else "an unknown MPI"
    path = loaded_library_path(read_maps())
    return f"{first} ({path})" if path else first
