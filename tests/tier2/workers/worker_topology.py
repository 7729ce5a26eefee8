"""Tier-2 worker: topology discovered from (overridden) host names, and a bad spec's error."""

import os

import ddl

# DDL_HOSTNAME is set per rank by the driver through mpiexec's per-rank environment.
ddl.init()
topo = ddl.topology()
print(f"RANK {ddl.rank()} dims={'x'.join(map(str, topo.dims))} local={ddl.local_rank()}/{ddl.local_size()} "
      f"cross={ddl.cross_rank()}/{ddl.cross_size()} coords={topo.coords()} host={os.uname().nodename}", flush=True)
