"""A .caffemodel's weights as a PyTorch ``state_dict``, named ``<layer>.<blob>`` as ``ddl.caffe.load`` names them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ddl.caffe.formats import schema
from ddl.caffe.formats.caffemodel import CaffemodelReader, LayerBlobs, read_hdf5_weights
from ddl.caffe.formats.protofile import read_net
from ddl.caffe.formats.upgrade import V1_TYPES

# Readable names of each layer type's blobs, in Caffe's order.
BLOB_NAMES: dict[str, tuple[str, ...]] = {
    "Convolution": ("weight", "bias"), "Deconvolution": ("weight", "bias"), "InnerProduct": ("weight", "bias"),
    "Embed": ("weight", "bias"), "Scale": ("weight", "bias"), "Bias": ("bias",), "PReLU": ("weight",),
    "Normalize": ("weight",), "Parameter": ("weight",), "BatchNorm": ("mean", "variance", "scale_factor"),
}
RECURRENT = {("LSTM", 3): ("W_xc", "b_c", "W_hc"), ("LSTM", 4): ("W_xc", "b_c", "W_xc_static", "W_hc"),
             ("RNN", 5): ("W_xh", "b_h", "W_hh", "W_ho", "b_o"), ("RNN", 6): ("W_xh", "b_h", "W_xh_static", "W_hh", "W_ho", "b_o")}


def module_name(layer: str) -> str:
    """A layer name as a torch submodule name ('.' is not allowed there)."""
    return layer.replace(".", "_") or "_"


def blob_names(layer_type: str, count: int, *, bottoms: int = 1) -> list[str]:
    """The names of a layer's ``count`` blobs: readable ones where the type is known, else ``blobs_<i>``."""
    names = RECURRENT.get((layer_type, count)) or BLOB_NAMES.get(layer_type, ())
    if layer_type == "Scale" and bottoms == 2:
        names = ("bias",)                  # the scale comes from the second bottom; only the bias is learned
    return [names[i] if i < len(names) else f"blobs_{i}" for i in range(count)]


def _type_name(raw: str) -> str:
    if raw.isdigit():          # a V1 model stores the type as an enum number
        try:
            return V1_TYPES[schema.V1LayerParameter.LayerType.Name(int(raw))]
        except ValueError:
            return ""
    return raw


def caffemodel_to_state_dict(path: str | Path, *, model: str | Path | None = None,
                             bn_running_stats: bool = False) -> dict[str, torch.Tensor]:
    """Every blob of a .caffemodel (or .caffemodel.h5) as ``{"<layer>.<name>": tensor}``.

    Layer types come from the model file itself, or from ``model`` (a prototxt) when given (needed
    for .h5 files, which store no types). With ``bn_running_stats``, BatchNorm layers give
    ``running_mean``/``running_var`` (Caffe's sums divided by its scale factor) as torch's
    BatchNorm expects, instead of Caffe's three blobs.

    Example:
        >>> sd = caffemodel_to_state_dict("bvlc_alexnet.caffemodel")   # doctest: +SKIP
        >>> sd["conv1.weight"].shape                                      # doctest: +SKIP
        torch.Size([96, 3, 11, 11])
    """
    types = {lp.name: (lp.type, len(lp.bottom)) for lp in read_net(model).layer} if model is not None else {}
    out: dict[str, torch.Tensor] = {}

    def add(layers: list[LayerBlobs]) -> None:
        for la in layers:
            if not la.blobs:
                continue
            kind, bottoms = types.get(la.name) or (_type_name(la.type), 1)
            arrays = [np.array(b, dtype=np.float32) for b in la.blobs]
            prefix = module_name(la.name)
            if bn_running_stats and kind == "BatchNorm" and len(arrays) == 3:
                f = float(arrays[2].reshape(-1)[0])
                scale = 0.0 if f == 0 else 1.0 / f
                out[f"{prefix}.running_mean"] = torch.from_numpy(arrays[0] * scale)
                out[f"{prefix}.running_var"] = torch.from_numpy(arrays[1] * scale)
                continue
            for name, arr in zip(blob_names(kind, len(arrays), bottoms=bottoms), arrays, strict=True):
                out[f"{prefix}.{name}"] = torch.from_numpy(arr)

    if str(path).endswith(".h5"):
        add(read_hdf5_weights(path))
    else:
        with CaffemodelReader(path) as r:
            add(list(r.layers()))
    return out
