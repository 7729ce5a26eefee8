"""ONNX export of a deploy (TEST-phase) net with its weights: one ONNX node group per Caffe layer."""

from __future__ import annotations

from typing import Any

import numpy as np

from .layers.base import Layer, LayerError
from .net import Net

OPSET = 17
_SKIP = {"SoftmaxWithLoss", "Accuracy", "EuclideanLoss"}   # training-only heads are not exported


class _Graph:
    def __init__(self) -> None:
        from onnx import helper, numpy_helper
        self.h, self.nh = helper, numpy_helper
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.names: dict[str, str] = {}       # caffe blob -> current onnx value name
        self.n = 0

    def fresh(self, base: str) -> str:
        self.n += 1
        return f"{base}__{self.n}"

    def const(self, base: str, arr: np.ndarray) -> str:
        name = self.fresh(base)
        self.inits.append(self.nh.from_array(np.ascontiguousarray(arr), name))
        return name

    def node(self, op: str, ins: list[str], base: str, **attrs: Any) -> str:
        out = self.fresh(base)
        self.nodes.append(self.h.make_node(op, ins, [out], name=out, **attrs))
        return out


def _blob(la: Layer, i: int) -> np.ndarray:
    return la.blobs[i].detach().numpy().astype(np.float32)


def _emit(g: _Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]]) -> list[str]:
    t, n = la.type, la.name
    if t == "Convolution":
        ops = [ins[0], g.const(f"{n}_w", _blob(la, 0))] + ([g.const(f"{n}_b", _blob(la, 1))] if len(la.blobs) > 1 else [])
        ph, pw = la.pad  # type: ignore[attr-defined]
        return [g.node("Conv", ops, n, kernel_shape=list(la.kernel), strides=list(la.stride), pads=[ph, pw, ph, pw],  # type: ignore[attr-defined]
                       dilations=list(la.dilation), group=la.group)]  # type: ignore[attr-defined]
    if t == "Pooling":
        ph, pw = la.pad  # type: ignore[attr-defined]
        kw = {"kernel_shape": list(la.kernel), "strides": list(la.stride), "pads": [ph, pw, ph, pw], "ceil_mode": int(la.ceil)}  # type: ignore[attr-defined]
        if la.max:  # type: ignore[attr-defined]
            return [g.node("MaxPool", ins, n, **kw)]
        return [g.node("AveragePool", ins, n, count_include_pad=1, **kw)]
    if t == "InnerProduct":
        flat = g.node("Flatten", ins, n + "_flat", axis=la.axis)  # type: ignore[attr-defined]
        w = _blob(la, 0)
        ops = [flat, g.const(f"{n}_w", w.T.copy() if la.transpose else w)]  # type: ignore[attr-defined]
        if len(la.blobs) > 1:
            ops.append(g.const(f"{n}_b", _blob(la, 1)))
        y = g.node("Gemm", ops, n, transB=1)
        lead = list(shapes[0][: la.axis])  # type: ignore[attr-defined]
        if len(lead) == 1:
            return [y]
        return [g.node("Reshape", [y, g.const(n + "_shape", np.array(lead + [w.shape[0]], np.int64))], n + "_r")]
    if t == "ReLU":
        s = la.lp.relu_param.negative_slope
        return [g.node("LeakyRelu", ins, n, alpha=s) if s else g.node("Relu", ins, n)]
    if t in ("Sigmoid", "TanH"):
        return [g.node("Sigmoid" if t == "Sigmoid" else "Tanh", ins, n)]
    if t == "Dropout":
        return [g.node("Identity", ins, n)]
    if t == "LRN":
        if la.across:  # type: ignore[attr-defined]
            return [g.node("LRN", ins, n, size=la.size, alpha=la.alpha, beta=la.beta, bias=la.k)]  # type: ignore[attr-defined]
        pad = (la.size - 1) // 2  # type: ignore[attr-defined]
        sq = g.node("Mul", [ins[0], ins[0]], n + "_sq")
        avg = g.node("AveragePool", [sq], n + "_avg", kernel_shape=[la.size, la.size], strides=[1, 1],  # type: ignore[attr-defined]
                     pads=[pad] * 4, count_include_pad=1, ceil_mode=1)
        s = g.node("Add", [g.node("Mul", [avg, g.const(n + "_a", np.float32(la.alpha))], n + "_m"), g.const(n + "_one", np.float32(1))], n + "_s")  # type: ignore[attr-defined]
        return [g.node("Mul", [ins[0], g.node("Pow", [s, g.const(n + "_p", np.float32(-la.beta))], n + "_pow")], n)]  # type: ignore[attr-defined]
    if t == "BatchNorm":
        c = shapes[0][1]
        f = float(la.blobs[2][0])
        scale = 0.0 if f == 0 else 1.0 / f
        mean, var = _blob(la, 0) * scale, _blob(la, 1) * scale
        return [g.node("BatchNormalization", [ins[0], g.const(n + "_g", np.ones(c, np.float32)), g.const(n + "_b", np.zeros(c, np.float32)),
                                              g.const(n + "_mean", mean), g.const(n + "_var", var)], n, epsilon=la.eps)]  # type: ignore[attr-defined]
    if t == "Scale":
        view = list(la.view)  # type: ignore[attr-defined]
        gamma = ins[1] if len(ins) == 2 else g.const(n + "_s", _blob(la, 0))
        gamma = g.node("Reshape", [gamma, g.const(n + "_v", np.array(view, np.int64))], n + "_gv")
        y = g.node("Mul", [ins[0], gamma], n + "_mul")
        if la.bias_index >= 0:  # type: ignore[attr-defined]
            y = g.node("Add", [y, g.const(n + "_bias", _blob(la, la.bias_index).reshape(view))], n)  # type: ignore[attr-defined]
        return [y]
    if t == "Eltwise":
        op = la.op  # type: ignore[attr-defined]
        if op == 1:
            if la.coeff:  # type: ignore[attr-defined]
                ins = [g.node("Mul", [x, g.const(n + "_c", np.float32(c))], n + "_k") for x, c in zip(ins, la.coeff, strict=True)]  # type: ignore[attr-defined]
            return [g.node("Sum", ins, n)]
        if op == 2:
            return [g.node("Max", ins, n)]
        return [_chain(g, "Mul", ins, n)]
    if t == "Concat":
        return [g.node("Concat", ins, n, axis=la.axis)]  # type: ignore[attr-defined]
    if t in ("Flatten", "Reshape"):
        return [g.node("Reshape", [ins[0], g.const(n + "_shape", np.array(la.shape, np.int64))], n)]  # type: ignore[attr-defined]
    if t == "Softmax":
        return [g.node("Softmax", ins, n, axis=la.axis)]  # type: ignore[attr-defined]
    raise LayerError(f"layer '{n}' (type {t}) cannot be exported to ONNX")


