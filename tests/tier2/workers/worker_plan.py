"""Tier-2 worker: a 2-rank ddl.torch step whose buckets and algorithms ``ddl plan`` must predict.

Six parameters of different sizes (each at least 1 MiB: their buckets run on their own,
whatever the timing) and a small one declared and used last (its gradient lands first and
fills the small first bucket alone: nothing to fuse with, too large to ride inline), used in
forward in an order of their own (not their declaration's), so ddl.torch re-plans its
buckets in the observed order after the first step. Each rank names itself a host of its
own (``DDL_HOSTNAME``), so the world is 2 hosts x 1 rank and ``auto`` chooses among
algorithms that differ by size (on one host shared memory wins every size). Three steps; rank 0 prints ``PLAN {json}``: the sizes, the order ddl.torch
agreed on, and the members of its buckets in the first and the last step. The engine's
timeline (``ddlrun --timeline``) holds what each allreduce carried and which algorithm ran it.
"""

import json
import os

import torch

import ddl.torch as dt

SIZES = [300_000, 262_144, 400_000, 262_144, 600_000, 270_000, 2000]
USED = [2, 5, 0, 3, 1, 4, 6]  # the forward's order: gradients land in its reverse

os.environ["DDL_HOSTNAME"] = f"host{os.environ['PMI_RANK']}"  # two hosts of one rank each
dt.init()
params = [torch.nn.Parameter(torch.full((n,), 0.01 * (i + 1))) for i, n in enumerate(SIZES)]
opt = dt.DistributedOptimizer(torch.optim.SGD(params, lr=0.1), named_parameters=[(f"p{i}", p) for i, p in
                                                                                enumerate(params)],
                              bucket_cap_mb=2.5)
index = {p: i for i, p in enumerate(params)}
first = [[index[p] for p in b.params] for b in opt._reducer.buckets]
first_names = [b.name for b in opt._reducer.buckets]
for step in range(3):
    opt.zero_grad()
    loss = sum((params[i] * (dt.rank() + step + 1)).square().sum() for i in USED)
    loss.backward()
    opt.step()
last = [[index[p] for p in b.params] for b in opt._reducer.buckets]
if dt.rank() == 0:
    print("PLAN " + json.dumps({"sizes": SIZES, "order": opt.gradient_order(), "first": first, "last": last,
                                "first_names": first_names, "last_names": [b.name for b in opt._reducer.buckets],
                                "size": dt.size()}), flush=True)
dt.shutdown()
