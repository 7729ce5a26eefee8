"""A torch training script in which rank 1 fails at step 3 in the way ``argv[1]`` names (tools/fail_fast.py).

Rank 0 (and the others) train on. ``T0 <unix time>`` marks the failure.
"""

import os
import signal
import sys
import time

CASE = sys.argv[1]
RANK = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))


def mark() -> None:
    print(f"T0 {time.time():.3f}", flush=True)


if RANK == 1 and CASE == "before-init":
    mark()
    raise RuntimeError("config file /data/run.yaml missing on this host")

import torch  # noqa: E402

import ddl.torch as dt  # noqa: E402

dt.init()
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
opt = dt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters())
dt.broadcast_parameters(model.state_dict(), root_rank=0)
x, y = torch.randn(64, 32), torch.randint(0, 10, (64,))
for step in range(8):
    if dt.rank() == 1 and step == 3:
        mark()
        if CASE == "exit-3":
            sys.exit(3)
        if CASE == "import-error":
            import not_a_module_anywhere  # noqa: F401
        if CASE == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if CASE == "mpi-abort":
            from mpi4py import MPI

            MPI.COMM_WORLD.Abort(4)
        if CASE == "stall":
            time.sleep(float(os.environ.get("STALL_SECONDS", "120")))  # alive, never submits
        if CASE == "skip-step":
            continue
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    print(f"rank {dt.rank()} step {step}", flush=True)
print(f"DONE rank {dt.rank()} {time.time():.3f}", flush=True)  # from here on, the process only ends
