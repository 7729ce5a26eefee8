"""The chaos run's training program: softmax regression in float64 under ``ddlrun --elastic``, and its one-process replay.

Each step takes a global batch fixed by the step number alone (``GLOBAL_BATCH`` samples of a
synthetic set), deals it over the world's ranks, sums each rank's gradient and allreduces
the sums: whatever the world size, step ``s`` applies the gradient of the same samples, so
:func:`replay` (one process, the same steps with the same world sizes) must end with the
same weights to float rounding. Rank 0 prints ``STEP s world w size n t=...`` lines; every
rank ends with ``FINAL rank r size n step s digest D`` and rank 0 saves its weights, with
the world size that ran each step (kept in the committed state), to ``--out`` (``.npz``). The job runs until the file ``<control>/finish`` exists (read by rank 0 at a
commit, agreed by a broadcast), so the chaos driver decides how long it lasts.

Fault hooks (files in ``--control``, named by host; each is removed when acted on):
``crash-in-commit-<host>`` (the host dies half-way through writing a commit: its agent and
rank are SIGKILLed), ``exit-<host>`` (the rank leaves mid-step with the status the file
holds: a lost rank). Each rank writes its pid to ``pid-<host>`` (the driver stops it alone).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import socket
import sys
import time
from pathlib import Path

import numpy as np

import ddl  # at the top: the elastic agents preload what the program imports there
from ddl.runtime import elastic
from ddl.runtime.elastic import store as elastic_store

FEATURES, CLASSES, SAMPLES, GLOBAL_BATCH = 32, 8, 4096, 24
LEARNING_RATE = 0.5


def dataset(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A synthetic classification set (features, labels), the same in every process."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, 1.0, (CLASSES, FEATURES))
    labels = rng.integers(0, CLASSES, SAMPLES)
    features = centres[labels] + rng.normal(0.0, 1.5, (SAMPLES, FEATURES))
    return features, labels


def batch(step: int, seed: int) -> np.ndarray:
    """The global batch of ``step`` (1-based): sample indices fixed by the step alone."""
    return np.random.default_rng([seed, step]).choice(SAMPLES, GLOBAL_BATCH, replace=False)


def gradient_sum(weights: np.ndarray, features: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The summed cross-entropy gradient of these samples (weights: FEATURES+1 rows, the bias last)."""
    x = np.hstack([features, np.ones((len(features), 1))])
    logits = x @ weights
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(labels)), labels] -= 1.0
    return x.T @ p


def share(indices: np.ndarray, rank: int, size: int) -> np.ndarray:
    return indices[rank::size]


def apply(weights: np.ndarray, summed: np.ndarray) -> np.ndarray:
    return weights - LEARNING_RATE * summed / GLOBAL_BATCH


def initial_weights() -> np.ndarray:
    return np.zeros((FEATURES + 1, CLASSES), np.float64)


def replay(sizes: list[int], seed: int) -> np.ndarray:
    """One process over steps 1..len(sizes), step ``s`` dealt over ``sizes[s - 1]`` ranks, summed in rank order."""
    features, labels = dataset(seed)
    weights = initial_weights()
    for step, size in enumerate(sizes, 1):
        indices = batch(step, seed)
        parts = [gradient_sum(weights, features[mine], labels[mine])
                 for mine in (share(indices, r, size) for r in range(size))]
        weights = apply(weights, np.sum(parts, axis=0))
    return weights


def digest(weights: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(weights).tobytes()).hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--control", required=True, help="the driver's folder of fault and finish files")
    parser.add_argument("--out", required=True, help="rank 0 saves its final weights and sizes here (.npz)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--commit-every", type=int, default=5)
    parser.add_argument("--step-seconds", type=float, default=0.1, help="compute time of a step")
    parser.add_argument("--max-steps", type=int, default=100000)
    args = parser.parse_args()
    control, host = Path(args.control), socket.gethostname()
    ddl.init()
    (control / f"pid-{host}").write_text(str(os.getpid()))
    features, labels = dataset(args.seed)
    # sizes: the world size that ran each committed step, carried with the state (the replay's schedule).
    state = elastic.ObjectState(step=0, weights=initial_weights(), sizes=[])

    original_write = elastic_store.CommitStore.write

    def write(self: elastic_store.CommitStore, serial: int, payload: bytes) -> None:
        crash = control / f"crash-in-commit-{host}"
        if crash.exists():
            crash.unlink(missing_ok=True)
            self.folder.mkdir(parents=True, exist_ok=True)
            with open(self.folder / f".state.bin.{os.getpid()}", "wb") as f:
                f.write(payload[: len(payload) // 2])
                f.flush()
            print(f"CRASH host={host} inside commit {serial} t={time.time():.3f}", flush=True)
            os.kill(os.getppid(), signal.SIGKILL)  # the host's agent (this rank is its fork) ...
            os.kill(os.getpid(), signal.SIGKILL)  # ... and this rank: the host is gone
        original_write(self, serial, payload)

    elastic_store.CommitStore.write = write  # type: ignore[method-assign]

    @elastic.run
    def train(state: elastic.ObjectState) -> None:
        rank, size, world = ddl.rank(), ddl.size(), elastic.world_number()
        while state.step < args.max_steps:
            leave = control / f"exit-{host}"
            if leave.exists():
                code = int(leave.read_text() or "0")
                leave.unlink(missing_ok=True)
                print(f"EXIT host={host} rank={rank} status={code} t={time.time():.3f}", flush=True)
                sys.exit(code)
            step = state.step + 1
            mine = share(batch(step, args.seed), rank, size)
            time.sleep(args.step_seconds)
            local = gradient_sum(state.weights, features[mine], labels[mine])
            summed = ddl.allreduce(local, op=ddl.Sum, name="chaos.grad")
            state.weights = apply(state.weights, summed)
            state.step = step
            state.sizes = [*state.sizes, size]
            if rank == 0:
                print(f"STEP {step} world {world} size {size} t={time.time():.3f}", flush=True)
            if step % args.commit_every == 0:
                state.commit()
                finish = (control / "finish").exists() if rank == 0 else False
                if ddl.broadcast_object(finish, 0, name="chaos.finish"):
                    return

    train(state)
    print(f"FINAL rank {ddl.rank()} size {ddl.size()} step {state.step} digest {digest(state.weights)}", flush=True)
    if ddl.rank() == 0:
        with open(args.out, "wb") as f:
            np.savez(f, weights=state.weights, sizes=np.asarray(state.sizes, np.int64))
    ddl.shutdown()


if __name__ == "__main__":
    main()
