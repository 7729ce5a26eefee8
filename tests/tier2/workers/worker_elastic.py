"""Tier-2 elastic worker: a small deterministic training loop on ``ddl.runtime.elastic.ObjectState``.

Run by tests/tier2/test_elastic_hosts.py under ``ddlrun --elastic`` on emulated hosts. Each
step averages one vector per rank (a function of the step and the rank, as a data shard
would be) into the weights; ``STEP`` lines carry the wall time, so the test can time a
recovery from the moment it killed a host. ``--join-step N`` holds the ranks at step N
until ddlrun has announced the new hosts, so a join happens at the same commit in every
run. ``--fail-step N`` raises an error of the program on rank 0 at step N.
"""

import argparse
import hashlib
import time

import numpy as np

import ddl
from ddl.runtime import elastic

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--commit-every", type=int, default=5)
parser.add_argument("--step-seconds", type=float, default=0.1)
parser.add_argument("--join-step", type=int, default=0)
parser.add_argument("--fail-step", type=int, default=0)
parser.add_argument("--size", type=int, default=4096)
args = parser.parse_args()

ddl.init()
state = elastic.ObjectState(step=0, weights=np.zeros(args.size, np.float32))
print(f"WORLD {elastic.world_number()} rank={ddl.rank()} size={ddl.size()} t={time.time():.3f}", flush=True)


def contribution(step: int, rank: int) -> np.ndarray:
    return np.random.default_rng(step * 1000 + rank).standard_normal(args.size).astype(np.float32)


@elastic.run
def train(state: elastic.ObjectState) -> np.ndarray:
    while state.step < args.steps:
        if args.fail_step and state.step == args.fail_step and ddl.rank() == 0:
            raise ValueError(f"an error of the program at step {state.step}")
        grad = ddl.allreduce(contribution(state.step, ddl.rank()), name="grad")
        state.weights = state.weights - np.float32(0.1) * grad
        state.step += 1
        print(f"STEP {state.step} world={elastic.world_number()} size={ddl.size()} rank={ddl.rank()} "
              f"t={time.time():.3f}", flush=True)
        if state.step % args.commit_every == 0:
            if state.step == args.join_step:
                deadline = time.monotonic() + 120
                while not elastic.updates_pending() and time.monotonic() < deadline:
                    time.sleep(0.05)
            state.commit()
        time.sleep(args.step_seconds)
    return state.weights


weights = train(state)
digest = hashlib.sha256(weights.tobytes()).hexdigest()[:16]
print(f"DONE rank={ddl.rank()} size={ddl.size()} world={elastic.world_number()} step={state.step} "
      f"digest={digest}", flush=True)
