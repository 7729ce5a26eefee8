"""Tier 2: N ranks of ddl-caffe's solver == one process at the global batch (LeNet and CIFAR-10 quick, 2 and 3 ranks,
layer_wise_reduce true and false, iter_size 1 and 2), to 1e-6 and with the same weights on every rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("lmdb")

from ddl.caffe.data import convert  # noqa: E402
from ddl.caffe.formats import protofile  # noqa: E402
from ddl.caffe.solver.solver import Solver  # noqa: E402

pytestmark = pytest.mark.mpi
ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).parent / "workers" / "worker_caffe_equivalence.py"
GLOBAL_BATCH = 12                 # divides over 2 and 3 ranks
ITERATIONS = 4
TOLERANCE = 1e-6

# BVLC's examples/mnist/lenet_train_test.prototxt and examples/cifar10/cifar10_quick_train_test.prototxt (train part),
# with local random LMDBs; their solvers' update rules (lenet_solver: SGD, inv; cifar10_quick_solver: SGD, fixed).
LENET = """name: "LeNet"
layer { name: "mnist" type: "Data" top: "data" top: "label" transform_param { scale: 0.00390625 }
        data_param { source: "SRC" batch_size: BATCH backend: LMDB } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1" param { lr_mult: 1 } param { lr_mult: 2 }
        convolution_param { num_output: 20 kernel_size: 5 stride: 1 weight_filler { type: "xavier" } bias_filler { type: "constant" } } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2" param { lr_mult: 1 } param { lr_mult: 2 }
        convolution_param { num_output: 50 kernel_size: 5 stride: 1 weight_filler { type: "xavier" } bias_filler { type: "constant" } } }
