"""Tier-2 elastic worker with sharded optimizer state: ddl.torch's TorchState over a ZeRO-1 Adam.

Run by tests/tier2/test_elastic_hosts.py under ``ddlrun --elastic`` on emulated hosts. Each
step trains on one global batch of 12 samples (a function of the step), split over the
ranks of whatever world runs it, so the result does not depend on the world sizes: at the
end rank 0 trains the same steps in one process and every rank prints its weights' digest
and their largest difference from that reference (``DONE``). At each commit every rank
prints the bytes of its saved optimizer part and the whole state's (``SAVED``), and each
host's writer the size of its commit (``STORE``): one whole copy per host, a part per rank.
``--join-step N`` holds the ranks at step N until ddlrun has announced new hosts (once).
"""

import argparse
import hashlib
import os
import socket
import time

import torch
from torch import nn

import ddl.torch as dt
import ddl.torch.elastic as elastic
from ddl.runtime import elastic as core_elastic
from ddl.runtime.running import context

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--commit-every", type=int, default=5)
parser.add_argument("--step-seconds", type=float, default=0.1)
parser.add_argument("--join-step", type=int, default=0)
args = parser.parse_args()
B = 12

torch.set_num_threads(1)
dt.init()


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 48), nn.Tanh(), nn.Linear(48, 4))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7000 + step)
    return torch.randn(B, 16, generator=g), torch.randn(B, 4, generator=g)


def adam(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=1e-3)


def one_step(model: nn.Module, opt: torch.optim.Optimizer, step: int, rank: int, size: int) -> None:
    x, y = batch(step)
    n = B // size
    opt.zero_grad()
    nn.functional.mse_loss(model(x[rank * n : (rank + 1) * n]), y[rank * n : (rank + 1) * n]).backward()
    opt.step()


model = net()
opt = dt.DistributedOptimizer(adam(model), named_parameters=model.named_parameters(), shard_optimizer_state=True)
state = elastic.TorchState(model=model, optimizer=opt, step=0, held=False)
print(f"WORLD {core_elastic.world_number()} rank={dt.rank()} size={dt.size()} host={socket.gethostname()} "
      f"t={time.time():.3f}", flush=True)


def report_commit() -> None:
    saved = state._handlers["optimizer"].saved["state"]
    mine = sum(v.numel() * v.element_size() for s in saved.values() for v in s.values() if isinstance(v, torch.Tensor))
    whole = sum(dt.allgather_object(mine))
    print(f"SAVED step={state.step} rank={dt.rank()} size={dt.size()} bytes={mine} whole={whole}", flush=True)
    folder = context().config.elastic_store
    if folder and dt.local_rank() == 0:
        model_bytes = sum(p.numel() * p.element_size() for p in model.state_dict().values())
        print(f"STORE step={state.step} host={socket.gethostname()} bytes={os.path.getsize(os.path.join(folder, 'state.bin'))} "
              f"model={model_bytes} whole={whole}", flush=True)


@elastic.run
def train(state: elastic.TorchState) -> None:
    while state.step < args.steps:
        one_step(state.model, state.optimizer, state.step, dt.rank(), dt.size())
        state.step += 1
        print(f"STEP {state.step} world={core_elastic.world_number()} size={dt.size()} rank={dt.rank()} "
              f"t={time.time():.3f}", flush=True)
        if state.step % args.commit_every == 0:
            if state.step == args.join_step and not state.held:
                core_elastic.wait_for_host_updates(120)
                state.held = True
            state.commit()
            report_commit()
        time.sleep(args.step_seconds)


train(state)
weights = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
diff = 0.0
if dt.rank() == 0:
    ref = net()
    ref_opt = adam(ref)
    for step in range(args.steps):
        one_step(ref, ref_opt, step, 0, 1)
    diff = max((a - b).abs().max().item() for a, b in zip(model.parameters(), ref.parameters(), strict=True))
print(f"DONE rank={dt.rank()} size={dt.size()} world={core_elastic.world_number()} step={state.step} "
      f"digest={hashlib.sha256(weights).hexdigest()[:16]} max_abs_diff={diff:.3g}", flush=True)
