"""Tier-2 elastic worker: a small exact training loop on ``ddl.runtime.elastic.ObjectState``.

Run by tests/tier2/test_elastic_hosts.py under ``ddlrun --elastic`` on emulated hosts.
Each step sums one vector per rank (small integers, a function of the step and the rank,
as a data shard would be) into the weights: float32 sums of small integers are exact in
any order, so the test can compute the final weights from which world size ran each step
and compare them to the bit. ``STEP`` lines carry the wall time, so the test can time a
recovery from the moment it broke a host. ``--join-step N`` holds the ranks at step N
until ddlrun has announced new hosts (once: a join at the same commit in every run);
``--fail-step N`` raises an error of the program on rank 0; ``--internal-error-step N``
makes rank 0 raise ``HorovodInternalError`` at step N of the first world (as a program
that found a collective broken would); every rank prints ``INTERNAL`` when a collective
raises ``HorovodInternalError`` (ddl's, when a host of the world is lost); ``--die-in-commit N`` makes
the host named by ``--die-on`` crash (its agent and this rank, SIGKILL) half-way through
writing commit N.
"""

import argparse
import hashlib
import os
import signal
import socket
import time

import numpy as np

import ddl
from ddl.runtime import elastic
from ddl.runtime.elastic import store as elastic_store

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--commit-every", type=int, default=5)
parser.add_argument("--step-seconds", type=float, default=0.1)
parser.add_argument("--join-step", type=int, default=0)
parser.add_argument("--fail-step", type=int, default=0)
parser.add_argument("--internal-error-step", type=int, default=0)
parser.add_argument("--die-in-commit", type=int, default=0)
parser.add_argument("--die-on", default="")
parser.add_argument("--size", type=int, default=4096)
args = parser.parse_args()

ddl.init()
state = elastic.ObjectState(step=0, weights=np.zeros(args.size, np.float32), held=False)
print(f"WORLD {elastic.world_number()} rank={ddl.rank()} size={ddl.size()} host={socket.gethostname()} "
      f"t={time.time():.3f}", flush=True)


def contribution(step: int, rank: int) -> np.ndarray:
    return np.random.default_rng(step * 1000 + rank).integers(-8, 9, args.size).astype(np.float32)


def crash_in_the_middle_of_writing(self: elastic_store.CommitStore, serial: int, payload: bytes) -> None:
    self.folder.mkdir(parents=True, exist_ok=True)
    with open(self.folder / f".state.bin.{os.getpid()}", "wb") as f:
        f.write(payload[: len(payload) // 2])
        f.flush()
    print(f"CRASH host={socket.gethostname()} inside commit {serial} t={time.time():.3f}", flush=True)
    os.kill(os.getppid(), signal.SIGKILL)  # the host's agent (this rank is its fork) ...
    os.kill(os.getpid(), signal.SIGKILL)  # ... and this rank: the host is gone


@elastic.run
def train(state: elastic.ObjectState) -> np.ndarray:
    while state.step < args.steps:
        if args.fail_step and state.step == args.fail_step and ddl.rank() == 0:
            raise ValueError(f"an error of the program at step {state.step}")
        if args.internal_error_step and state.step == args.internal_error_step and elastic.world_number() == 1 \
                and ddl.rank() == 0:
            print(f"RAISE HorovodInternalError step={state.step} t={time.time():.3f}", flush=True)
            raise ddl.HorovodInternalError(f"the program raised it at step {state.step}")
        try:
            grad = ddl.allreduce(contribution(state.step, ddl.rank()), op=ddl.Sum, name="grad")
        except ddl.HorovodInternalError as exc:
            print(f"INTERNAL rank={ddl.rank()} world={elastic.world_number()} t={time.time():.3f}: {exc}", flush=True)
            raise
        state.weights = state.weights - grad
        state.step += 1
        print(f"STEP {state.step} world={elastic.world_number()} size={ddl.size()} rank={ddl.rank()} "
              f"t={time.time():.3f}", flush=True)
        if state.step % args.commit_every == 0:
            if state.step == args.join_step and not state.held:
                elastic.wait_for_host_updates(120)
                state.held = True  # committed with this commit: the next world does not hold again
            if state.step == args.die_in_commit and socket.gethostname() == args.die_on:
                elastic_store.CommitStore.write = crash_in_the_middle_of_writing  # type: ignore[method-assign]
            state.commit()
        time.sleep(args.step_seconds)
    return state.weights


weights = train(state)
digest = hashlib.sha256(weights.tobytes()).hexdigest()[:16]
print(f"DONE rank={ddl.rank()} size={ddl.size()} world={elastic.world_number()} step={state.step} "
      f"digest={digest}", flush=True)
