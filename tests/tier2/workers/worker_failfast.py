"""Tier-2 worker: rank 1 fails in one of the ways real jobs fail (argv[1] names it); rank 0 trains on.

``worker_failfast.py CASE [numpy|torch]``: the cases are one table for both steps, which differ only in
what a step runs: ``numpy`` (the default) a ``ddl.allreduce`` of 16 floats, 6 steps;
``torch`` a ``DistributedOptimizer`` step of a small MLP, 8 steps, each printed.
``T0 <unix time>`` marks the moment of the failure, so the driver times the job's end from
it rather than from a loaded start-up. Used by tests/tier2/test_failfast.py,
tests/tier2/test_failfast_hosts.py, tests/tier2/test_slurm.py and tools/fail_fast.py.
"""

import os
import signal
import sys
import time
from collections.abc import Callable

CASE = sys.argv[1]
FRAMEWORK = sys.argv[2] if len(sys.argv) > 2 else "numpy"
# Before ddl.init only the launcher's variables say which rank this is.
RANK = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
FAIL_AT = 3  # the step at which rank 1 fails


def mark() -> None:
    print(f"T0 {time.time():.3f}", flush=True)


def fail_before_init() -> None:
    """The cases that end rank 1 before ddl is imported."""
    if CASE == "before-init":
        mark()
        raise RuntimeError("config file /data/run.yaml missing on this host")
    if CASE == "exit-0-before-init":
        mark()
        sys.exit(0)


def fail_at_step() -> bool:
    """Rank 1's failure at step :data:`FAIL_AT`; True when it skips the step (it stays alive and in the job)."""
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
        time.sleep(60)  # MPI_Abort may return before the launcher's kill lands; a program never steps on
    if CASE == "stall":
        time.sleep(float(os.environ.get("STALL_SECONDS", "120")))  # alive, but never submits
    if CASE == "freeze":
        os.kill(os.getpid(), signal.SIGSTOP)  # stopped, sockets open: it never answers again
    return CASE == "skip-step"


def numpy_steps() -> tuple[Callable[[], int], int, Callable[[int], None]]:
    """ddl.allreduce alone: processes that start and end fast."""
    import numpy as np

    import ddl

    ddl.init()

    def step(i: int) -> None:
        ddl.allreduce(np.ones(16, np.float32), name="grad")

    return ddl.rank, 6, step


def torch_steps() -> tuple[Callable[[], int], int, Callable[[int], None]]:
    """A DistributedOptimizer on every rank, as a training script has."""
    import torch

    import ddl.torch as dt

    dt.init()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = dt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                  named_parameters=model.named_parameters())
    dt.broadcast_parameters(model.state_dict(), root_rank=0)
    x, y = torch.randn(64, 32), torch.randint(0, 10, (64,))

    def step(i: int) -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        print(f"rank {dt.rank()} step {i}", flush=True)

    return dt.rank, 8, step


STEPS = {"numpy": numpy_steps, "torch": torch_steps}

if FRAMEWORK not in STEPS:
    raise SystemExit(f"worker_failfast.py: framework {FRAMEWORK!r}: give one of {sorted(STEPS)}")
if RANK == 1:
    fail_before_init()
rank, count, step = STEPS[FRAMEWORK]()
for i in range(count):
    if rank() == 1 and i == FAIL_AT and fail_at_step():
        continue
    step(i)
print(f"DONE rank {rank()} {time.time():.3f}", flush=True)  # from here on, the process only ends
