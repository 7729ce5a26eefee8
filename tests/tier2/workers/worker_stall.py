"""Tier-2 worker: rank 1 never submits 'late'; the others must report it and abort."""

import time

import numpy as np

import ddl

ddl.init()
ddl.allreduce(np.ones(2), name="warmup")
if ddl.rank() == 1:
    time.sleep(30)  # alive, but never submits
else:
    print(f"T0 {time.time():.3f}", flush=True)  # the driver times the ending from here
    ddl.allreduce(np.ones(2), name="late")
print("UNREACHABLE", flush=True)
