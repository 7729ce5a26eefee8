"""Tier-2 worker for emulated Kubernetes pods: N ranks train like one process, every rank alike.

``numpy``: softmax regression, each rank's gradient on its 48/N rows of every global batch,
averaged by ``ddl.allreduce``; ``torch``: a small MLP through ``ddl.torch.DistributedOptimizer``.
Every rank also trains the one-process reference (all 48 rows) and prints
``EQUIV <mode> ranks=N max_abs_diff=D identical=yes|no digest=...``; a rank whose weights
differ from the others' raises (and ddl's abort hook ends the job).
"""

import hashlib
import os
import socket
import sys

import numpy as np

import ddl

MODE = sys.argv[1] if len(sys.argv) > 1 else "numpy"
BATCH, FEATURES, CLASSES, STEPS, LR = 48, 8, 3, 20, 0.5


def data(step: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(step)
    x = rng.standard_normal((BATCH, FEATURES)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1).astype(np.int64)
    return x, y


def softmax_grad(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    logits = x @ w
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(y)), y] -= 1
    return (x.T @ p / len(y)).astype(np.float32)


def train_numpy(rank: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    w = np.zeros((FEATURES, CLASSES), np.float32)
    ref = w.copy()
    rows = BATCH // size
    for step in range(STEPS):
        x, y = data(step)
        mine = slice(rank * rows, (rank + 1) * rows)
        w -= LR * ddl.allreduce(softmax_grad(w, x[mine], y[mine]), op=ddl.Average, name="grad")
        ref -= LR * softmax_grad(ref, x, y)
    return w, ref


def train_torch(rank: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    import torch

    import ddl.torch as dt

    torch.set_num_threads(1)

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(), torch.nn.Linear(16, CLASSES))

    net, ref = model(), model()
    opt = dt.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9),
                                  named_parameters=net.named_parameters())
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    dt.broadcast_parameters(net.state_dict(), root_rank=0)
    rows = BATCH // size
    for step in range(STEPS):
        x, y = (torch.from_numpy(a) for a in data(step))
        mine = slice(rank * rows, (rank + 1) * rows)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x[mine]), y[mine]).backward()
        opt.step()
        ref_opt.zero_grad()
        torch.nn.functional.cross_entropy(ref(x), y).backward()
        ref_opt.step()

    def flat(m: torch.nn.Module) -> np.ndarray:
        return np.concatenate([p.detach().numpy().ravel() for p in m.parameters()])

    return flat(net), flat(ref)


ddl.init()
r, n = ddl.rank(), ddl.size()
print(f"RANK {r}/{n} host={socket.gethostname()} cross={ddl.cross_rank()}/{ddl.cross_size()} "
      f"node_rank={os.environ.get('PET_NODE_RANK', '-')}", flush=True)
assert BATCH % n == 0, f"{n} ranks do not split a batch of {BATCH}"
weights, reference = train_torch(r, n) if MODE == "torch" else train_numpy(r, n)
digest = hashlib.sha256(np.ascontiguousarray(weights).tobytes()).hexdigest()[:16]
identical = len(set(ddl.allgather_object(digest))) == 1
diff = float(np.abs(weights - reference).max())
print(f"EQUIV {MODE} ranks={n} max_abs_diff={diff:.3g} identical={'yes' if identical else 'no'} digest={digest}",
      flush=True)
assert identical, f"rank {r}: weights differ between ranks"
assert diff <= 1e-6, f"rank {r}: {diff} from the one-process weights"
ddl.shutdown()
