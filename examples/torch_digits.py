"""Train a small CNN on scikit-learn's digits with ddl.torch: ddlrun -np 2 python examples/torch_digits.py

The digits data set (1797 8x8 images) ships inside the scikit-learn wheel, so nothing is
downloaded. The changes from a single-process script are the ones marked "ddl:".
"""

import argparse
import math
import time

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import ddl.torch as dt

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--epochs", type=int, default=12)
parser.add_argument("--batch-size", type=int, default=32, help="per rank")
parser.add_argument("--lr", type=float, default=0.05, help="for one rank; scaled by the world size")
parser.add_argument("--warmup-epochs", type=float, default=2.0)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--fp16-allreduce", action="store_true", help="send gradients as float16")
args = parser.parse_args()

dt.init()  # ddl: one process per rank, started by ddlrun
torch.set_num_threads(1)  # one core per rank: ranks share the machine
torch.manual_seed(args.seed)
log = print if dt.rank() == 0 else (lambda *a, **k: None)

# Data: the same split on every rank; each rank trains on its shard of the training set.
digits = load_digits()
images = torch.tensor(digits.images / 16.0, dtype=torch.float32).unsqueeze(1)
labels = torch.tensor(digits.target, dtype=torch.int64)
order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(1234))
test_idx, train_idx = order[:360], order[360:]
train_set = TensorDataset(images[train_idx], labels[train_idx])
test_set = TensorDataset(images[test_idx], labels[test_idx])
sampler = DistributedSampler(train_set, num_replicas=dt.size(), rank=dt.rank(), shuffle=True, seed=args.seed)  # ddl
train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
test_sampler = DistributedSampler(test_set, num_replicas=dt.size(), rank=dt.rank(), shuffle=False)
test_loader = DataLoader(test_set, batch_size=120, sampler=test_sampler)

model = nn.Sequential(
    nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
    nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
    nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 10),
)
lr = args.lr * dt.size()  # ddl: the global batch grows with the ranks, so does the step
optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)
compression = dt.Compression.fp16 if args.fp16_allreduce else dt.Compression.none
optimizer = dt.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),  # ddl
                                    compression=compression)
dt.broadcast_parameters(model.state_dict(), root_rank=0)  # ddl: every rank starts from rank 0's weights
dt.broadcast_optimizer_state(optimizer, root_rank=0)  # ddl

steps_per_epoch = len(train_loader)
total, warmup = args.epochs * steps_per_epoch, args.warmup_epochs * steps_per_epoch


def lr_factor(step: int) -> float:
    """Linear warm-up from lr/size (large-batch training), then cosine decay to zero."""
    if step < warmup:
        return (1 + step * (dt.size() - 1) / warmup) / dt.size()
    return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)


def evaluate() -> float:
    model.eval()
    correct = torch.zeros(2, dtype=torch.float64)  # correct, seen
    with torch.no_grad():
        for x, y in test_loader:
            correct += torch.tensor([(model(x).argmax(1) == y).sum().item(), len(y)], dtype=torch.float64)
    model.train()
    correct = dt.allreduce(correct, op=dt.Sum, name="test.correct")  # ddl: sum over the shards
    return float(correct[0] / correct[1])


log(f"ddl.torch digits: {dt.size()} rank(s), {len(train_set)} train / {len(test_set)} test images, "
    f"{sum(p.numel() for p in model.parameters())} parameters, global batch {args.batch_size * dt.size()}, lr {lr:g}")
start = time.perf_counter()
for epoch in range(args.epochs):
    sampler.set_epoch(epoch)  # ddl: a new shuffle each epoch, the same on every rank
    losses = []
    for x, y in train_loader:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
    mean_loss = float(dt.allreduce(torch.tensor(np.mean(losses)), name="train.loss"))
    done = (epoch + 1) / args.epochs
    bar = "#" * int(20 * done) + "-" * (20 - int(20 * done))
    log(f"epoch {epoch + 1:2d}/{args.epochs} [{bar}] loss {mean_loss:.4f}  test acc {evaluate():.4f}  "
        f"{time.perf_counter() - start:5.1f} s", flush=True)

accuracy = evaluate()
log(f"final test accuracy {accuracy:.4f} ({accuracy * 100:.1f} %) after {time.perf_counter() - start:.1f} s "
    f"on {dt.size()} rank(s)")
dt.shutdown()
