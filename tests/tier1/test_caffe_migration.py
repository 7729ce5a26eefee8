"""The way out of Caffe: streamed .caffemodel files, V0/V1 upgrades (``ddl-caffe upgrade``), the state_dict converter,
``ddl.caffe.load`` as a torch module under ddl.torch, and ONNX export of train_val nets."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

import ddl.caffe  # noqa: E402
from ddl.caffe.command import cli  # noqa: E402
from ddl.caffe.formats import caffemodel, protofile, schema  # noqa: E402
from ddl.caffe.net.net import Net  # noqa: E402
from ddl.caffe.net.weights import load_weights  # noqa: E402

DEPLOY = """
name: "mini"
input: "data"
input_shape { dim: 2 dim: 3 dim: 12 dim: 12 }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1" convolution_param { num_output: 8 kernel_size: 3 stride: 2 weight_filler { type: "xavier" } bias_filler { type: "uniform" } } }
layer { name: "bn1" type: "BatchNorm" bottom: "conv1" top: "conv1" }
layer { name: "sc1" type: "Scale" bottom: "conv1" top: "conv1" scale_param { bias_term: true } }
layer { name: "relu1" type: "PReLU" bottom: "conv1" top: "conv1" }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "fc" type: "InnerProduct" bottom: "pool1" top: "fc" inner_product_param { num_output: 5 weight_filler { type: "xavier" } } }
layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }
"""


def _trained(tmp: Path) -> tuple[Net, Path, Path]:
    proto = tmp / "deploy.prototxt"
    proto.write_text(DEPLOY)
    net = Net(protofile.read_net(proto), schema.TEST, quiet=True)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in net.params:
            p.tensor.copy_(torch.rand(p.tensor.shape, generator=g) + 0.5)
    weights = tmp / "mini.caffemodel"
    net.save(weights)
    return net, proto, weights


def test_streamed_caffemodel_is_protobufs_wire_format_and_costs_no_copies(tmp_path: Path) -> None:
    net, _, weights = _trained(tmp_path)
    parsed = protofile.read_binary(weights, schema.NetParameter())      # protobuf itself reads what we stream
    assert [lp.name for lp in parsed.layer] == [la.name for la in net.layers]
    conv = parsed.layer[1]
    assert conv.type == "Convolution" and list(conv.blobs[0].shape.dim) == [8, 3, 3, 3]
    np.testing.assert_array_equal(np.asarray(conv.blobs[0].data, np.float32).reshape(8, 3, 3, 3), net.layers[1].blobs[0].detach().numpy())
    big = Net(protofile.parse_text('layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 1 dim: 4000 } } }\n'
                                'layer { name: "fc" type: "InnerProduct" bottom: "x" top: "y" inner_product_param { num_output: 3000 } }',
                                schema.NetParameter()), schema.TEST, quiet=True)
    size = 4000 * 3000 * 4
    tracemalloc.start()
    big.save(tmp_path / "big.caffemodel")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert (tmp_path / "big.caffemodel").stat().st_size > size
    assert peak < size / 10                                   # no Python lists, no serialized copy of the blob
    again = Net(big.param, schema.TEST, quiet=True)
    load_weights(again, str(tmp_path / "big.caffemodel"))
    assert torch.equal(again.layers[1].blobs[0], big.layers[1].blobs[0])


V1_NET = """
name: "old"
input: "data"
input_dim: 1 input_dim: 3 input_dim: 6 input_dim: 6
layers { name: "conv" type: CONVOLUTION bottom: "data" top: "conv" blobs_lr: 1 blobs_lr: 2 weight_decay: 1 weight_decay: 0
         convolution_param { num_output: 2 kernel_size: 3 } }
