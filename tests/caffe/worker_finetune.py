"""Fine-tunes a Caffe model loaded with ddl.caffe.load under ddl.torch.DistributedOptimizer; each rank takes its shard
of a fixed batch and saves its final weights (run by tests/tier2/test_caffe_finetune.py under ddlrun)."""

import sys
from pathlib import Path

import torch

import ddl.caffe
import ddl.torch as dt

proto, weights, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
dt.init()
torch.set_num_threads(1)
rank, size = dt.rank(), dt.size()
model = ddl.caffe.load(proto, weights)           # eval mode: BatchNorm uses its stored statistics
params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
opt = dt.DistributedOptimizer(torch.optim.SGD([p for _, p in params], lr=0.05, momentum=0.9), named_parameters=params)
dt.broadcast_parameters(model.state_dict(), root_rank=0)
g = torch.Generator().manual_seed(0)
x_all, y_all = torch.randn(4, 3, 12, 12, generator=g), torch.tensor([1, 3, 0, 2])
n = 4 // size
x, y = x_all[rank * n:(rank + 1) * n], y_all[rank * n:(rank + 1) * n]
for _ in range(5):
    opt.zero_grad()
    loss = torch.nn.functional.nll_loss(torch.log(model(x)), y)
    loss.backward()
    opt.step()
torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, out / f"rank{rank}_of{size}.pt")
