"""Elastic training of the digits CNN with ddl.torch: a lost host costs the steps since the last commit.

    ddlrun --elastic --min-np 2 --max-np 3 --host-discovery-script examples/elastic/discover_hosts.sh \
        python examples/elastic/torch_digits.py

The differences from examples/torch_digits.py are marked "elastic:". Everything that must
survive a change of hosts lives in the TorchState (model, optimizer, sampler, step); each
`state.commit()` keeps it in memory and on every host's tmpfs, and the next world resumes
from the newest commit a surviving host holds. Step counts, not epochs, bound the run, so
that a run with a host lost and one added does exactly as many steps as one without.
"""

import argparse
import hashlib
import time

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import ddl.torch as dt
import ddl.torch.elastic as elastic
from ddl.runtime.elastic import wait_for_host_updates

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=150)
parser.add_argument("--batch-size", type=int, default=32, help="per rank")
parser.add_argument("--lr", type=float, default=0.05, help="for one rank; scaled by the world size")
parser.add_argument("--commit-every", type=int, default=5, help="steps between commits")
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--step-seconds", type=float, default=0.0, help="sleep after each step (a slower model)")
parser.add_argument("--wait-for-hosts-at", type=int, default=0, metavar="STEP",
                    help="in a world smaller than the first, hold at this step until ddlrun announces new hosts "
                         "(demos and tests: a join at a chosen step)")
args = parser.parse_args()

dt.init()
torch.set_num_threads(1)  # one core per rank: ranks share the machine
log = print if dt.rank() == 0 else (lambda *a, **k: None)

digits = load_digits()
images = torch.tensor(digits.images / 16.0, dtype=torch.float32).unsqueeze(1)
labels = torch.tensor(digits.target, dtype=torch.int64)
order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(1234))
test_idx, train_idx = order[:360], order[360:]
train_set = TensorDataset(images[train_idx], labels[train_idx])
test_set = TensorDataset(images[test_idx], labels[test_idx])
# elastic: deals what is left of the epoch over whatever world there is (no sample twice)
sampler = elastic.ElasticSampler(train_set, shuffle=True, seed=args.seed, batch_size=args.batch_size)
train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)

torch.manual_seed(args.seed)  # the same initial weights on every rank (sync makes sure anyway)
model = nn.Sequential(
    nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
    nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
    nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 10),
)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * dt.size(), momentum=0.9, weight_decay=1e-4)
optimizer = dt.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

# elastic: the state that travels from world to world, and what to redo when the world changes
state = elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler, epoch=0, step=0, first_size=dt.size())


def scale_learning_rate() -> None:
    """The global batch is batch-size x world size: scale the step with it (linear scaling rule)."""
    for group in optimizer.param_groups:
        group["lr"] = args.lr * dt.size()
    log(f"world {elastic.world_number()}: {dt.size()} rank(s), lr {args.lr * dt.size():g}, "
        f"resuming at step {state.step}", flush=True)


state.register_reset_callbacks([scale_learning_rate])


@elastic.run  # elastic: syncs the newest commit, runs the reset callbacks, leaves for the next world
def train(state: elastic.TorchState) -> None:
    while state.step < args.steps:
        for batch_idx, (x, y) in enumerate(train_loader):
            # Dropout draws depend on (step, rank) only: a resumed run draws what an uninterrupted one would.
            torch.manual_seed(args.seed * 1_000_003 + state.step * 1009 + dt.rank())
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            state.sampler.record_batch(batch_idx, args.batch_size)  # elastic: what the world has seen
            state.step += 1
            log(f"step {state.step:4d} world {elastic.world_number()} size {dt.size()} loss {loss.item():.4f} "
                f"t={time.time():.3f}", flush=True)
            if args.step_seconds:
                time.sleep(args.step_seconds)
            if state.step % args.commit_every == 0:
                if state.step == args.wait_for_hosts_at and dt.size() < state.first_size:
                    wait_for_host_updates(120)  # a demo's hold, until ddlrun announces the returning host
                state.commit()  # elastic: a lost host costs at most the steps since here
            if state.step >= args.steps:
                break
        else:  # the epoch is done: the next one has a new order
            state.epoch += 1
            state.sampler.set_epoch(state.epoch)


train(state)

# Test accuracy (each rank scores its shard of the test set) and a digest of the weights,
# which every rank prints: they are the same bits everywhere.
model.eval()
test_loader = DataLoader(test_set, batch_size=120,
                         sampler=DistributedSampler(test_set, num_replicas=dt.size(), rank=dt.rank(), shuffle=False))
correct = torch.zeros(2, dtype=torch.float64)
with torch.no_grad():
    for x, y in test_loader:
        correct += torch.tensor([(model(x).argmax(1) == y).sum().item(), len(y)], dtype=torch.float64)
correct = dt.allreduce(correct, op=dt.Sum, name="test.correct")
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()[:16]
print(f"final rank {dt.rank()} of {dt.size()}: step {state.step}, test accuracy {float(correct[0] / correct[1]):.4f}, "
      f"weights {digest}", flush=True)
dt.shutdown()
