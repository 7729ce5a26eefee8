"""torch.distributed with gloo, measured beside ddl by ``ddl bench`` (needs torch)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ddl_bench.peers import free_port


def gloo_allreduce(comm: Any) -> tuple[Callable[[np.ndarray], np.ndarray] | None, str]:
    """torch.distributed with the gloo backend, or (None, why) when it cannot run."""
    port = comm.bcast(free_port() if comm.Get_rank() == 0 else None, root=0)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.Get_rank(),
                            world_size=comm.Get_size())

    def run(x: np.ndarray) -> np.ndarray:
        t = torch.from_numpy(x.copy())
        dist.all_reduce(t)
        out: np.ndarray = t.numpy()
        return out

    return run, ""
