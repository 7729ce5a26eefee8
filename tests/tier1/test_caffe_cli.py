"""ddl-caffe commands in process: convert, train, test, time, export (checked in onnxruntime), --ddl."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("lmdb")
pytest.importorskip("onnxruntime")

from ddl.caffe.command import cli, ddl_options  # noqa: E402
from ddl.caffe.export.onnx_export import check_onnx  # noqa: E402
from ddl.caffe.formats import protofile, schema  # noqa: E402
from ddl.caffe.net.net import Net  # noqa: E402

NET = """
name: "cli"
layer { name: "d" type: "Data" top: "data" top: "label" include { phase: TRAIN }
        transform_param { scale: 0.0625 } data_param { source: "TRAIN" batch_size: 8 backend: LMDB } }
layer { name: "d" type: "Data" top: "data" top: "label" include { phase: TEST }
        transform_param { scale: 0.0625 } data_param { source: "TEST" batch_size: 10 backend: LMDB } }
layer { name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "xavier" } } }
layer { name: "r" type: "ReLU" bottom: "c" top: "c" }
layer { name: "ip" type: "InnerProduct" bottom: "c" top: "ip" inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "acc" type: "Accuracy" bottom: "ip" bottom: "label" top: "accuracy" include { phase: TEST } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


def _data(tmp: Path) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 40)
    x = (rng.integers(0, 6, (40, 6, 6)) + 5 * y[:, None, None]).astype(np.uint8)   # learnable
    np.savez(tmp / "train.npz", x=x[:30], y=y[:30])
    np.savez(tmp / "test.npz", x=x[30:], y=y[30:])
    assert cli.main(["convert", str(tmp / "train_lmdb"), "--npz", str(tmp / "train.npz")]) == 0
    assert cli.main(["convert", str(tmp / "test_lmdb"), "--npz", str(tmp / "test.npz")]) == 0
    net = tmp / "net.prototxt"
    net.write_text(NET.replace('"TRAIN"', f'"{tmp / "train_lmdb"}"').replace('"TEST"', f'"{tmp / "test_lmdb"}"'))
    solver = tmp / "solver.prototxt"
    solver.write_text(f'net: "{net}" test_iter: 1 test_interval: 10 base_lr: 0.1 momentum: 0.9 lr_policy: "fixed" '
                      f'display: 5 max_iter: 10 snapshot_prefix: "{tmp / "snap"}" random_seed: 1')
    return net, solver


def test_train_test_time_with_caffes_log_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    net, solver = _data(tmp_path)
    assert cli.main(["train", "--solver", str(solver)]) == 0
    err = capsys.readouterr().err
    for pattern in (r"\] Iteration 0 \(0 iter/s, [\d.e+-]+s/5 iters\), loss = [\d.e+-]+\n", r"\] Iteration 5 \([\d.e+-]+ iter/s, [\d.e+-]+s/5 iters\), loss = [\d.e+-]+\n", r"\] Iteration 5, lr = 0\.1\n", r"\] Iteration 10, Testing net \(#0\)\n",
                    r"\]     Test net output #0: accuracy = [\d.]+\n", r"\]     Train net output #0: loss = [\d.e+-]+ \(\* 1 = [\d.e+-]+ loss\)\n",
                    r"\] Snapshotting to binary proto file .*snap_iter_10\.caffemodel\n", r"\] Optimization Done\.\n",
                    r"^I\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ \w+\.py:\d+\] Solving cli$"):
        assert re.search(pattern, err, re.MULTILINE), (pattern, err[-2000:])
    model = tmp_path / "snap_iter_10.caffemodel"
    assert cli.main(["test", "--model", str(net), "--weights", str(model), "--iterations", "1"]) == 0
    err = capsys.readouterr().err
    acc = float(re.search(r"\] accuracy = ([\d.]+)", err).group(1))  # type: ignore[union-attr]
    assert acc >= 0.7, err[-1500:]
    assert cli.main(["time", "--model", str(net), "--iterations", "2"]) == 0
    err = capsys.readouterr().err
    for line in ("Average Forward pass: ", "Average Backward pass: ", "Average Forward-Backward: ", "*** Benchmark ends ***"):
        assert line in err
    assert re.search(r"\]          c\tforward: [\d.e+-]+ ms\.", err)
    assert cli.main(["train", "--solver", str(solver), "--weights", str(model), "--snapshot", "x"]) == 1
    assert "not both" in capsys.readouterr().err


