"""The parity tool's comparisons (tools.caffe.parity) without real Caffe: fed "Caffe" results in pycaffe_side's format
made by ddl itself, it passes a net that matches and names the layer, blob and size of a planted difference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ddl.caffe.formats import schema  # noqa: E402
from ddl.caffe.formats.protofile import parse_text  # noqa: E402
from ddl.caffe.net.net import Net  # noqa: E402
from tools.caffe import parity  # noqa: E402
from tools.caffe.parity_nets import calm_logits, comparable, prototxt, randomize  # noqa: E402

NET = """
name: "small"
layer { name: "data" type: "Data" top: "data" top: "label" data_param { source: "/nowhere" batch_size: 8 backend: LMDB } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv" convolution_param { num_output: 4 kernel_size: 3 } }
layer { name: "bn" type: "BatchNorm" bottom: "conv" top: "conv" }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "drop" type: "Dropout" bottom: "conv" top: "conv" dropout_param { dropout_ratio: 0.5 } }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip" inner_product_param { num_output: 3 } }
layer { name: "acc" type: "Accuracy" bottom: "ip" bottom: "label" top: "acc" include { phase: TEST } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


def _caffe_side(text: str, phase: int, weights: Path, inputs: dict[str, torch.Tensor], work: Path) -> list[tuple[int, str, str]]:
    """What pycaffe_side.py writes, computed by ddl: whole.npz and layers/<i>.npz."""
    net = Net(parse_text(text, schema.NetParameter()), phase, quiet=True)
    from ddl.caffe.net.weights import load_weights
    load_weights(net, str(weights))
    data, diffs, params = parity.whole_net(net, inputs, {})
    np.savez(work / "whole.npz", **{f"data/{k}": v for k, v in data.items()}, **{f"diff/{k}": v for k, v in diffs.items()},
             **{f"param/{k}": v for k, v in params.items()})
    (work / "layers").mkdir()
    rng = np.random.default_rng(1)
    blobs = {k: v.clone() for k, v in inputs.items()}
    listing = []
    for i, la in enumerate(net.layers):
        listing.append((i, la.name, la.type))
        if la.type == "Input":
            continue
        xs = [blobs[b].detach().clone().requires_grad_(True) for b in la.bottom]
        for b in la.blobs:
            b.grad = None
        tops = net.run_layer(i, xs)
        gs = [torch.from_numpy(rng.standard_normal(tuple(t.shape)).astype(np.float32)) for t in tops]
        pairs = [(t, g) for t, g in zip(tops, gs, strict=True) if t.requires_grad]
        if pairs:
            torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])
        saved = {}
        for j, x in enumerate(xs):
            saved[f"bottom/{j}"] = x.detach().numpy()
            saved[f"bottom_diff/{j}"] = x.grad.numpy() if x.grad is not None else np.zeros(tuple(x.shape), np.float32)
        for j, (t, g) in enumerate(zip(tops, gs, strict=True)):
            saved[f"top/{j}"], saved[f"top_diff/{j}"] = t.detach().numpy(), g.numpy()
        for k, b in enumerate(la.blobs):
            saved[f"param/{k}"] = b.grad.numpy() if b.grad is not None else np.zeros(tuple(b.shape), np.float32)
        np.savez(work / "layers" / f"{i}.npz", **saved)
        for name, t in zip(la.top, tops, strict=True):
            blobs[name] = t.detach()
    return listing


@pytest.mark.parametrize("phase", [schema.TEST, schema.TRAIN])
def test_matching_results_pass_and_a_planted_difference_is_named(tmp_path: Path, phase: int) -> None:
    param, notes = comparable(parse_text(NET, schema.NetParameter()), phase, batch=2)
    assert "data (Data) fed as Input" in notes
    assert any(lp.type == "Input" for lp in param.layer) and not param.force_backward      # a loss: no force_backward
    if phase == schema.TRAIN:
        assert next(lp for lp in param.layer if lp.type == "Dropout").dropout_param.dropout_ratio == 0
    text = prototxt(param)
    net = Net(parse_text(text, schema.NetParameter()), phase, quiet=True)
    randomize(net, 3)
    from ddl.caffe.export.onnx_export import sample_inputs
    inputs = sample_inputs(net, seed=3)
    calm_logits(net, inputs)
    net.save(tmp_path / "w.caffemodel")
    listing = _caffe_side(text, phase, tmp_path / "w.caffemodel", inputs, tmp_path)
    caffe = np.load(tmp_path / "whole.npz")

    def ours() -> Net:
        from ddl.caffe.net.weights import load_weights
        n = Net(parse_text(text, schema.NetParameter()), phase, quiet=True)
        load_weights(n, str(tmp_path / "w.caffemodel"))
        return n
    row = parity.Row("small", "TEST")
    parity.compare_whole(row, ours(), caffe, inputs, {}, 1e-4, lambda: ({}, {}))
    parity.compare_layers(row, ours(), tmp_path / "layers", listing, 1e-4)
    assert row.differs == [] and row.layers == len(listing) - 1 and row.forward < 1e-6 and row.layer_backward < 1e-6
    # A wrong kernel (ip's weights off by 1e-3) is named, forward and backward, with its size.
    wrong = ours()
    with torch.no_grad():
        wrong.layer_by_name("ip").blobs[0].mul_(1.001)                    # type: ignore[union-attr]
    row = parity.Row("small", "TEST")
    parity.compare_layers(row, wrong, tmp_path / "layers", listing, 1e-4)
    assert any(d.startswith("layer ip (InnerProduct) top 0 'ip': 1.0e-03") for d in row.differs), row.differs
    assert any(d.startswith("layer ip (InnerProduct) bottom diff 0") for d in row.differs), row.differs
    assert not any(d.startswith("layer conv") for d in row.differs)


def test_relative_difference_and_its_float64_judgement() -> None:
    a = np.array([1.0, -2.0, 0.5], np.float32)
    assert parity.rel(a, a) == 0 and parity.rel(a * 0, a * 0) == 0
    assert parity.rel(a + np.float32(2e-4), a) == pytest.approx(1e-4, rel=1e-2)
    assert parity.rel(np.ones(2), np.zeros(2)) == float("inf")
    # Over the tolerance but no further from float64 than Caffe: a note, not a difference; 5x further: a difference.
    net = Net(parse_text('layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 3 } } }', schema.NetParameter()),
              schema.TEST, quiet=True)
    exact = np.array([1.0, -2.0, 0.5])
    for ddl_off, caffe_off, differs in ((3e-4, 2e-4, False), (1e-3, 2e-4, True)):
        caffe = {"data/x": (exact * (1 + caffe_off)).astype(np.float32)}
        row = parity.Row("n", "TEST")

        class Saved(dict):                                               # np.load's .files
            files = property(lambda self: list(self))
        parity.compare_whole(row, net, Saved(caffe), {"x": torch.tensor(exact * (1 - ddl_off), dtype=torch.float32)}, {},
                             1e-4, lambda: ({"x": exact}, {}))
        assert bool(row.differs) == differs, row
        assert bool(row.notes) != differs
