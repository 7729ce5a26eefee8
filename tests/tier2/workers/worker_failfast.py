"""Tier-2 worker: rank 1 fails in one of the ways real jobs fail (argv[1] names it); rank 0 trains on.

``T0 <unix time>`` marks the moment of the failure, so the driver times the job's end from
it rather than from a loaded start-up. Used by tests/tier2/test_failfast.py and
tools/fail_fast.py (which runs the torch version of the same cases).
"""

import os
import signal
import sys
import time

import numpy as np

CASE = sys.argv[1]
# Before ddl.init only the launcher's variables say which rank this is.
RANK = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))


def mark() -> None:
    print(f"T0 {time.time():.3f}", flush=True)


if RANK == 1 and CASE == "before-init":
    mark()
    raise RuntimeError("config file /data/run.yaml missing on this host")
if RANK == 1 and CASE == "exit-0-before-init":
    mark()
    sys.exit(0)

import ddl  # noqa: E402 - after the cases that fail before it

ddl.init()
for step in range(6):
    if ddl.rank() == 1 and step == 3:
        mark()
        if CASE == "exit-3":
            sys.exit(3)
        if CASE == "import-error":
            import not_a_module_anywhere  # noqa: F401
        if CASE == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if CASE == "os-exit-0":
            os._exit(0)
        if CASE == "mpi-abort":
            from mpi4py import MPI

            MPI.COMM_WORLD.Abort(4)
        if CASE == "stall":
            time.sleep(float(os.environ.get("STALL_SECONDS", "120")))  # alive, but never submits
        if CASE == "skip-step":
            continue
    ddl.allreduce(np.ones(16, np.float32), name="grad")
print(f"DONE rank {ddl.rank()} {time.time():.3f}", flush=True)  # from here on, the process only ends
