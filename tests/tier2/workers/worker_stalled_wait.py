"""Tier-2 worker: rank 1 comes late to a wait of rank 0's (argv[1] names it); rank 0's
stall limit is 1 s, so it must leave that wait with StalledWaitError long before rank 1
comes (4 s), and it then aborts the job (status 3). Used by tests/tier2/test_failfast.py."""

import sys
import time

import numpy as np
from mpi4py import MPI

from ddl.base.errors import StalledWaitError
from ddl.base.ops import ReduceOp
from ddl.wire.comm import MPIComm

WHAT = sys.argv[1]
world = MPI.COMM_WORLD
comm = MPIComm(world.Dup())
comm.poll_native = True  # as init sets it where each rank has a core
comm.stall_limit = 1.0
comm.remote = frozenset({1 - world.rank})  # as if the other rank were on another host
if world.rank == 1:
    time.sleep(4)
start = time.monotonic()
try:
    if WHAT == "allreduce":
        comm.allreduce_native(np.ones(4, np.float32), ReduceOp.SUM)
    elif WHAT == "negotiation":
        comm.allreduce_native(np.ones(8, np.int64), ReduceOp.MIN, negotiation=True)
    elif WHAT == "broadcast":
        comm.bcast_buffer(np.ones(4, np.uint8), 1)
    elif WHAT == "sendrecv":
        other = 1 - world.rank
        comm.sendrecv(np.ones(4, np.uint8), other, np.empty(4, np.uint8), other)
except StalledWaitError as exc:
    print(f"STALLED after {time.monotonic() - start:.1f} s: {exc}", flush=True)
    time.sleep(0.3)  # the launcher forwards the line before the abort's kill
    world.Abort(3)
    time.sleep(60)  # MPI_Abort may return before the launcher's kill lands
print(f"DONE rank {world.rank}", flush=True)
