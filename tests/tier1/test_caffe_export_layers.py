"""ONNX export of every layer type with an ONNX counterpart, each net checked in onnxruntime against ddl-caffe's forward."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

from ddl.caffe.export.onnx_export import export  # noqa: E402
from ddl.caffe.formats import protofile, schema  # noqa: E402
from ddl.caffe.net.net import Net  # noqa: E402


def _in(name: str, *dims: int) -> str:
    return f'layer {{ name: "in_{name}" type: "Input" top: "{name}" input_param {{ shape {{ {" ".join(f"dim: {d}" for d in dims)} }} }} }}\n'


def L(name: str, typ: str, bottoms: str, body: str = "", tops: str = "") -> str:  # noqa: N802
    bs = " ".join(f'bottom: "{b}"' for b in bottoms.split())
    ts = " ".join(f'top: "{t}"' for t in (tops or name).split())
    return f'layer {{ name: "{name}" type: "{typ}" {bs} {ts} {body} }}\n'


G = 'weight_filler { type: "gaussian" std: 0.3 } bias_filler { type: "uniform" }'
NETS = {
    "vision": _in("x", 2, 3, 9, 8) + _in("v", 1, 2, 4, 5, 6) + "".join([
        L("dc", "Deconvolution", "x", f"convolution_param {{ num_output: 4 kernel_size: 3 stride: 2 pad: 1 group: 1 {G} }}"),
        L("c3", "Convolution", "v", f"convolution_param {{ num_output: 2 kernel_size: 3 pad: 1 {G} }}"),
        L("pbig", "Pooling", "x", "pooling_param { pool: AVE kernel_size: 3 stride: 2 pad: 2 }"),
        L("pmax", "Pooling", "x", "pooling_param { pool: MAX kernel_h: 2 kernel_w: 3 stride: 2 pad_h: 1 pad_w: 1 }"),
        L("pfloor", "Pooling", "x", "pooling_param { pool: AVE kernel_size: 3 stride: 2 ceil_mode: false }"),
        L("spp", "SPP", "x", "spp_param { pyramid_height: 2 pool: AVE }"),
        L("lw", "LRN", "x", "lrn_param { local_size: 3 alpha: 0.4 norm_region: WITHIN_CHANNEL }"),
        L("mvn", "MVN", "x", "mvn_param { across_channels: true }"),
        L("nm", "Normalize", "x", 'norm_param { across_spatial: false channel_shared: false scale_filler { type: "uniform" } }'),
        L("ip", "Interp", "x", "interp_param { height: 5 width: 7 }"),
        L("up", "Upsample", "x", "upsample_param { scale: 2 }"),
        L("pb", "PriorBox", "x x", "prior_box_param { min_size: 4 max_size: 8 aspect_ratio: 2 clip: true }")]),
    "neurons": _in("x", 2, 3, 4, 5) + "".join([
        L("pr", "PReLU", "x", 'prelu_param { filler { type: "uniform" } }'), L("el", "ELU", "x", "elu_param { alpha: 0.5 }"),
        L("ex", "Exp", "x", "exp_param { base: 2 scale: 0.5 shift: 0.2 }"), L("ab", "AbsVal", "x"),
        L("lg", "Log", "ab", "log_param { shift: 1 scale: 2 base: 10 }"), L("pw", "Power", "ab", "power_param { power: 1.5 shift: 0.5 }"),
        L("sw", "Swish", "x", "swish_param { beta: 2 }"), L("cl", "Clip", "x", "clip_param { min: -0.3 max: 0.4 }"),
        L("r6", "ReLU6", "x"), L("th", "Threshold", "x", "threshold_param { threshold: 0.1 }"), L("bn", "BNLL", "x"),
        L("bi", "Bias", "x", 'bias_param { axis: 1 num_axes: 2 filler { type: "uniform" } }'),
        L("sl", "Slice", "x", "slice_param { axis: 2 slice_point: 1 }", "s1 s2"),
        L("cr", "Crop", "x s2", "crop_param { axis: 2 offset: 0 offset: 0 }"), L("ti", "Tile", "x", "tile_param { axis: 1 tiles: 2 }"),
        L("pm", "Permute", "x", "permute_param { order: 0 order: 3 order: 1 order: 2 }"),
        L("rd", "Reduction", "x", "reduction_param { operation: SUMSQ axis: 2 coeff: 0.5 }"),
        L("rm", "Reduction", "x", "reduction_param { operation: ASUM axis: 1 }"),
        L("am", "ArgMax", "x", "argmax_param { axis: 1 top_k: 2 out_max_val: true }"),
        L("pa", "Parameter", "", "parameter_param { shape { dim: 3 dim: 2 } }")]),
    "indices": _in("i", 2, 3) + _in("f", 4, 3) + _in("k", 5) + "".join([
        L("em", "Embed", "i", f"embed_param {{ num_output: 4 input_dim: 6 {G} }}"), L("br", "BatchReindex", "f k")]),
    "recurrent": _in("x", 3, 2, 4) + _in("cont", 3, 2) + _in("xs", 2, 5) + "".join([
        L("lstm", "LSTM", "x cont xs", f"recurrent_param {{ num_output: 3 {G} }}"),
        L("rnn", "RNN", "x cont", f"recurrent_param {{ num_output: 3 {G} }}")]),
}


@pytest.mark.parametrize("name", sorted(NETS))
def test_export_agrees_with_onnxruntime(name: str, tmp_path: Path) -> None:
    net = Net(protofile.parse_text(NETS[name], schema.NetParameter()), schema.TEST, quiet=True)
    if name == "indices":
        from ddl.caffe.export import onnx_export as ex
        orig = ex.sample_inputs

        def ints(n: Net, seed: int = 11) -> dict[str, torch.Tensor]:
            d = orig(n, seed)
            d["i"] = torch.randint(0, 6, (2, 3)).float()
            d["k"] = torch.tensor([3.0, 0, 1, 1, 2])
            return d
        ex.sample_inputs = ints               # type: ignore[assignment]
        try:
            rel = export(net, tmp_path / f"{name}.onnx")
        finally:
            ex.sample_inputs = orig           # type: ignore[assignment]
    else:
        rel = export(net, tmp_path / f"{name}.onnx")
    assert rel and max(rel.values()) < 1e-4, rel
