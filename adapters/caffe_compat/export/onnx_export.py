"""ONNX export of a net (deploy or train_val) with its weights, and its check in onnxruntime down to the logits."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ddl.base.atomic_write import atomic_path
from ddl.caffe.export.onnx_nodes import EMITTERS, Graph
from ddl.caffe.layers.base import LayerError
from ddl.caffe.net.net import Net

log = logging.getLogger("ddl.caffe")
OPSET = 17
# Heads and sinks that a deployed model does not compute.
SKIPPED = {"Accuracy", "Silence", "HDF5Output"}
STOPS = {"DetectionOutput"}        # no ONNX counterpart: the graph ends at their bottoms


def _skipped(la: Any) -> bool:
    return la.is_loss or la.type in SKIPPED or la.type in STOPS


def to_onnx(net: Net, *, extra_outputs: tuple[str, ...] = ()) -> Any:
    """An ``onnx.ModelProto`` computing the net's outputs from its data tops (data layers become graph inputs).

    Loss layers, Accuracy, Silence and HDF5Output are left out; DetectionOutput (no ONNX counterpart)
    is left out too and its bottoms become outputs. ``extra_outputs`` names further blobs to expose
    (e.g. the logits under a final Softmax).

    Raises:
        LayerError: layers without an ONNX counterpart, all named in one message.
    """
    from onnx import TensorProto, checker, helper
    missing = sorted({f"'{la.name}' ({la.type})" for la in net.layers
                      if not la.is_data and not _skipped(la) and la.type not in EMITTERS})
    if missing:
        raise LayerError(f"net '{net.name}': these layers have no ONNX counterpart in ddl-caffe's exporter: {', '.join(missing)}")
    g = Graph()
    inputs = []
    for la in net.layers:
        if la.is_data:
            for t in la.top:
                g.names[t] = t
                inputs.append(helper.make_tensor_value_info(t, TensorProto.FLOAT, list(net.shapes[t])))
            continue
        if _skipped(la):
            continue
        missing_in = [b for b in la.bottom if b not in g.names]
        if missing_in:
            raise LayerError(f"layer '{la.name}' needs {missing_in}, which the exported graph does not compute")
        outs = EMITTERS[la.type](g, la, [g.names[b] for b in la.bottom], [net.shapes[b] for b in la.bottom],
                                 [net.shapes[t] for t in la.top])
        for t, o in zip(la.top, outs, strict=True):
            g.names[t] = o
    finals = _graph_outputs(net) + [t for t in extra_outputs if t in g.names]
    outputs = []
    for t in dict.fromkeys(finals):
        outputs.append(helper.make_tensor_value_info(t, TensorProto.FLOAT, list(net.shapes[t])))
        g.nodes.append(helper.make_node("Identity", [g.names[t]], [t], name=f"{t}__out"))
    live = {i for nd in g.nodes for i in nd.input}
    inputs = [i for i in inputs if i.name in live]         # labels read only by the left-out heads
    graph = helper.make_graph(g.nodes, net.name or "caffe_net", inputs, outputs, initializer=g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="ddl-caffe")
    model.ir_version = 8
    checker.check_model(model)
    return model


def _graph_outputs(net: Net) -> list[str]:
    """Blobs still unread after the exported layers (the net's outputs without its heads); a stop layer's bottoms."""
    available: list[str] = []
    data_tops = {t for la in net.layers if la.is_data for t in la.top}
    for la in net.layers:
        if la.type in STOPS:
            available += [b for b in la.bottom if b not in available]
            continue
        if _skipped(la):
            continue
        kept = [x for x in available if x not in la.bottom]
        available = kept + [t for t in la.top if t not in kept]
    return [t for t in available if t not in data_tops]


def logits_of(net: Net) -> list[str]:
    """The bottoms of Softmax layers whose tops the export outputs: what a saturated softmax would hide."""
    outs = set(_graph_outputs(net))
    return [la.bottom[0] for la in net.layers if la.type == "Softmax" and la.top[0] in outs]


def sample_inputs(net: Net, seed: int = 11) -> dict[str, torch.Tensor]:
    """Random values for every data top: integers within the class count for label tops, N(0, 1) otherwise."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for la in net.layers:
        if not la.is_data:
            continue
        for t in la.top:
            classes = [net.shapes[c.bottom[0]][1] for c in net.layers if len(c.bottom) > 1 and c.bottom[1] == t
                       and c.type in ("SoftmaxWithLoss", "Accuracy", "InfogainLoss", "HingeLoss", "MultinomialLogisticLoss")]
            shape = net.shapes[t]
            out[t] = torch.randint(classes[0], shape, generator=gen).float() if classes else torch.randn(shape, generator=gen)
    return out


def check_onnx(net: Net, path: str | Path) -> dict[str, float]:
    """Run the exported file in onnxruntime and the net itself on the same random inputs.

    Returns:
        For every output (and every logits blob exported beside it), the largest absolute
        difference divided by the largest absolute value of the net's own result.
    """
    import onnxruntime as ort
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = sample_inputs(net)
    with torch.no_grad():
        _, blobs = net.forward(feeds=feeds)
    got = sess.run(None, {i.name: feeds[i.name].numpy() for i in sess.get_inputs()})
    rel = {}
    for o, v in zip(sess.get_outputs(), got, strict=True):
        ref = blobs[o.name].detach().cpu().double().numpy()
        rel[o.name] = float(np.abs(v - ref).max() / max(float(np.abs(ref).max()), 1e-30)) if ref.size else 0.0
    return rel


def export(net: Net, path: str | Path, *, check: bool = True, tolerance: float | None = None) -> dict[str, float]:
    """Write the net as ONNX to ``path`` (with its logits exposed), checked in onnxruntime unless ``check`` is False.

    The file is written under a temporary name and renamed only when everything succeeded.

    Raises:
        LayerError: a layer without an ONNX counterpart, or (with ``tolerance``) an output of
            onnxruntime further than that from the net's own, relatively.
    """
    import onnx
    p = Path(path)
    model = to_onnx(net, extra_outputs=tuple(logits_of(net)))
    with atomic_path(p, temporary=p.with_name(p.name + ".partial")) as tmp:
        onnx.save(model, str(tmp))
        rel = check_onnx(net, tmp) if check else {}
        bad = {k: v for k, v in rel.items() if tolerance is not None and not v <= tolerance}
        if bad:
            raise LayerError(f"the export differs from ddl-caffe's own forward in onnxruntime: "
                             f"{', '.join(f'{k} {v:.3g}' for k, v in bad.items())} (relative; tolerance {tolerance:g}); "
                             "nothing was written")
    return rel
