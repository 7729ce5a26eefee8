"""Tier 2: ddl-caffe under a real mpiexec: 2 ranks x batch b == 1 rank with iter_size 2; digits LeNet accuracy."""

from __future__ import annotations

import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("lmdb")
pytest.importorskip("sklearn")

from ddl.caffe.command import cli  # noqa: E402
from ddl.caffe.data import convert  # noqa: E402
from ddl.caffe.formats import protofile, schema  # noqa: E402
from ddl.caffe.net.net import Net  # noqa: E402

pytestmark = pytest.mark.mpi
ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).parent / "workers" / "worker_caffe.py"
NET = """
name: "equiv"
layer { name: "d" type: "Data" top: "data" top: "label" transform_param { scale: 0.01 } data_param { source: "SRC" batch_size: 4 backend: LMDB } }
layer { name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "xavier" } } }
layer { name: "r" type: "ReLU" bottom: "c" top: "c" }
layer { name: "p" type: "Pooling" bottom: "c" top: "p" pooling_param { pool: AVE kernel_size: 3 stride: 2 } }
layer { name: "ip" type: "InnerProduct" bottom: "p" top: "ip" inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


def _weights(path: Path) -> list[np.ndarray]:
    m = protofile.read_binary(path, schema.NetParameter())
    return [np.asarray(b.data, np.float32) for lp in m.layer for b in lp.blobs]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """Prepare both experiments, then train both on 2 ranks in one mpiexec job."""
    tmp = tmp_path_factory.mktemp("caffe_mpi")
    rng = np.random.default_rng(0)
    convert.from_arrays(tmp / "db", rng.integers(0, 255, (24, 2, 7, 7)).astype(np.uint8), rng.integers(0, 3, 24))
    (tmp / "net.prototxt").write_text(NET.replace("SRC", str(tmp / "db")))
    common = (f'net: "{tmp / "net.prototxt"}" base_lr: 0.05 momentum: 0.9 weight_decay: 0.001 lr_policy: "step" '
              f'gamma: 0.5 stepsize: 3 max_iter: 8 display: 4 random_seed: 7 type: "Nesterov" ')
    (tmp / "two.prototxt").write_text(common + f'snapshot_prefix: "{tmp / "two"}"')
    (tmp / "one.prototxt").write_text(common + f'iter_size: 2 snapshot_prefix: "{tmp / "one"}"')

    argv = sys.argv
    sys.argv = ["make_digits.py", str(tmp)]
    try:
        runpy.run_path(str(ROOT / "examples/caffe/make_digits.py"), run_name="__main__")
    finally:
        sys.argv = argv
    for part in ("train", "test"):
        convert.from_npz(tmp / f"digits_{part}_lmdb", tmp / f"digits_{part}.npz")
    net = (ROOT / "examples/caffe/digits_lenet.prototxt").read_text().replace("examples/caffe/data", str(tmp))
    (tmp / "lenet.prototxt").write_text(net)
    solver = (ROOT / "examples/caffe/digits_solver.prototxt").read_text()
    solver = solver.replace("examples/caffe/digits_lenet.prototxt", str(tmp / "lenet.prototxt"))
    solver = solver.replace("test_interval: 100", "test_interval: 500 test_initialization: false")
    (tmp / "digits1.prototxt").write_text(solver.replace("examples/caffe/out", str(tmp / "r1")))
    (tmp / "digits2.prototxt").write_text(solver.replace("examples/caffe/out", str(tmp / "r2")))

    cmd = [sys.executable, "-m", "ddl.launcher.cli", "-np", "2", sys.executable, str(WORKER),
           str(tmp / "two.prototxt"), str(tmp / "digits2.prototxt")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ), cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return tmp, proc.stderr + proc.stdout


def test_two_ranks_equal_one_rank_with_iter_size_two(runs: tuple[Path, str]) -> None:
    tmp, log2 = runs
    assert log2.count("Optimization Done.") == 2 and "Using 2 rank(s) of ddl (topology 2, algorithm multiring)" in log2
    assert cli.main(["train", "--solver", str(tmp / "one.prototxt")]) == 0
    two, one = _weights(tmp / "two_iter_8.caffemodel"), _weights(tmp / "one_iter_8.caffemodel")
    sp = protofile.read_solver(tmp / "one.prototxt")
    init = Net(protofile.read_net(tmp / "net.prototxt"), schema.TRAIN, gen=torch.Generator().manual_seed(sp.random_seed), quiet=True)
    start = [p.tensor.detach().numpy().ravel() for p in init.params]
    assert max(float(np.abs(a - b).max()) for a, b in zip(one, start, strict=True)) > 1e-2   # training moved them
    # Same 8 samples per step, same averaged gradient; only float32 summation order differs.
    for a, b in zip(two, one, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_digits_lenet_reaches_93_percent_at_one_and_two_ranks(runs: tuple[Path, str], capsys: pytest.CaptureFixture[str]) -> None:
    tmp, log2 = runs
    acc2 = [float(a) for a in re.findall(r"Test net output #0: accuracy = ([\d.]+)", log2)]
    assert acc2 and acc2[-1] >= 0.93, log2[-2000:]
    assert re.search(r"ddl-caffe: 2 ranks, [\d.]+ ms per iteration", log2)
    threads = torch.get_num_threads()
    try:
        assert cli.main(["train", "--solver", str(tmp / "digits1.prototxt"), "--threads", "1"]) == 0
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().err
    acc1 = [float(a) for a in re.findall(r"Test net output #0: accuracy = ([\d.]+)", out)]
    assert acc1 and acc1[-1] >= 0.93, out[-2000:]