def _chain(g: _Graph, op: str, ins: list[str], n: str) -> str:
    y = ins[0]
    for x in ins[1:]:
        y = g.node(op, [y, x], n)
    return y


def to_onnx(net: Net) -> Any:
    """An ``onnx.ModelProto`` computing the net's outputs from its Input tops (data layers become inputs).

    Raises:
        LayerError: a layer has no ONNX mapping.
    """
    from onnx import TensorProto, checker, helper
    g = _Graph()
    inputs = []
    for la in net.layers:
        if la.is_data:
            for t in la.top:
                g.names[t] = t
                inputs.append(helper.make_tensor_value_info(t, TensorProto.FLOAT, list(net.shapes[t])))
            continue
        if la.type in _SKIP:
            continue
        missing = [b for b in la.bottom if b not in g.names]
        if missing:
            raise LayerError(f"layer '{la.name}' needs {missing}, which the exported graph does not compute")
        outs = _emit(g, la, [g.names[b] for b in la.bottom], [net.shapes[b] for b in la.bottom])
        for t, o in zip(la.top, outs, strict=True):
            g.names[t] = o
    available: list[str] = []
    for la in net.layers:
        if la.type in _SKIP:
            continue
        kept = [x for x in available if x not in la.bottom]
        available = kept + [t for t in la.top if t not in kept]
    finals = [t for t in available if not any(la.is_data and t in la.top for la in net.layers)]
    nodes_out = []
    for t in finals:
        nodes_out.append(helper.make_tensor_value_info(t, TensorProto.FLOAT, list(net.shapes[t])))
        g.nodes.append(helper.make_node("Identity", [g.names[t]], [t], name=f"{t}__out"))
    # Graph inputs consumed only by skipped heads (e.g. labels) are dropped.
    live = {i for nd in g.nodes for i in nd.input}
    inputs = [i for i in inputs if i.name in live]
    graph = helper.make_graph(g.nodes, net.name or "caffe_net", inputs, nodes_out, initializer=g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="ddl-caffe")
    model.ir_version = 8
    checker.check_model(model)
    return model
