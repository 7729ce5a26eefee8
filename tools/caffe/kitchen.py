"""``python -m tools.caffe.kitchen DIR``: a "kitchen sink" net (BatchNorm, Scale, PReLU, ELU, LRN, grouped convolution,
Eltwise, Concat, MAX and AVE pooling, TanH, Accuracy), learnable random LMDBs and two solvers (RMSProp with L1, SGD
with L1) written to DIR, for ``python -m tools.caffe.trajectory`` to train in Caffe and ddl-caffe side by side.

The data: 10 classes, each a random 3x16x16 prototype image half-mixed with noise (2,000 train, 500 test records).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

NET = """name: "kitchen"
layer { name: "data" type: "Data" top: "data" top: "label" include { phase: TRAIN } transform_param { scale: 0.00390625 mean_value: 128 }
        data_param { source: "DIR/train_lmdb" batch_size: 25 backend: LMDB } }
layer { name: "data" type: "Data" top: "data" top: "label" include { phase: TEST } transform_param { scale: 0.00390625 mean_value: 128 }
        data_param { source: "DIR/test_lmdb" batch_size: 50 backend: LMDB } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1" param { lr_mult: 1 } param { lr_mult: 2 }
        convolution_param { num_output: 16 kernel_size: 3 pad: 1 weight_filler { type: "msra" } bias_filler { type: "constant" value: 0.1 } } }
layer { name: "bn1" type: "BatchNorm" bottom: "conv1" top: "conv1" }
layer { name: "sc1" type: "Scale" bottom: "conv1" top: "conv1" scale_param { bias_term: true } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "lrn1" type: "LRN" bottom: "pool1" top: "lrn1" lrn_param { local_size: 3 alpha: 0.0001 beta: 0.75 } }
layer { name: "c2a" type: "Convolution" bottom: "lrn1" top: "c2a" convolution_param { num_output: 16 kernel_size: 1 weight_filler { type: "xavier" } } }
layer { name: "prelu2a" type: "PReLU" bottom: "c2a" top: "c2a" }
layer { name: "c2b" type: "Convolution" bottom: "lrn1" top: "c2b" convolution_param { num_output: 16 kernel_size: 3 pad: 1 group: 4 weight_filler { type: "gaussian" std: 0.05 } } }
layer { name: "elu2b" type: "ELU" bottom: "c2b" top: "c2b" }
layer { name: "sum2" type: "Eltwise" bottom: "c2a" bottom: "c2b" top: "sum2" eltwise_param { operation: SUM coeff: 1 coeff: 0.5 } }
layer { name: "cat2" type: "Concat" bottom: "sum2" bottom: "lrn1" top: "cat2" }
layer { name: "pool2" type: "Pooling" bottom: "cat2" top: "pool2" pooling_param { pool: AVE kernel_size: 3 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool2" top: "ip1" inner_product_param { num_output: 64 weight_filler { type: "xavier" } bias_filler { type: "constant" } } }
layer { name: "tanh1" type: "TanH" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2" inner_product_param { num_output: 10 weight_filler { type: "xavier" } bias_filler { type: "constant" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
layer { name: "accuracy" type: "Accuracy" bottom: "ip2" bottom: "label" top: "accuracy" include { phase: TEST } }
"""
COMMON = ('net: "DIR/kitchen.prototxt"\ntest_iter: 10\ntest_interval: 100\nlr_policy: "step"\ngamma: 0.5\nstepsize: 150\n'
          'weight_decay: 0.0005\nregularization_type: "L1"\ndisplay: 20\nmax_iter: 300\nsnapshot: 0\n'
          'snapshot_after_train: false\nsolver_mode: CPU\nrandom_seed: 1\n')
SOLVERS = {"rmsprop_l1": 'type: "RMSProp"\nrms_decay: 0.98\nbase_lr: 0.001\n',
           "sgd_l1": 'type: "SGD"\nmomentum: 0.9\nbase_lr: 0.01\n'}


def write(folder: Path) -> list[Path]:
    """The net, its two LMDBs and the solvers in ``folder``; returns the solvers' paths."""
    from ddl.caffe.data import convert

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    protos = rng.integers(0, 256, (10, 3, 16, 16))
    for part, n, seed in (("train", 2000, 1), ("test", 500, 2)):
        r = np.random.default_rng(seed)
        y = r.integers(0, 10, n)
        x = np.clip(protos[y] * 0.5 + r.integers(0, 256, (n, 3, 16, 16)) * 0.5, 0, 255).astype(np.uint8)
        convert.from_arrays(folder / f"{part}_lmdb", x, y)
    (folder / "kitchen.prototxt").write_text(NET.replace("DIR", str(folder.resolve())))
    out = []
    for name, rule in SOLVERS.items():
        path = folder / f"kitchen_{name}_solver.prototxt"
        path.write_text(COMMON.replace("DIR", str(folder.resolve())) + rule)
        out.append(path)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m tools.caffe.kitchen DIR", file=sys.stderr)
        raise SystemExit(2)
    for solver in write(Path(sys.argv[1])):
        print(solver)