layer { name: "pool2" type: "Pooling" bottom: "conv2" top: "pool2" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool2" top: "ip1" param { lr_mult: 1 } param { lr_mult: 2 }
        inner_product_param { num_output: 500 weight_filler { type: "xavier" } bias_filler { type: "constant" } } }
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2" param { lr_mult: 1 } param { lr_mult: 2 }
        inner_product_param { num_output: 10 weight_filler { type: "xavier" } bias_filler { type: "constant" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""
CIFAR = """name: "CIFAR10_quick"
layer { name: "cifar" type: "Data" top: "data" top: "label" transform_param { scale: 0.00390625 }
        data_param { source: "SRC" batch_size: BATCH backend: LMDB } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1" param { lr_mult: 1 } param { lr_mult: 2 }
        convolution_param { num_output: 32 pad: 2 kernel_size: 5 stride: 1 weight_filler { type: "gaussian" std: 0.0001 } bias_filler { type: "constant" } } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "relu1" type: "ReLU" bottom: "pool1" top: "pool1" }
layer { name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2" param { lr_mult: 1 } param { lr_mult: 2 }
        convolution_param { num_output: 32 pad: 2 kernel_size: 5 stride: 1 weight_filler { type: "gaussian" std: 0.01 } bias_filler { type: "constant" } } }
layer { name: "relu2" type: "ReLU" bottom: "conv2" top: "conv2" }
layer { name: "pool2" type: "Pooling" bottom: "conv2" top: "pool2" pooling_param { pool: AVE kernel_size: 3 stride: 2 } }
layer { name: "conv3" type: "Convolution" bottom: "pool2" top: "conv3" param { lr_mult: 1 } param { lr_mult: 2 }
        convolution_param { num_output: 64 pad: 2 kernel_size: 5 stride: 1 weight_filler { type: "gaussian" std: 0.01 } bias_filler { type: "constant" } } }
layer { name: "relu3" type: "ReLU" bottom: "conv3" top: "conv3" }
layer { name: "pool3" type: "Pooling" bottom: "conv3" top: "pool3" pooling_param { pool: AVE kernel_size: 3 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool3" top: "ip1" param { lr_mult: 1 } param { lr_mult: 2 }
        inner_product_param { num_output: 64 weight_filler { type: "gaussian" std: 0.1 } bias_filler { type: "constant" } } }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2" param { lr_mult: 1 } param { lr_mult: 2 }
        inner_product_param { num_output: 10 weight_filler { type: "gaussian" std: 0.1 } bias_filler { type: "constant" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""
# LeNet with BatchNorm + Scale after each convolution: per-rank batch statistics, so no one-process equivalence (as in
# Caffe), but the running statistics are averaged across ranks, so the replicas stay identical.
LENET_BN = LENET.replace('layer { name: "pool1"', 'layer { name: "bn1" type: "BatchNorm" bottom: "conv1" top: "conv1" }\n'
                         'layer { name: "sc1" type: "Scale" bottom: "conv1" top: "conv1" scale_param { bias_term: true } }\n'
                         'layer { name: "pool1"')
NETS = {"lenet": (LENET, (1, 28, 28), 'base_lr: 0.01 lr_policy: "inv" gamma: 0.0001 power: 0.75 weight_decay: 0.0005'),
        "cifar": (CIFAR, (3, 32, 32), 'base_lr: 0.01 lr_policy: "fixed" weight_decay: 0.004')}
CASES = [(net, lw, it) for net in NETS for lw in (True, False) for it in (1, 2)]
BN_STEM = "lenet_bn_lw1_it1"


def _solver(tmp: Path, net: str, batch: int, iter_size: int, layer_wise: bool, stem: str) -> Path:
    text, _, rule = NETS[net] if net != "lenet_bn" else (LENET_BN, None, NETS["lenet"][2])
    net = "lenet" if net == "lenet_bn" else net
    model = tmp / f"{stem}_b{batch}.prototxt"
    model.write_text(text.replace("SRC", str(tmp / f"{net}_lmdb")).replace("BATCH", str(batch)))
    path = tmp / f"{stem}.prototxt"
    path.write_text(f'net: "{model}" {rule} momentum: 0.9 max_iter: {ITERATIONS} display: 0 random_seed: 3 '
                    f'type: "SGD" iter_size: {iter_size} layer_wise_reduce: {str(layer_wise).lower()} snapshot: 0')
    return path


def _stem(net: str, layer_wise: bool, iter_size: int) -> str:
    return f"{net}_lw{int(layer_wise)}_it{iter_size}"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("caffe_equivalence")
    rng = np.random.default_rng(0)
    for net, (_, shape, _) in NETS.items():
        convert.from_arrays(tmp / f"{net}_lmdb", rng.integers(0, 256, (60, *shape)).astype(np.uint8),
                            rng.integers(0, 10, 60))
    return tmp


@pytest.fixture(scope="module")
def one_process(data: Path) -> dict[str, list[np.ndarray]]:
    """One process at the global batch, per (net, iter_size); layer_wise_reduce means nothing here."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out = {}
    try:
        for net in NETS:
            for it in (1, 2):
                solver = Solver(protofile.read_solver(_solver(data, net, GLOBAL_BATCH, it, True, f"one_{net}_it{it}")))
                start = [p.tensor.detach().numpy().copy() for p in solver.params]
                solver.solve()
                out[f"{net}_it{it}"] = [p.tensor.detach().numpy().copy() for p in solver.params]
                moved = max(float(np.abs(a - b).max()) for a, b in zip(out[f"{net}_it{it}"], start, strict=True))
                assert moved > 1e3 * TOLERANCE, f"{net}: training moved the weights by only {moved:g}"
    finally:
        torch.set_num_threads(threads)
    return out


@pytest.fixture(scope="module", params=[2, 3], ids=["2 ranks", "3 ranks"])
def ranks(request: pytest.FixtureRequest, data: Path) -> tuple[int, Path]:
    """Every case trained by one mpiexec job of ``n`` ranks at the global batch / n each."""
    n = request.param
    out = data / f"ranks{n}"
    out.mkdir()
    solvers = [str(_solver(data, net, GLOBAL_BATCH // n, it, lw, _stem(net, lw, it))) for net, lw, it in CASES]
    solvers.append(str(_solver(data, "lenet_bn", GLOBAL_BATCH // n, 1, True, BN_STEM)))
    # One job trains every case in turn; at 3 ranks the order of a sum is the algorithm's, so
    # auto's trials (which may move a size to another algorithm mid-job) would make a later
    # case differ in the last bits from an earlier one for that reason alone. Off: every case
    # runs on init's choices, and the comparison is of the two reduction paths only.
    env = dict(os.environ, MPIR_CVAR_ENABLE_HEAVY_YIELD="1", DDL_AUTO_TRIALS="off")
    proc = subprocess.run([sys.executable, "-m", "ddl.launcher.cli", "-np", str(n), sys.executable, str(WORKER),
                           str(out), *solvers], capture_output=True, text=True, timeout=400, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return n, out


@pytest.mark.parametrize("net, layer_wise, iter_size", CASES)
def test_n_ranks_equal_one_process_at_the_global_batch(ranks: tuple[int, Path], one_process: dict[str, list[np.ndarray]],
                                                      net: str, layer_wise: bool, iter_size: int) -> None:
    n, out = ranks
    stem = _stem(net, layer_wise, iter_size)
    got = np.load(out / f"{stem}.npz")
    weights = [got[f"arr_{i}"] for i in range(len(got.files))]
    want = one_process[f"{net}_it{iter_size}"]
    worst = max(float(np.abs(a - b).max()) for a, b in zip(weights, want, strict=True))
    record = json.loads((out / f"{stem}.json").read_text())
    print(f"{n} ranks, {stem}: max |N ranks - one process| = {worst:.3g}")
    assert worst <= TOLERANCE, f"{n} ranks, {stem}: {worst:g} from one process"
    assert len(set(record["digests"])) == 1, f"{n} ranks, {stem}: the ranks' weights differ: {record['digests']}"
    assert record["iterations"] == ITERATIONS
    if layer_wise:   # buckets started during backward: part of the reduction's span ran before backward ended
        assert record["span"] > record["exposed"], record
    else:            # one reduction after backward: all of it exposed
        assert record["span"] == pytest.approx(record["exposed"]), record


def test_layer_wise_and_after_backward_give_the_same_weights_bit_for_bit(ranks: tuple[int, Path]) -> None:
    _, out = ranks
    for net in NETS:
        for it in (1, 2):
            a, b = (np.load(out / f"{_stem(net, lw, it)}.npz") for lw in (True, False))
            assert all(np.array_equal(a[k], b[k]) for k in a.files), f"{net} iter_size {it}"


def test_batchnorm_statistics_are_averaged_so_replicas_stay_identical(ranks: tuple[int, Path]) -> None:
    n, out = ranks
    record = json.loads((out / f"{BN_STEM}.json").read_text())
    assert len(set(record["digests"])) == 1, f"{n} ranks: the BatchNorm net's replicas differ: {record['digests']}"