EXPORT_NET = """
name: "exp"
layer { name: "in" type: "Input" top: "x" top: "x2" input_param { shape { dim: 2 dim: 3 dim: 9 dim: 11 } shape { dim: 2 dim: 4 dim: 5 dim: 6 } } }
layer { name: "c" type: "Convolution" bottom: "x" top: "c" convolution_param { num_output: 4 kernel_size: 3 pad: 1 weight_filler { type: "xavier" } bias_filler { type: "uniform" } } }
layer { name: "bn" type: "BatchNorm" bottom: "c" top: "c" }
layer { name: "sc" type: "Scale" bottom: "c" top: "c" scale_param { bias_term: true filler { type: "uniform" min: 0.5 max: 2 } bias_filler { type: "uniform" } } }
layer { name: "r" type: "ReLU" bottom: "c" top: "c" relu_param { negative_slope: 0.1 } }
layer { name: "lrn" type: "LRN" bottom: "c" top: "lrn" lrn_param { local_size: 3 alpha: 0.5 } }
layer { name: "pa" type: "Pooling" bottom: "lrn" top: "pa" pooling_param { pool: AVE kernel_size: 3 stride: 2 pad: 1 } }
layer { name: "lw" type: "LRN" bottom: "pa" top: "lw" lrn_param { local_size: 3 alpha: 0.5 norm_region: WITHIN_CHANNEL } }
layer { name: "th" type: "TanH" bottom: "x2" top: "th" }
layer { name: "el" type: "Eltwise" bottom: "lw" bottom: "th" top: "el" eltwise_param { coeff: 0.5 coeff: -2 } }
layer { name: "mx" type: "Eltwise" bottom: "lw" bottom: "th" top: "mx" eltwise_param { operation: MAX } }
layer { name: "cat" type: "Concat" bottom: "el" bottom: "mx" top: "cat" }
layer { name: "pm" type: "Pooling" bottom: "cat" top: "pm" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "sg" type: "Sigmoid" bottom: "pm" top: "sg" }
layer { name: "fl" type: "Flatten" bottom: "sg" top: "fl" }
layer { name: "dp" type: "Dropout" bottom: "fl" top: "fl" }
layer { name: "ip" type: "InnerProduct" bottom: "fl" top: "ip" inner_product_param { num_output: 5 weight_filler { type: "xavier" } } }
layer { name: "prob" type: "Softmax" bottom: "ip" top: "prob" }
"""


def test_export_matches_onnxruntime(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "m.prototxt"
    model.write_text(EXPORT_NET)
    net = Net(protofile.parse_text(EXPORT_NET, schema.NetParameter()), schema.TEST, quiet=True)
    bn = net.layer_by_name("bn")
    assert bn is not None
    g = torch.Generator().manual_seed(5)
    bn.blobs[0].copy_(torch.randn(4, generator=g) * 3)
    bn.blobs[1].copy_(torch.rand(4, generator=g) * 6 + 1)
    bn.blobs[2].fill_(3.0)
    weights = tmp_path / "m.caffemodel"
    protofile.write_binary(weights, net.to_proto())
    out = tmp_path / "m.onnx"
    assert cli.main(["export", "--model", str(model), "--weights", str(weights), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    diffs = dict(re.findall(r"output (\w+): max relative difference ([\d.e+-]+)", err))
    assert set(diffs) == {"prob", "ip"}, err[-800:]        # the logits under the softmax are checked too
    assert max(float(v) for v in diffs.values()) < 1e-5, err[-800:]
    net2 = Net(protofile.parse_text(EXPORT_NET, schema.NetParameter()), schema.TEST, quiet=True)
    assert max(check_onnx(net2, str(out)).values()) > 1e-3          # other weights: the check can fail


def test_ddl_option_string() -> None:
    assert ddl_options.parse("-mode r:2x2") == ddl_options.DdlOptions("multiring", "2x2")
    assert ddl_options.parse("-mode p -dump_iter 100") == ddl_options.DdlOptions("auto", None)
    assert ddl_options.parse("-mode rr:4x2") == ddl_options.DdlOptions("multiring", "4x2")
    with pytest.raises(ValueError, match="mode 'rp:4x2' is unknown"):
        ddl_options.parse("-mode rp:4x2")
    assert ddl_options.parse("") == ddl_options.DdlOptions(None, None)
    with pytest.raises(ValueError, match="mode 'q:2' is unknown"):
        ddl_options.parse("-mode q:2")
    with pytest.raises(ValueError, match="dims '2y2'"):
        ddl_options.parse("-mode r:2y2")
    with pytest.raises(ValueError, match="option '-foo' is not understood"):
        ddl_options.parse("-foo")


@pytest.mark.parametrize(("argv", "said"), [
    (["time", "--model", "net.prototxt", "--iterations", "0"], "--iterations/-iterations: takes a whole number of at least 1, got 0"),
    (["test", "-model", "net.prototxt", "-weights", "w.caffemodel", "-iterations", "-2"], "at least 1, got -2"),
    (["train", "--solver", "solver.prototxt", "--threads", "-1"], "--threads/-threads: takes a whole number of at least 0"),
])
def test_counts_out_of_range_are_refused_before_any_file_is_read(argv: list[str], said: str,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # `time --iterations 0` divided by zero after timing nothing (a ZeroDivisionError's traceback).
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    assert stop.value.code == 2 and said in capsys.readouterr().err
