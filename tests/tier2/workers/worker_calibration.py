"""Tier-2 worker: every rank holds the same calibrated cost model and picks the same algorithms."""

import dataclasses

import numpy as np

import ddl
from ddl.reduction import cost
from ddl.reduction.algorithms import SCHEDULED

ddl.init()
ctx = ddl.context()
r, p = ddl.rank(), ddl.size()
cal = ctx.calibration
assert cal is not None
sizes = [4 << 10 >> 2, 1 << 16, 1 << 20, 16 << 20, 64 << 20]
picks = [ctx.resolve_algorithm("auto", n, 4) for n in sizes]
mine = (dataclasses.astuple(ctx.model), picks, cal.source)
everyone = ddl.allgather_object(mine)
assert all(e[0] == mine[0] for e in everyone), f"rank {r}: models differ across ranks: {everyone}"
assert all(e[1] == picks for e in everyone), f"rank {r}: auto picks differ across ranks: {[e[1] for e in everyone]}"
if p > 1:
    assert cal.source == "fixed" or len(ctx.model.native_points) > 0
    assert all(lk.alpha > 0 and lk.beta > 0 for lk in ctx.model.links)
    # The model prices every contender, and auto's pick is the cheapest.
    for n, pick in zip(sizes, picks, strict=True):
        # MPI is a candidate only up to the largest size calibration measured it at (cost.choose).
        unmeasured = 0 < ctx.model.native_measured < n * 4
        costs = {a: cost.predict(a, ctx.topology, n, 4, ctx.model) for a in ("mpi", *SCHEDULED)
                 if not (a == "mpi" and unmeasured)}
        assert costs[pick] == min(costs.values()), (n, pick, costs)
# Whatever auto picks, the sum is right on every rank.
for n in sizes[:3]:
    assert np.all(ddl.allreduce(np.ones(n, np.float32), op=ddl.Sum) == p)
ddl.shutdown()
print(f"PASS calibration rank {r}/{p} source={cal.source.split()[0]} seconds={cal.seconds:.3f} picks={picks}",
      flush=True)
