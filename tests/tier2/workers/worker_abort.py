"""Tier-2 worker: rank 1 raises while the others wait in a collective; the job must end."""

import time

import numpy as np

import ddl

ddl.init()
if ddl.rank() == 1:
    print(f"T0 {time.time():.3f}", flush=True)  # the driver times the ending from here
    raise ValueError("boom from rank 1")
ddl.allreduce(np.ones(4))  # never completes: rank 1 is gone
print("UNREACHABLE", flush=True)
