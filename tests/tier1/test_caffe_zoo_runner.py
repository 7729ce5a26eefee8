"""The zoo job's runner on a small folder: a train_val net with its solver (LMDB and mean file it cannot have) and a deploy net."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
pytest.importorskip("lmdb")

from tools.caffe import zoo  # noqa: E402

TRAIN_VAL = """
name: "LeNet"
layer { name: "mnist" type: "Data" top: "data" top: "label" include { phase: TRAIN }
        transform_param { scale: 0.00390625 mean_file: "/nowhere/mean.binaryproto" } data_param { source: "/nowhere/mnist_train_lmdb" batch_size: 64 backend: LMDB } }
layer { name: "mnist" type: "Data" top: "data" top: "label" include { phase: TEST }
        transform_param { scale: 0.00390625 } data_param { source: "/nowhere/mnist_test_lmdb" batch_size: 100 backend: LMDB } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1" convolution_param { num_output: 4 kernel_size: 5 weight_filler { type: "xavier" } } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool1" top: "ip1" inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
layer { name: "accuracy" type: "Accuracy" bottom: "ip1" bottom: "label" top: "accuracy" include { phase: TEST } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip1" bottom: "label" top: "loss" }
"""
SOLVER = ('net: "lenet_train_test.prototxt" test_iter: 100 test_interval: 500 base_lr: 0.01 momentum: 0.9 weight_decay: 0.0005 '
          'lr_policy: "inv" gamma: 0.0001 power: 0.75 display: 100 max_iter: 10000 snapshot: 5000 snapshot_prefix: "lenet" '
          'snapshot_format: HDF5 solver_mode: GPU')
DEPLOY = """
name: "tiny_deploy"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 3 dim: 9 dim: 9 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv" convolution_param { num_output: 4 kernel_size: 3 } }
layer { name: "fc" type: "InnerProduct" bottom: "conv" top: "fc" inner_product_param { num_output: 3 } }
layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }
"""


def test_zoo_runner_table_on_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "lenet_train_test.prototxt").write_text(TRAIN_VAL)
    (tmp_path / "lenet_solver.prototxt").write_text(SOLVER)
    (tmp_path / "deploy.prototxt").write_text(DEPLOY)
    (tmp_path / "broken.prototxt").write_text('layer { name: "x" type: "Convolution" convolution_param { num_outputs: 3 } }')
    (tmp_path / "SOURCES.txt").write_text("# where the files came from\ndeploy.prototxt someone/tiny@0123abc (first version)\n")
    out = tmp_path / "rows.json"
    code = zoo.main(["--dir", str(tmp_path), "--json", str(out)])
    rows = {r["net"]: r for r in json.loads(out.read_text())}
    assert rows["lenet_solver.prototxt"]["trains"].startswith("ok SGD 2 it") and "HDF5 snapshot" in rows["lenet_solver.prototxt"]["trains"]
    assert rows["deploy.prototxt"]["loads"] == "ok" and rows["deploy.prototxt"]["onnx"].endswith("(logits)")
    solver = rows["lenet_solver.prototxt"]
    # Its net's data layers read generated files in every step, TEST phase (ONNX) included.
    assert solver["loads"] == "ok" and solver["fwd_bwd"].startswith("ok") and float(solver["onnx"].split()[0]) < 1e-4
    assert "lenet_train_test.prototxt" not in rows               # its solver's row covers it
    assert rows["broken.prototxt"]["loads"] == "FAIL" and code == 1
    assert rows["deploy.prototxt"]["source"] == "someone/tiny@0123abc" and rows["broken.prototxt"]["source"] == str(tmp_path)
    assert "| net | source | loads | fwd+bwd | solver trains | ONNX logits diff |" in capsys.readouterr().out


SIAMESE = """
name: "pairs"
layer { name: "pair" type: "Data" top: "pair" top: "sim" data_param { source: "/nowhere/pairs_lmdb" batch_size: 64 backend: LMDB } }
layer { name: "split" type: "Slice" bottom: "pair" top: "a" top: "b" slice_param { slice_dim: 1 slice_point: 1 } }
layer { name: "fa" type: "InnerProduct" bottom: "a" top: "fa" param { name: "w" } inner_product_param { num_output: 2 weight_filler { type: "xavier" } } }
layer { name: "fb" type: "InnerProduct" bottom: "b" top: "fb" param { name: "w" } inner_product_param { num_output: 2 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "ContrastiveLoss" bottom: "fa" bottom: "fb" bottom: "sim" top: "loss" }
"""


def test_sliced_data_gets_one_image_per_slice_top(tmp_path: Path) -> None:
    from ddl.caffe.formats import schema
    from ddl.caffe.formats.protofile import parse_text
    from ddl.caffe.net.net import Net
    from tools.caffe.zoo_data import point_at_synthetic_data
    p = parse_text(SIAMESE.replace('name: "pairs"', 'name: "mnist_siamese"'), schema.NetParameter())
    point_at_synthetic_data(p, tmp_path)
    net = Net(p, schema.TRAIN, quiet=True)
    assert list(net.shapes["pair"]) == [4, 2, 28, 28] and list(net.shapes["a"]) == [4, 1, 28, 28]


def test_input_batch_is_set_in_every_input_form() -> None:
    from ddl.caffe.formats import schema
    from ddl.caffe.formats.protofile import parse_text
    from ddl.caffe.net.net import Net
    from tools.caffe.zoo_data import set_input_batch
    p = schema.NetParameter()                       # legacy input_dim, as a V1 deploy file writes it (built unparsed)
    p.input.extend(["a", "b"])
    p.input_dim.extend([10, 3, 8, 8, 7, 1, 2, 2])
    set_input_batch(p, 1)
    assert list(p.input_dim) == [1, 3, 8, 8, 1, 1, 2, 2]
    net = Net(p, schema.TEST, quiet=True)
    assert list(net.shapes["a"]) == [1, 3, 8, 8] and list(net.shapes["b"]) == [1, 1, 2, 2]
    p = schema.NetParameter()
    p.input.append("a")
    p.input_shape.add().dim.extend([10, 3])
    set_input_batch(p, 2)
    assert list(p.input_shape[0].dim) == [2, 3]
    p = parse_text(DEPLOY, schema.NetParameter())
    set_input_batch(p, 5)
    assert list(p.layer[0].input_param.shape[0].dim) == [5, 3, 9, 9]


def test_deploy_weights_without_fillers_are_made_nonzero() -> None:
    from ddl.caffe.formats import schema
    from ddl.caffe.formats.protofile import parse_text
    from ddl.caffe.net.net import Net
    net = Net(parse_text(DEPLOY, schema.NetParameter()), schema.TEST, quiet=True)
    assert not any(bool(la.blobs[0].any()) for la in net.layers if la.blobs)       # Caffe's default filler: constant 0
    zoo.random_weights(net)
    assert all(bool(la.blobs[0].any()) for la in net.layers if la.blobs)
    assert not any(bool(la.blobs[1].any()) for la in net.layers if la.blobs)       # biases stay as the file says


def test_a_solver_trains_the_net_beside_it_when_two_share_a_name(tmp_path: Path) -> None:
    for sub, classes in (("a", 3), ("b", 5)):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "train_val.prototxt").write_text(TRAIN_VAL.replace("num_output: 10", f"num_output: {classes}"))
        (tmp_path / sub / "solver.prototxt").write_text(SOLVER.replace("lenet_train_test.prototxt", "train_val.prototxt"))
    items = {name: train for name, _, train, _ in zoo.from_folder(tmp_path)}
    assert items["a/solver.prototxt"].layer[-3].inner_product_param.num_output == 3
    assert items["b/solver.prototxt"].layer[-3].inner_product_param.num_output == 5


@pytest.mark.parametrize("name, means, expected", [
    ("LeNet", "", (1, 28, 28)),
    ("mnist_siamese_train_test", "", (1, 28, 28)),
    ("GoogleNet", "mean_value: 104 mean_value: 117 mean_value: 123", (3, 253, 253)),
    ("GoogleNet", "", (3, 253, 253)),                          # the letters l-e-n-e-t inside a word are not LeNet
    ("CIFAR10_quick", "", (3, 32, 32)),
])
def test_generated_record_shape(name: str, means: str, expected: tuple[int, int, int]) -> None:
    from ddl.caffe.formats import schema
    from ddl.caffe.formats.protofile import parse_text
    from tools.caffe.zoo_data import guess_image_shape
    lp = parse_text(f'layer {{ name: "d" type: "Data" top: "data" transform_param {{ crop_size: 224 {means} }} }}',
                    schema.NetParameter()).layer[0]
    if name.startswith(("LeNet", "mnist", "CIFAR")):
        lp.transform_param.ClearField("crop_size")
    assert guess_image_shape(name, lp) == expected


def test_declared_failures_pass_the_run_only_with_their_message() -> None:
    ok = zoo.Row("a.prototxt", "x", loads="ok", fwd_bwd="ok", onnx="1e-7")
    refused = zoo.Row("b.prototxt", "x", loads="FAIL", notes=["loads: CaffeFormatError: field 'version'"])
    assert zoo.verdict([ok, refused], {"b.prototxt": "field 'version'"}) == []
    assert "failed (loads" in zoo.verdict([ok, refused], {})[0]                               # undeclared failure
    assert "but not with 'momentum'" in zoo.verdict([refused], {"b.prototxt": "momentum"})[0]  # another error
    assert "but passed" in zoo.verdict([ok], {"a.prototxt": "anything"})[0]                   # stale declaration


def test_expected_failures_file_is_read_and_checked(tmp_path: Path) -> None:
    (tmp_path / "EXPECTED_FAILURES.txt").write_text("# Caffe refuses these too\nold/net.prototxt: field 'version'\n")
    assert zoo.expected_failures_of(tmp_path) == {"old/net.prototxt": "field 'version'"}
    (tmp_path / "EXPECTED_FAILURES.txt").write_text("old/net.prototxt\n")
    with pytest.raises(ValueError, match="expected 'relative/path: words of the error'"):
        zoo.expected_failures_of(tmp_path)
