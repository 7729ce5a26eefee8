"""Tier 2: a Caffe model loaded with ddl.caffe.load, fine-tuned on 2 ranks under ddl.torch.DistributedOptimizer,
ends with the weights of 1 process on the whole batch, and both ranks hold the same weights."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from ddl.caffe.formats import protofile, schema  # noqa: E402
from ddl.caffe.net.net import Net  # noqa: E402

pytestmark = pytest.mark.mpi
ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "caffe" / "worker_finetune.py"
DEPLOY = """
name: "mini"
input: "data"
input_shape { dim: 2 dim: 3 dim: 12 dim: 12 }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1" convolution_param { num_output: 8 kernel_size: 3 stride: 2 weight_filler { type: "xavier" } } }
layer { name: "bn1" type: "BatchNorm" bottom: "conv1" top: "conv1" }
layer { name: "sc1" type: "Scale" bottom: "conv1" top: "conv1" scale_param { bias_term: true } }
layer { name: "relu1" type: "PReLU" bottom: "conv1" top: "conv1" }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "fc" type: "InnerProduct" bottom: "pool1" top: "fc" inner_product_param { num_output: 5 weight_filler { type: "xavier" } } }
layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }
"""


def test_fine_tuning_on_two_ranks_equals_one_process(tmp_path: Path) -> None:
    proto = tmp_path / "deploy.prototxt"
    proto.write_text(DEPLOY)
    net = Net(protofile.read_net(proto), schema.TEST, quiet=True)
    with torch.no_grad():
        bn = net.layer_by_name("bn1")
        assert bn is not None
        bn.blobs[0].fill_(0.2)
        bn.blobs[1].fill_(2.0)
        bn.blobs[2].fill_(1.0)
    net.save(tmp_path / "mini.caffemodel")
    launch = [sys.executable, "-m", "ddl.launcher.cli"]
    for np_ in ("2", "1"):
        proc = subprocess.run(launch + ["-np", np_, sys.executable, str(WORKER), str(proto), str(tmp_path / "mini.caffemodel"), str(tmp_path)],
                              capture_output=True, text=True, timeout=300, env=dict(os.environ), cwd=ROOT)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    r0, r1, one = (torch.load(tmp_path / f) for f in ("rank0_of2.pt", "rank1_of2.pt", "rank0_of1.pt"))
    start = {k: v for k, v in zip(["conv1.weight"], [net.layer_by_name("conv1").blobs[0].detach()], strict=True)}   # type: ignore[union-attr]
    assert float((r0["conv1.weight"] - start["conv1.weight"]).abs().max()) > 1e-3      # training moved them
    for k in r0:
        assert torch.equal(r0[k], r1[k]), k                                           # identical on every rank
        torch.testing.assert_close(r0[k], one[k], rtol=1e-4, atol=1e-6)               # = one process, whole batch
