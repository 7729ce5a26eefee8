"""Tier-2 worker: a process set's communicator waits as the world's does (the same stall
limit, polling rule and host map), and its allreduce runs. Prints one line per member.
Used by tests/tier2/test_mpi.py."""

import numpy as np

import ddl
from ddl.runtime import lifecycle
from ddl.runtime.process_sets import collectives_for

ddl.init()
world = lifecycle.engine().ctx.comm
members = ddl.add_process_set([0, 2])
if ddl.rank() in (0, 2):
    comm = collectives_for(members).ctx.comm
    x = np.full(4, float(ddl.rank()))
    ddl.allreduce_(x, op=ddl.Sum, process_set=members)
    print(f"SET rank={ddl.rank()} sum={x[0]:g} limit={comm.stall_limit:g}/{world.stall_limit:g} "
          f"poll={comm.poll_native}/{world.poll_native} busy={comm.busy_wait:g}/{world.busy_wait:g} "
          f"blocks={comm.negotiation_blocks} remote={sorted(comm.remote)}", flush=True)
ddl.shutdown()