layers { name: "relu" type: RELU bottom: "conv" top: "conv" }
layers { name: "pool" type: POOLING bottom: "conv" top: "pool" pooling_param { pool: AVE kernel_size: 2 stride: 2 } }
"""

V0_NET = """
name: "ancient"
input: "data"
input_dim: 1 input_dim: 3 input_dim: 8 input_dim: 8
layers { layer { name: "pad1" type: "padding" pad: 1 } bottom: "data" top: "pad1" }
layers { layer { name: "conv1" type: "conv" num_output: 4 kernelsize: 3 stride: 1 biasterm: false weight_filler { type: "xavier" } } bottom: "pad1" top: "conv1" }
layers { layer { name: "pool1" type: "pool" pool: MAX kernelsize: 2 stride: 2 } bottom: "conv1" top: "pool1" }
"""


def test_v0_and_v1_nets_and_weights_upgrade_like_caffes_tools(tmp_path: Path) -> None:
    v1 = protofile.parse_text(V1_NET, schema.NetParameter())
    assert [(lp.name, lp.type) for lp in v1.layer] == [("input", "Input"), ("conv", "Convolution"), ("relu", "ReLU"), ("pool", "Pooling")]
    assert [(p.lr_mult, p.decay_mult) for p in v1.layer[1].param] == [(1, 1), (2, 0)]
    v0 = protofile.parse_text(V0_NET, schema.NetParameter())
    assert [lp.name for lp in v0.layer] == ["input", "conv1", "pool1"]          # the padding layer folds into conv1
    conv = v0.layer[1]
    assert list(conv.convolution_param.pad) == [1] and conv.bottom[0] == "data" and not conv.convolution_param.bias_term
    assert Net(v0, schema.TEST, quiet=True).shapes["pool1"] == (1, 4, 4, 4)
    # A V1 .caffemodel (layers with blobs) loads into the upgraded net and upgrades on disk.
    from google.protobuf import text_format
    legacy = text_format.Parse(V1_NET, schema.NetParameter())
    w = np.arange(54, dtype=np.float32).reshape(2, 3, 3, 3)
    blob = legacy.layers[0].blobs.add()
    blob.num, blob.channels, blob.height, blob.width = 2, 3, 3, 3        # the legacy 4-D shape fields
    blob.data.extend(w.ravel().tolist())
    legacy.layers[0].blobs.add().data.extend([5.0, 6.0])
    old_model = tmp_path / "old.caffemodel"
    old_model.write_bytes(legacy.SerializeToString())
    net = Net(v1, schema.TEST, quiet=True)
    load_weights(net, str(old_model))
    np.testing.assert_array_equal(net.layer_by_name("conv").blobs[0].detach().numpy(), w)   # type: ignore[union-attr]
    assert cli.main(["upgrade", str(old_model), str(tmp_path / "new.caffemodel")]) == 0
    new = schema.NetParameter.FromString((tmp_path / "new.caffemodel").read_bytes())
    assert not len(new.layers) and [lp.type for lp in new.layer][1] == "Convolution"
    (tmp_path / "old.prototxt").write_text(V1_NET)
    assert cli.main(["upgrade", str(tmp_path / "old.prototxt"), str(tmp_path / "new.prototxt")]) == 0
    assert "layers {" not in (tmp_path / "new.prototxt").read_text() and 'type: "Input"' in (tmp_path / "new.prototxt").read_text()
    (tmp_path / "old_solver.prototxt").write_text('net: "x" base_lr: 0.1 lr_policy: "fixed" solver_type: NESTEROV')
    assert cli.main(["upgrade", str(tmp_path / "old_solver.prototxt"), str(tmp_path / "new_solver.prototxt")]) == 0
    assert 'type: "Nesterov"' in (tmp_path / "new_solver.prototxt").read_text()


def test_state_dict_converter_and_load_as_a_torch_module(tmp_path: Path) -> None:
    net, proto, weights = _trained(tmp_path)
    sd = ddl.caffe.state_dict(weights)
    assert set(sd) == {"conv1.weight", "conv1.bias", "bn1.mean", "bn1.variance", "bn1.scale_factor", "sc1.weight", "sc1.bias",
                       "relu1.weight", "fc.weight", "fc.bias"}
    bn = ddl.caffe.state_dict(weights, bn_running_stats=True)
    f = float(sd["bn1.scale_factor"][0])
    torch.testing.assert_close(bn["bn1.running_mean"], sd["bn1.mean"] / f)
    model = ddl.caffe.load(proto, weights)
    assert isinstance(model, torch.nn.Module) and not model.training
    x = torch.randn(2, 3, 12, 12)
    net.layers[0].values = [x]                                # type: ignore[attr-defined]
    with torch.no_grad():
        _, blobs = net.forward()
        torch.testing.assert_close(model(x), blobs["prob"])
    assert set(model.state_dict()) == set(sd)
    assert cli.main(["state-dict", str(weights), str(tmp_path / "w.pt")]) == 0
    assert set(torch.load(tmp_path / "w.pt")) == set(sd)
    tv = tmp_path / "tv.prototxt"
    tv.write_text(_train_val())
    trainer = ddl.caffe.load(tv, weights, phase="train")
    y = torch.tensor([1.0, 3.0])
    trainer.eval()                                             # TEST behaviour: BatchNorm's stored statistics
    loss = trainer.loss(data=x, label=y)                       # the net's own SoftmaxWithLoss, fed by name
    with torch.no_grad():
        ref = torch.nn.functional.cross_entropy(torch.log(model(x)), y.long())
    assert loss.requires_grad and float(loss.detach()) == pytest.approx(float(ref), rel=1e-4)


def test_fine_tuning_under_ddl_torch_distributed_optimizer(tmp_path: Path) -> None:
    import ddl.torch as dt
    _, proto, weights = _trained(tmp_path)
    dt.init()
    model = ddl.caffe.load(proto, weights, phase="train")
    model.train()
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    assert "conv1.weight" in dict(params) and "bn1.mean" not in dict(params)
    opt = dt.DistributedOptimizer(torch.optim.SGD([p for _, p in params], lr=0.05), named_parameters=params)
    dt.broadcast_parameters(model.state_dict(), root_rank=0)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(2, 3, 12, 12, generator=g), torch.tensor([1, 3])
    losses = []
    for _ in range(8):
        opt.zero_grad()
        loss = torch.nn.functional.nll_loss(torch.log(model(x)), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0]


def _train_val() -> str:
    return (DEPLOY.replace('input: "data"\ninput_shape { dim: 2 dim: 3 dim: 12 dim: 12 }',
                           'layer { name: "d" type: "DummyData" top: "data" top: "label" dummy_data_param { shape { dim: 2 dim: 3 dim: 12 dim: 12 } shape { dim: 2 } } }')
            .replace('layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }',
                     'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }\n'
                     'layer { name: "acc" type: "Accuracy" bottom: "fc" bottom: "label" top: "acc" include { phase: TEST } }'))


def test_export_of_a_train_val_net_exits_0_and_failures_leave_no_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    net, _, weights = _trained(tmp_path)
    tv = tmp_path / "train_val.prototxt"
    tv.write_text(_train_val())
    out = tmp_path / "tv.onnx"
    assert cli.main(["export", "--model", str(tv), "--weights", str(weights), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert out.exists() and "output fc: max relative difference" in err
    bad = tmp_path / "bad.prototxt"
    bad.write_text(DEPLOY + 'layer { name: "cols" type: "Im2col" bottom: "pool1" top: "cols" convolution_param { kernel_size: 1 } }\n')
    out2 = tmp_path / "bad.onnx"
    assert cli.main(["export", "--model", str(bad), "--weights", str(weights), "-o", str(out2)]) == 1
    assert "no ONNX counterpart" in capsys.readouterr().err and not out2.exists()
    assert not list(tmp_path.glob("*.partial"))


def test_caffemodel_reader_rejects_other_files(tmp_path: Path) -> None:
    junk = tmp_path / "junk.caffemodel"
    junk.write_bytes(b"\xff" * 64)
    with pytest.raises(protofile.CaffeFormatError, match="junk.caffemodel"), caffemodel.CaffemodelReader(junk) as r:
        list(r.layers())
