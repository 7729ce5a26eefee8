"""ddl.caffe files: schema numbering, prototxt errors, .caffemodel round trip and damaged files."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("google.protobuf")

from ddl.caffe.formats import blobs, protofile, schema  # noqa: E402
from ddl.caffe.layers.base import LayerError  # noqa: E402
from ddl.caffe.net import weights  # noqa: E402
from ddl.caffe.net.net import Net  # noqa: E402

NET = """
name: "tiny"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 dim: 5 dim: 5 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "gaussian" std: 0.1 } bias_filler { type: "constant" value: 0.5 } } }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip" inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
"""


@pytest.mark.parametrize(("msg", "field", "number"), [
    ("LayerParameter", "convolution_param", 106), ("LayerParameter", "include", 8),
    ("LayerParameter", "batch_norm_param", 139), ("LayerParameter", "input_param", 143),
    ("LayerParameter", "scale_param", 142), ("LayerParameter", "transform_param", 100),
    ("NetParameter", "layer", 100), ("NetParameter", "layers", 2), ("BlobProto", "shape", 7),
    ("BlobProto", "data", 5), ("SolverParameter", "iter_size", 36), ("SolverParameter", "clip_gradients", 35),
    ("SolverParameter", "type", 40), ("SolverParameter", "momentum2", 39), ("SolverState", "history", 3),
    ("PoolingParameter", "round_mode", 13), ("Datum", "encoded", 7), ("ConvolutionParameter", "dilation", 18),
])
def test_field_numbers_are_caffes(msg: str, field: str, number: int) -> None:
    assert schema.message_class(msg).DESCRIPTOR.fields_by_name[field].number == number


def test_defaults_are_caffes() -> None:
    sp = schema.SolverParameter()
    assert (sp.type, sp.regularization_type, sp.iter_size, sp.average_loss, sp.test_initialization) == ("SGD", "L2", 1, 1, True)
    assert np.float32(sp.delta) == np.float32(1e-8) and np.float32(sp.rms_decay) == np.float32(0.99)
    assert sp.clip_gradients == -1 and sp.snapshot_after_train and sp.random_seed == -1
    lp = schema.LayerParameter()
    assert lp.convolution_param.bias_term and lp.convolution_param.group == 1
    assert lp.pooling_param.stride == 1 and lp.lrn_param.local_size == 5 and lp.loss_param.normalization == 1
    assert np.float32(lp.batch_norm_param.moving_average_fraction) == np.float32(0.999)


def test_blobproto_wire_bytes_match_the_protobuf_encoding_caffe_uses() -> None:
    # Hand-encoded from the wire format: field 7 (shape{dim packed}), field 5 (packed floats).
    dims = bytes([0x0A, 2, 2, 3])                                # BlobShape.dim = [2, 3], packed
    floats = struct.pack("<6f", *range(6))
    raw = bytes([0x3A, len(dims)]) + dims + bytes([0x2A, len(floats)]) + floats
    b = schema.BlobProto.FromString(raw)
    assert blobs.to_array(b).tolist() == [[0, 1, 2], [3, 4, 5]]
    # Serializers (Caffe's C++ one too) write fields in number order: data (5) before shape (7).
    canonical = bytes([0x2A, len(floats)]) + floats + bytes([0x3A, len(dims)]) + dims
    assert blobs.from_array(np.arange(6, dtype=np.float32).reshape(2, 3)).SerializeToString() == canonical


def test_caffemodel_round_trip(tmp_path: Path) -> None:
    net = Net(protofile.parse_text(NET, schema.NetParameter()), schema.TEST)
    path = tmp_path / "w.caffemodel"
    protofile.write_binary(path, net.to_proto())
    other = Net(protofile.parse_text(NET, schema.NetParameter()), schema.TEST, gen=__import__("torch").Generator().manual_seed(99))
    assert not np.array_equal(other.params[0].tensor.detach().numpy(), net.params[0].tensor.detach().numpy())
    weights.load_weights(other, str(path))
    for a, b in zip(net.params, other.params, strict=True):
        assert np.array_equal(a.tensor.detach().numpy(), b.tensor.detach().numpy())
    assert np.all(other.params[1].tensor.detach().numpy() == 0.5)


def test_legacy_4d_blob_is_accepted(tmp_path: Path) -> None:
    net = Net(protofile.parse_text(NET, schema.NetParameter()), schema.TEST)
    model = net.to_proto()
    w = np.arange(3 * 36, dtype=np.float32).reshape(3, 36)
    ip = model.layer[2]
    del ip.blobs[0].shape.dim[:]
    ip.blobs[0].ClearField("shape")
    ip.blobs[0].num, ip.blobs[0].channels, ip.blobs[0].height, ip.blobs[0].width = 1, 1, 3, 36
    del ip.blobs[0].data[:]
    ip.blobs[0].data.extend(w.ravel().tolist())
    weights.copy_trained_layers(net, model, source="m")
    assert np.array_equal(net.params[2].tensor.detach().numpy(), w)


def test_truncated_and_mismatched_caffemodels_name_layer_and_shapes(tmp_path: Path) -> None:
    net = Net(protofile.parse_text(NET, schema.NetParameter()), schema.TEST)
    good = net.to_proto().SerializeToString()
    cut = tmp_path / "cut.caffemodel"
    cut.write_bytes(good[: len(good) - 7])
    with pytest.raises(protofile.CaffeFormatError, match="truncated|not a valid"):
        weights.load_weights(net, str(cut))
    wrong = protofile.parse_text(NET.replace("num_output: 4", "num_output: 5"), schema.NetParameter())
    other = Net(wrong, schema.TEST)
    p = tmp_path / "other.caffemodel"
    protofile.write_binary(p, other.to_proto())
    with pytest.raises(protofile.CaffeFormatError, match=r"layer 'conv' blob 0: shape \[5, 3, 3, 3\].*expects \[4, 3, 3, 3\]"):
        weights.load_weights(net, str(p))
    short = net.to_proto()
    del short.layer[1].blobs[0].data[-5:]
    with pytest.raises(protofile.CaffeFormatError, match=r"layer 'conv' blob 0: shape \[4, 3, 3, 3\] needs 108 values but the file holds 103"):
        weights.copy_trained_layers(net, short, source="s")


def test_prototxt_errors_give_file_line_column(tmp_path: Path) -> None:
    bad = tmp_path / "bad.prototxt"
    bad.write_text('name: "x"\nlayer {\n  name: "a"\n  type: "ReLU"\n  bottom: "d" top "d"\n}\n')
    with pytest.raises(protofile.CaffeFormatError, match=rf"^{bad}:5:\d+: "):
        protofile.read_net(bad)
    unknown = tmp_path / "unknown.prototxt"
    unknown.write_text('layer {\n  name: "p1"\n  type: "PReLU"\n  prelu_param { channel_shard: true }\n}\n'
                       'layer {\n  name: "c"\n  type: "Convolution"\n  convolution_param { num_outputs: 3 }\n}\n')
    with pytest.raises(protofile.CaffeFormatError, match="2 field") as e:
        protofile.read_net(unknown)
    assert f"{unknown}:4:17: field 'channel_shard' in layer \"p1\" (type PReLU)" in str(e.value)
    assert f"{unknown}:9:23: field 'num_outputs' in layer \"c\" (type Convolution)" in str(e.value)


def test_v1_layers_format_is_upgraded_on_load(tmp_path: Path) -> None:
    old = tmp_path / "old.prototxt"
    old.write_text('name: "x"\ninput: "data"\ninput_dim: 1 input_dim: 3 input_dim: 5 input_dim: 5\n'
                   'layers {\n  name: "c"\n  type: CONVOLUTION\n  bottom: "data" top: "c"\n  blobs_lr: 2 weight_decay: 0\n'
                   '  convolution_param { num_output: 2 kernel_size: 3 }\n}\n')
    net = protofile.read_net(old)
    assert not len(net.layers) and [(la.name, la.type) for la in net.layer] == [("input", "Input"), ("c", "Convolution")]
    assert (net.layer[1].param[0].lr_mult, net.layer[1].param[0].decay_mult) == (2, 0)
    assert list(net.layer[0].input_param.shape[0].dim) == [1, 3, 5, 5]


def test_unsupported_layer_type_names_type_and_layer() -> None:
    text = NET + ('layer { name: "a" type: "Foo" bottom: "ip" top: "a" }\n'
                  'layer { name: "b" type: "Bar" bottom: "ip" top: "b" }\nlayer { name: "c" type: "Foo" bottom: "ip" top: "c" }\n')
    with pytest.raises(LayerError, match="2 layer type.*'Foo' \\(layers 'a', 'c'\\); 'Bar' \\(layer 'b'\\)"):
        Net(protofile.parse_text(text, schema.NetParameter()), schema.TEST)


def test_missing_bottom_and_phase_filtering() -> None:
    text = NET + 'layer { name: "acc" type: "Softmax" bottom: "nope" top: "s" }\n'
    with pytest.raises(LayerError, match="layer 'acc'.*bottom blob 'nope'"):
        Net(protofile.parse_text(text, schema.NetParameter()), schema.TEST)
    text = NET + 'layer { name: "s" type: "Softmax" bottom: "nope" top: "s" include { phase: TRAIN } }\n'
    net = Net(protofile.parse_text(text, schema.NetParameter()), schema.TEST)
    assert [la.name for la in net.layers] == ["data", "conv", "ip"] and net.outputs == ["ip"]


def test_whole_files_replace_the_old_one_or_leave_it(tmp_path: Path) -> None:
    import threading

    from ddl.caffe.formats.whole_file import replacing
    target = tmp_path / "w.caffemodel"
    for n in range(3):                                       # fresh, then swapped over the old file twice in a row
        with replacing(target, size=1000) as f:              # a reserved size larger than written is cut back
            f.write(bytes([n]) * 10)
        assert target.read_bytes() == bytes([n]) * 10
    with pytest.raises(RuntimeError), replacing(target, size=10) as f:
        f.write(b"half")
        raise RuntimeError("the writer failed")
    assert target.read_bytes() == bytes([2]) * 10            # the old file stands
    for t in threading.enumerate():
        if t.name == "ddl-caffe-unlink":
            t.join()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.caffemodel"]   # no temporary or old file is left
