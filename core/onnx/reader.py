"""Read an ONNX model of the supported op subset into a :class:`ModelSpec`."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from .spec import Layer, ModelSpec

SUPPORTED = ("Gemm", "MatMul (+ Add)", "Conv", "MaxPool", "AveragePool", "Relu", "Flatten", "Reshape",
             "BatchNormalization", "Softmax / LogSoftmax (last node only)")


class UnsupportedModelError(ValueError):
    """The ONNX model uses an op or attribute outside the supported subset."""


def _fail(node: Any, why: str) -> UnsupportedModelError:
    return UnsupportedModelError(
        f"ONNX node {node.name or '(unnamed)'!r} (op {node.op_type}): {why}. ddl.onnx reads a chain of "
        f"{', '.join(SUPPORTED)}; rewrite the model with those ops or extend ddl/onnx/reader.py")


def _attrs(node: Any) -> dict[str, Any]:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _pair(values: Any, default: int) -> tuple[int, int]:
    v = [int(x) for x in values] if values is not None else [default, default]
    return (v[0], v[1])


def _layer_name(node: Any, kind: str, index: int) -> str:
    base = re.sub(r"[^A-Za-z0-9_]", "_", node.name) if node.name else ""
    return base or f"{kind}{index}"


def read_model(model: Any) -> ModelSpec:
    """Read an ONNX model (a ``ModelProto``, bytes or a path) into a :class:`ModelSpec`.

    The graph must be one chain from its single input to its single output, every weight
    an initializer. Unsupported ops or attributes raise :class:`UnsupportedModelError`
    naming the node and op.

    Example:
        >>> spec = ddl.onnx.read_model("mlp.onnx")   # doctest: +SKIP
        >>> [la.kind for la in spec.layers]          # doctest: +SKIP
        ['dense', 'relu', 'dense']
    """
    import onnx
    from onnx import numpy_helper

    if isinstance(model, (bytes, bytearray)):
        model = onnx.load_from_string(bytes(model))
    elif not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model))
    g = model.graph
    inits = {t.name: numpy_helper.to_array(t).astype(np.float32) for t in g.initializer if t.data_type == 1}
    raw = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    inputs = [i for i in g.input if i.name not in raw]
    if len(inputs) != 1 or len(g.output) != 1:
        raise UnsupportedModelError(f"ddl.onnx reads models with one data input and one output; {g.name!r} has "
                                    f"inputs {[i.name for i in inputs]} and outputs {[o.name for o in g.output]}")
    dims = [d.dim_value if d.HasField("dim_value") else -1 for d in inputs[0].type.tensor_type.shape.dim]
    if len(dims) < 2 or any(d <= 0 for d in dims[1:]):
        raise UnsupportedModelError(f"the input {inputs[0].name!r} needs a batch dimension and fixed sample "
                                    f"dimensions, got {dims}")
    layers: list[Layer] = []
    weights: dict[str, np.ndarray] = {}
    sources: dict[str, tuple[str, bool]] = {}
    output: str | None = None
    current = inputs[0].name
    nodes = list(g.node)
    i = 0

    def weight(node: Any, name: str) -> np.ndarray:
        if name not in inits:
            raise _fail(node, f"input {name!r} must be a float32 initializer")
        return inits[name]

    def add(kind: str, node: Any, attrs: dict[str, Any], params: dict[str, tuple[str, bool]]) -> None:
        la = Layer(kind, _layer_name(node, kind, len(layers)), attrs)
        if any(x.name == la.name for x in layers):
            la = Layer(kind, f"{la.name}_{len(layers)}", attrs)
        for role, (init, transposed) in params.items():
            arr = weight(node, init)
            weights[f"{la.name}.{role}"] = np.ascontiguousarray(arr.T if transposed else arr)
            sources[f"{la.name}.{role}"] = (init, transposed)
        layers.append(la)

    while i < len(nodes):
        node, a = nodes[i], _attrs(nodes[i])
        if output is not None:
            raise _fail(node, f"follows the final {output}; softmax may only be the last node")
        if not node.input or node.input[0] != current:
            raise _fail(node, f"its first input {list(node.input)[:1]} is not the previous node's output "
                              f"{current!r}; only a single chain of layers is supported")
        op = node.op_type
        if op == "Gemm":
            if a.get("transA", 0) or a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0:
                raise _fail(node, "only transA=0, alpha=1, beta=1 is supported")
            if len(node.input) != 3:
                raise _fail(node, "needs a bias input C")
            tb = bool(a.get("transB", 0))
            add("dense", node, {"units": int(weight(node, node.input[1]).shape[1 - int(tb)])},
                {"weight": (node.input[1], not tb), "bias": (node.input[2], False)})
        elif op == "MatMul":
            nxt = nodes[i + 1] if i + 1 < len(nodes) else None
            if nxt is None or nxt.op_type != "Add" or nxt.input[0] != node.output[0] or len(nxt.input) != 2:
                raise _fail(node, "MatMul must be followed by an Add of a bias initializer")
            w = weight(node, node.input[1])
            add("dense", node, {"units": int(w.shape[1])},
                {"weight": (node.input[1], True), "bias": (nxt.input[1], False)})
            i += 1
            node = nxt
        elif op == "Conv":
            w = weight(node, node.input[1])
            if len(w.shape) != 4 or a.get("group", 1) != 1 or any(d != 1 for d in a.get("dilations", [1, 1])):
                raise _fail(node, "only 2-D convolutions with group=1 and dilation 1 are supported")
            if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
                raise _fail(node, "auto_pad is not supported; give explicit pads")
            pads = [int(p) for p in a.get("pads", [0, 0, 0, 0])]
            if pads[:2] != pads[2:]:
                raise _fail(node, f"pads {pads} are not symmetric (begin == end)")
            if len(node.input) != 3:
                raise _fail(node, "needs a bias input B")
            add("conv", node, {"filters": int(w.shape[0]), "kernel": (int(w.shape[2]), int(w.shape[3])),
                               "strides": _pair(a.get("strides"), 1), "pads": (pads[0], pads[1])},
                {"weight": (node.input[1], False), "bias": (node.input[2], False)})
        elif op in ("MaxPool", "AveragePool"):
            if any(int(p) for p in a.get("pads", [])) or a.get("ceil_mode", 0) or \
                    a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
                raise _fail(node, "only pooling without padding and with ceil_mode=0 is supported")
            if any(d != 1 for d in a.get("dilations", [1, 1])):
                raise _fail(node, "dilated pooling is not supported")
            k = _pair(a["kernel_shape"], 1)
            add("maxpool" if op == "MaxPool" else "avgpool", node,
                {"kernel": k, "strides": _pair(a.get("strides"), 1)}, {})
        elif op == "Relu":
            add("relu", node, {}, {})
        elif op == "Flatten":
            if a.get("axis", 1) != 1:
                raise _fail(node, f"only axis=1 is supported, got {a.get('axis')}")
            add("flatten", node, {}, {})
        elif op == "Reshape":
            if node.input[1] not in raw:
                raise _fail(node, "the target shape must be an initializer")
            shape = [int(s) for s in raw[node.input[1]]]
            if not shape or shape[0] not in (0, -1) or any(s <= 0 for s in shape[1:]):
                raise _fail(node, f"the target shape must keep the batch (0 or -1 first) and fix the rest, got {shape}")
            add("reshape", node, {"shape": tuple(shape[1:])}, {})
        elif op == "BatchNormalization":
            if a.get("training_mode", 0):
                raise _fail(node, "training_mode=1 is not supported")
            add("batchnorm", node, {"epsilon": float(a.get("epsilon", 1e-5))},
                {role: (name, False) for role, name in zip(("scale", "bias", "mean", "var"), node.input[1:5], strict=True)})
        elif op in ("Softmax", "LogSoftmax"):
            if a.get("axis", -1) not in (-1, 1):
                raise _fail(node, f"only a softmax over the class axis is supported, got axis={a.get('axis')}")
            output = op.lower()
        else:
            raise _fail(node, "this op is not supported")
        current = node.output[0]
        i += 1
    if current != g.output[0].name:
        raise UnsupportedModelError(f"the chain ends at {current!r}, not at the graph output {g.output[0].name!r}")
    if not layers or layers[-1].kind != "dense":
        raise UnsupportedModelError("the last layer before the (optional) softmax must be a Gemm/MatMul (the logits)")
    spec = ModelSpec(name=g.name or "model", input_shape=tuple(dims[1:]), layers=layers, output=output,
                     weights=weights, num_classes=int(layers[-1].attrs["units"]), sources=sources)
    _check_shapes(spec)
    return spec


def _check_shapes(spec: ModelSpec) -> None:
    """Walk the shapes through the chain so a wrong weight shape fails here, by name."""
    shape = spec.input_shape
    for la in spec.layers:
        w = spec.weights
        if la.kind == "dense":
            if len(shape) != 1 or w[f"{la.name}.weight"].shape[1] != shape[0]:
                raise UnsupportedModelError(f"layer {la.name!r}: dense weight {w[la.name + '.weight'].shape} "
                                            f"does not take an input of shape {shape} (flatten first)")
            shape = (la.attrs["units"],)
        elif la.kind == "conv":
            if len(shape) != 3 or w[f"{la.name}.weight"].shape[1] != shape[0]:
                raise UnsupportedModelError(f"layer {la.name!r}: conv weight {w[la.name + '.weight'].shape} "
                                            f"does not take an input of shape {shape}")
            (kh, kw), (sh, sw), (ph, pw) = la.attrs["kernel"], la.attrs["strides"], la.attrs["pads"]
            shape = (la.attrs["filters"], (shape[1] + 2 * ph - kh) // sh + 1, (shape[2] + 2 * pw - kw) // sw + 1)
        elif la.kind in ("maxpool", "avgpool"):
            (kh, kw), (sh, sw) = la.attrs["kernel"], la.attrs["strides"]
            shape = (shape[0], (shape[1] - kh) // sh + 1, (shape[2] - kw) // sw + 1)
        elif la.kind == "flatten":
            shape = (int(np.prod(shape)),)
        elif la.kind == "reshape":
            if int(np.prod(la.attrs["shape"])) != int(np.prod(shape)):
                raise UnsupportedModelError(f"layer {la.name!r}: cannot reshape {shape} to {la.attrs['shape']}")
            shape = tuple(la.attrs["shape"])
