"""Build hook: the MPI that ``pip install ddl`` brings, chosen by ``DDL_MPI`` at build time.

Extras can only add requirements, never take the default MPI away, so the choice is a
build-time switch (as ``MPICC`` is for mpi4py):

- unset or ``mpich``: the pip ``mpich`` wheel, so a laptop needs no system packages;
- ``system``: no MPI wheel; mpi4py loads the cluster's MPI (its binary wheel finds a
  system ``libmpi``, or build it with ``MPICC=mpicc pip install --no-binary mpi4py mpi4py``).
"""

import os

from setuptools import setup

BASE = ["numpy>=1.24", "mpi4py>=4.0"]
MPI_WHEELS = {
    "mpich": ["mpich>=4.2; platform_system == 'Linux' or platform_system == 'Darwin'"],
    "system": [],
}

choice = os.environ.get("DDL_MPI", "").strip().lower() or "mpich"
if choice not in MPI_WHEELS:
    raise SystemExit(
        f"DDL_MPI={choice!r} is not an MPI choice ddl knows; use DDL_MPI=mpich (the default: "
        "the pip MPICH wheel) or DDL_MPI=system (the MPI of this machine, no MPI wheel)"
    )
setup(install_requires=BASE + MPI_WHEELS[choice])
