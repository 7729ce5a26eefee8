"""ONNX nodes for each Caffe layer type that has an ONNX counterpart (opset 17), with Caffe's exact semantics."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ddl.caffe.layers.base import Layer, LayerError
from ddl.caffe.layers.detection import prior_boxes
from ddl.caffe.layers.pooling import AVE, MAX, Window

FLT_MIN = 1.1754943508222875e-38


class Graph:
    """The nodes and initializers being built, and the ONNX value name of each Caffe blob."""

    def __init__(self) -> None:
        from onnx import helper, numpy_helper
        self.h, self.nh = helper, numpy_helper
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.names: dict[str, str] = {}
        self.n = 0

    def fresh(self, base: str) -> str:
        self.n += 1
        return f"{base}__{self.n}"

    def const(self, base: str, arr: Any) -> str:
        name = self.fresh(base)
        self.inits.append(self.nh.from_array(np.ascontiguousarray(arr), name))
        return name

    def ints(self, base: str, vals: list[int]) -> str:
        return self.const(base, np.asarray(vals, np.int64))

    def scalar(self, base: str, v: float) -> str:
        return self.const(base, np.float32(v))

    def node(self, op: str, ins: list[str], base: str, **attrs: Any) -> str:
        out = self.fresh(base)
        self.nodes.append(self.h.make_node(op, ins, [out], name=out, **attrs))
        return out

    def multi(self, op: str, ins: list[str], base: str, n: int, **attrs: Any) -> list[str]:
        outs = [self.fresh(base) for _ in range(n)]
        self.nodes.append(self.h.make_node(op, ins, outs, name=outs[0], **attrs))
        return outs


Emit = Callable[[Graph, Layer, list[str], list[tuple[int, ...]], list[tuple[int, ...]]], list[str]]
EMITTERS: dict[str, Emit] = {}


def emits(*types: str) -> Callable[[Emit], Emit]:
    def reg(fn: Emit) -> Emit:
        for t in types:
            EMITTERS[t] = fn
        return fn
    return reg


def blob(la: Layer, i: int) -> np.ndarray:
    return la.blobs[i].detach().cpu().numpy().astype(np.float32)


def a(la: Layer, name: str) -> Any:
    return getattr(la, name)


@emits("Convolution", "Deconvolution")
def _conv(g: Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> list[str]:
    ops = [ins[0], g.const(f"{la.name}_w", blob(la, 0))] + ([g.const(f"{la.name}_b", blob(la, 1))] if len(la.blobs) > 1 else [])
    pads = list(a(la, "pad")) * 2
    op = "Conv" if la.type == "Convolution" else "ConvTranspose"
    return [g.node(op, ops, la.name, kernel_shape=list(a(la, "kernel")), strides=list(a(la, "stride")), pads=pads,
                   dilations=list(a(la, "dilation")), group=a(la, "group"))]


def pool(g: Graph, x: str, shape: tuple[int, ...], w: Window, method: int, n: str) -> str:
    """Caffe's pooling: one ONNX pool when its padding and rounding agree with Caffe's, else explicit Pad + crop."""
    (kh, kw), (sh, sw), (ph, pw), (oh, ow) = w.kernel, w.stride, w.pad, w.out
    h, wd = shape[2], shape[3]

    # Floor rounding is unambiguous in ONNX (and every floor window ends inside the padding, so the
    # AVE divisor is the whole kernel, as in Caffe); a ceil-only window takes the explicit path.
    floor_out = ((h + 2 * ph - kh) // sh + 1, (wd + 2 * pw - kw) // sw + 1)
    if 2 * ph <= kh and 2 * pw <= kw and floor_out == (oh, ow):
        attrs = {"kernel_shape": [kh, kw], "strides": [sh, sw], "pads": [ph, pw, ph, pw]}
        if method == MAX:
            return g.node("MaxPool", [x], n, **attrs)
        return g.node("AveragePool", [x], n, count_include_pad=1, **attrs)
    far_h = max(ph, (oh - 1) * sh + kh - h - ph)
    far_w = max(pw, (ow - 1) * sw + kw - wd - pw)
    fill = g.scalar(n + "_fill", -3.4028234663852886e38 if method == MAX else 0.0)
    xp = g.node("Pad", [x, g.ints(n + "_pads", [0, 0, ph, pw, 0, 0, far_h, far_w]), fill], n + "_pad")
    y = g.node("MaxPool" if method == MAX else "AveragePool", [xp], n + "_pool", kernel_shape=[kh, kw], strides=[sh, sw])
    y = g.node("Slice", [y, g.ints(n + "_s0", [0, 0]), g.ints(n + "_s1", [oh, ow]), g.ints(n + "_ax", [2, 3])], n + "_crop")
    if method == MAX:
        return y
    starts_h = np.arange(oh) * sh - ph
    starts_w = np.arange(ow) * sw - pw
    size_h = np.clip(np.minimum(starts_h + kh, h + ph) - starts_h, 1, None)
    size_w = np.clip(np.minimum(starts_w + kw, wd + pw) - starts_w, 1, None)
    fix = (kh * kw) / (size_h[:, None] * size_w[None, :]).astype(np.float32)
    return g.node("Mul", [y, g.const(n + "_fix", fix.astype(np.float32))], n)


@emits("Pooling")
def _pooling(g: Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> list[str]:
    if a(la, "method") not in (MAX, AVE):
        raise LayerError(f"layer '{la.name}' (Pooling): STOCHASTIC pooling has no ONNX counterpart")
    if len(la.top) > 1:
        raise LayerError(f"layer '{la.name}' (Pooling): the max-pool mask top has no ONNX counterpart")
    return [pool(g, ins[0], shapes[0], a(la, "window"), a(la, "method"), la.name)]


@emits("SPP")
def _spp(g: Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> list[str]:
    parts = [g.node("Flatten", [pool(g, ins[0], shapes[0], w, a(la, "method"), f"{la.name}_l{i}")], f"{la.name}_f{i}", axis=1)
             for i, w in enumerate(a(la, "windows"))]
    return [g.node("Concat", parts, la.name, axis=1) if len(parts) > 1 else parts[0]]


@emits("InnerProduct")
def _ip(g: Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> list[str]:
    n = la.name
    flat = g.node("Flatten", ins, n + "_flat", axis=a(la, "axis"))
    w = blob(la, 0)
    ops = [flat, g.const(f"{n}_w", w.T.copy() if a(la, "transpose") else w)]
    if len(la.blobs) > 1:
        ops.append(g.const(f"{n}_b", blob(la, 1)))
    y = g.node("Gemm", ops, n, transB=1)
    if len(shapes[0][: a(la, "axis")]) == 1:
        return [y]
    return [g.node("Reshape", [y, g.ints(n + "_shape", list(outs[0]))], n + "_r")]


def _unary(op: str, **attrs: Any) -> Emit:
    def emit(g: Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> list[str]:
        return [g.node(op, ins, la.name, **attrs)]
    return emit


EMITTERS.update({"Sigmoid": _unary("Sigmoid"), "TanH": _unary("Tanh"), "AbsVal": _unary("Abs"),
                 "BNLL": _unary("Softplus"), "Dropout": _unary("Identity")})


@emits("ReLU")
def _relu(g: Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> list[str]:
    s = la.lp.relu_param.negative_slope
    return [g.node("LeakyRelu", ins, la.name, alpha=s) if s else g.node("Relu", ins, la.name)]


@emits("ReLU6", "Clip")
def _clip(g: Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> list[str]:
    lo, hi = (0.0, 6.0) if la.type == "ReLU6" else (la.lp.clip_param.min, la.lp.clip_param.max)
    return [g.node("Clip", [ins[0], g.scalar(la.name + "_lo", lo), g.scalar(la.name + "_hi", hi)], la.name)]


@emits("ELU")
def _elu(g: Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> list[str]:
    return [g.node("Elu", ins, la.name, alpha=la.lp.elu_param.alpha)]


@emits("PReLU")
def _prelu(g: Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> list[str]:
    s = blob(la, 0)
    view = s.reshape(()) if a(la, "shared") else s.reshape((-1,) + (1,) * max(len(shapes[0]) - 2, 0))
    return [g.node("PRelu", [ins[0], g.const(la.name + "_slope", view)], la.name)]


def _affine(g: Graph, x: str, n: str, scale: float, shift: float) -> str:
    if scale != 1:
        x = g.node("Mul", [x, g.scalar(n + "_scale", scale)], n + "_mul")
    if shift:
        x = g.node("Add", [x, g.scalar(n + "_shift", shift)], n + "_add")
    return x


@emits("Exp")
def _exp(g: Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> list[str]:
    y = g.node("Exp", [_affine(g, ins[0], la.name, a(la, "inner"), 0.0)], la.name + "_exp")
    return [_affine(g, y, la.name, a(la, "outer"), 0.0) if a(la, "outer") != 1 else y]


@emits("Log")
def _log(g: Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> list[str]:
    y = g.node("Log", [_affine(g, ins[0], la.name, a(la, "scale"), a(la, "shift"))], la.name + "_log")
    return [_affine(g, y, la.name + "_b", a(la, "base_scale"), 0.0) if a(la, "base_scale") != 1 else y]


@emits("Power")
def _power(g: Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> list[str]:
    p = la.lp.power_param
    if p.scale == 0 or p.power == 0:
        value = 1.0 if p.power == 0 else p.shift ** p.power
        return [g.node("Add", [g.node("Mul", [ins[0], g.scalar(la.name + "_z", 0.0)], la.name + "_0"), g.scalar(la.name + "_v", value)], la.name)]
    x = _affine(g, ins[0], la.name, p.scale, p.shift)
    return [x if p.power == 1 else g.node("Pow", [x, g.scalar(la.name + "_p", p.power)], la.name)]


@emits("Swish")
def _swish(g: Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> list[str]:
    s = g.node("Sigmoid", [_affine(g, ins[0], la.name, la.lp.swish_param.beta, 0.0)], la.name + "_sig")
    return [g.node("Mul", [ins[0], s], la.name)]


@emits("Threshold")
def _threshold(g: Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> list[str]:
    gt = g.node("Greater", [ins[0], g.scalar(la.name + "_t", la.lp.threshold_param.threshold)], la.name + "_gt")
    return [g.node("Cast", [gt], la.name, to=1)]


@emits("LRN")
def _lrn(g: Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> list[str]:
    n = la.name
    if a(la, "across"):
        return [g.node("LRN", ins, n, size=a(la, "size"), alpha=a(la, "alpha"), beta=a(la, "beta"), bias=a(la, "k"))]
    size, pad = a(la, "size"), (a(la, "size") - 1) // 2
    sq = g.node("Mul", [ins[0], ins[0]], n + "_sq")
    avg = g.node("AveragePool", [sq], n + "_avg", kernel_shape=[size, size], strides=[1, 1], pads=[pad] * 4, count_include_pad=1, ceil_mode=1)
    s = g.node("Add", [g.node("Mul", [avg, g.scalar(n + "_a", a(la, "alpha"))], n + "_m"), g.scalar(n + "_one", 1.0)], n + "_s")
    return [g.node("Mul", [ins[0], g.node("Pow", [s, g.scalar(n + "_p", -a(la, "beta"))], n + "_pow")], n)]


@emits("BatchNorm")
def _bn(g: Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> list[str]:
    n, c = la.name, shapes[0][1]
    f = float(la.blobs[2].reshape(-1)[0])
    scale = 0.0 if f == 0 else 1.0 / f
    if not a(la, "global_stats"):
        raise LayerError(f"layer '{n}' (BatchNorm) uses batch statistics in this phase; export the TEST phase "
                         "(or set use_global_stats: true)")
    return [g.node("BatchNormalization", [ins[0], g.const(n + "_g", np.ones(c, np.float32)), g.const(n + "_b", np.zeros(c, np.float32)),
                                          g.const(n + "_mean", blob(la, 0) * scale), g.const(n + "_var", blob(la, 1) * scale)],
                   n, epsilon=a(la, "eps"))]


@emits("Scale", "Bias")
def _scale(g: Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> list[str]:
    n, view = la.name, list(a(la, "view"))
    operand = ins[1] if len(ins) == 2 else g.const(n + "_p", blob(la, 0))
    operand = g.node("Reshape", [operand, g.ints(n + "_v", view)], n + "_pv")
    y = g.node("Mul" if la.type == "Scale" else "Add", [ins[0], operand], n + "_op")
    if la.type == "Scale" and a(la, "bias_index") >= 0:
        y = g.node("Add", [y, g.const(n + "_bias", blob(la, a(la, "bias_index")).reshape(view))], n)
    return [y]


@emits("Eltwise")
def _eltwise(g: Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> list[str]:
    op, n = a(la, "op"), la.name
    if op == 1:
        if a(la, "coeff"):
            ins = [g.node("Mul", [x, g.scalar(n + "_c", c)], n + "_k") for x, c in zip(ins, a(la, "coeff"), strict=True)]
        return [g.node("Sum", ins, n)]
    return [g.node("Max", ins, n) if op == 2 else _chain(g, ins, n)]


def _chain(g: Graph, ins: list[str], n: str) -> str:
    y = ins[0]
    for x in ins[1:]:
        y = g.node("Mul", [y, x], n)
    return y


@emits("Concat")
def _concat(g: Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> list[str]:
    return [g.node("Concat", ins, la.name, axis=a(la, "axis")) if len(ins) > 1 else g.node("Identity", ins, la.name)]


@emits("Flatten", "Reshape")
def _reshape(g: Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> list[str]:
    return [g.node("Reshape", [ins[0], g.ints(la.name + "_shape", list(outs[0]))], la.name)]


@emits("Softmax")
def _softmax(g: Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> list[str]:
    return [g.node("Softmax", ins, la.name, axis=a(la, "axis"))]


@emits("Slice")
def _slice(g: Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> list[str]:
    return g.multi("Split", [ins[0], g.ints(la.name + "_sizes", list(a(la, "sizes")))], la.name, len(la.top), axis=a(la, "axis"))


@emits("Split")
def _split(g: Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> list[str]:
    return [ins[0]] * len(la.top)


@emits("Crop")
def _crop(g: Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> list[str]:
    sl = a(la, "slices")
    axes = [i for i, s in enumerate(sl) if s.start is not None]
    return [g.node("Slice", [ins[0], g.ints(la.name + "_b", [sl[i].start for i in axes]), g.ints(la.name + "_e", [sl[i].stop for i in axes]),
                             g.ints(la.name + "_a", axes)], la.name)]


@emits("Tile")
def _tile(g: Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> list[str]:
    return [g.node("Tile", [ins[0], g.ints(la.name + "_r", list(a(la, "reps")))], la.name)]


@emits("Permute")
def _permute(g: Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> list[str]:
    return [g.node("Transpose", ins, la.name, perm=list(a(la, "order")))]


@emits("Reduction")
def _reduction(g: Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> list[str]:
    n, ax = la.name, a(la, "axis")
    op = {1: "ReduceSum", 2: "ReduceL1", 3: "ReduceSumSquare", 4: "ReduceMean"}[a(la, "op")]
    axes = list(range(ax, len(shapes[0])))
    y = g.node(op, [ins[0], g.ints(n + "_axes", axes)] if op == "ReduceSum" else [ins[0]], n + "_r", keepdims=0,
               **({} if op == "ReduceSum" else {"axes": axes}))
    return [_affine(g, y, n, a(la, "coeff"), 0.0)]


@emits("ArgMax")
def _argmax(g: Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> list[str]:
    n, k, ax = la.name, a(la, "k"), a(la, "axis")
    x = ins[0] if ax is not None else g.node("Flatten", ins, n + "_flat", axis=1)
    dim = ax if ax is not None else 1
    vals, idx = g.multi("TopK", [x, g.ints(n + "_k", [k])], n + "_topk", 2, axis=dim, largest=1, sorted=1)
    idx = g.node("Cast", [idx], n + "_idx", to=1)
    if ax is not None:
        return [vals if a(la, "with_values") else idx]
    y = g.node("Concat", [g.node("Unsqueeze", [idx, g.ints(n + "_u", [1])], n + "_ui"),
                          g.node("Unsqueeze", [vals, g.ints(n + "_u2", [1])], n + "_uv")], n + "_cat", axis=1) \
        if a(la, "with_values") else g.node("Unsqueeze", [idx, g.ints(n + "_u", [1])], n + "_ui")
    return [g.node("Reshape", [y, g.ints(n + "_shape", list(outs[0]))], n)]


@emits("MVN")
def _mvn(g: Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> list[str]:
    p, n, s = la.lp.mvn_param, la.name, shapes[0]
    rows = s[0] if p.across_channels else s[0] * s[1]
    x = g.node("Reshape", [ins[0], g.ints(n + "_rows", [rows, -1])], n + "_2d")
    c = g.node("Sub", [x, g.node("ReduceMean", [x], n + "_mean", axes=[1], keepdims=1)], n + "_c")
    if p.normalize_variance:
        sd = g.node("Sqrt", [g.node("ReduceMean", [g.node("Mul", [c, c], n + "_sq")], n + "_var", axes=[1], keepdims=1)], n + "_sd")
        c = g.node("Div", [c, g.node("Add", [sd, g.scalar(n + "_eps", p.eps)], n + "_den")], n + "_n")
    return [g.node("Reshape", [c, g.ints(n + "_back", list(s))], n)]


@emits("Normalize")
def _normalize(g: Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> list[str]:
    p, n, s = la.lp.norm_param, la.name, shapes[0]
    axes = list(range(1, len(s))) if p.across_spatial else [1]
    ss = g.node("ReduceSumSquare", ins, n + "_ss", axes=axes, keepdims=1)
    norm = g.node("Sqrt", [g.node("Add", [ss, g.scalar(n + "_eps", p.eps)], n + "_e")], n + "_norm")
    y = g.node("Div", [ins[0], norm], n + "_div")
    sc = blob(la, 0)
    sc = sc.reshape(()) if p.channel_shared else sc.reshape((1, -1) + (1,) * (len(s) - 2))
    return [g.node("Mul", [y, g.const(n + "_scale", sc)], n)]


@emits("PriorBox")
def _priorbox(g: Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> list[str]:
    arr = prior_boxes(la.lp.prior_box_param, (shapes[0][-2], shapes[0][-1]), (shapes[1][-2], shapes[1][-1]))[None]
    return [g.node("Identity", [g.const(la.name + "_priors", arr.astype(np.float32))], la.name)]


@emits("Parameter")
def _parameter(g: Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> list[str]:
    return [g.node("Identity", [g.const(la.name + "_p", blob(la, 0))], la.name)]


@emits("Embed")
def _embed(g: Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> list[str]:
    idx = g.node("Cast", ins, la.name + "_idx", to=7)
    y = g.node("Gather", [g.const(la.name + "_w", blob(la, 0)), idx], la.name + "_g", axis=0)
    return [g.node("Add", [y, g.const(la.name + "_b", blob(la, 1))], la.name) if len(la.blobs) > 1 else y]


@emits("BatchReindex")
def _reindex(g: Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> list[str]:
    return [g.node("Gather", [ins[0], g.node("Cast", [ins[1]], la.name + "_idx", to=7)], la.name, axis=0)]


@emits("Interp")
def _interp(g: Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> list[str]:
    x = ins[0]
    b, e = a(la, "crop")
    if b or e:
        x = g.node("Slice", [x, g.ints(la.name + "_b", [b, b]), g.ints(la.name + "_e", [shapes[0][2] - e, shapes[0][3] - e]),
                             g.ints(la.name + "_ax", [2, 3])], la.name + "_crop")
    sizes = g.ints(la.name + "_sizes", [shapes[0][0], shapes[0][1], *a(la, "out")])
    return [g.node("Resize", [x, "", "", sizes], la.name, mode="linear", coordinate_transformation_mode="align_corners")]


@emits("Upsample")
def _upsample(g: Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> list[str]:
    if len(ins) == 2:
        raise LayerError(f"layer '{la.name}' (Upsample with a mask): SegNet's unpooling has no ONNX counterpart with Caffe's mask layout")
    sizes = g.ints(la.name + "_sizes", [shapes[0][0], shapes[0][1], *a(la, "out")])
    return [g.node("Resize", [ins[0], "", "", sizes], la.name, mode="nearest", coordinate_transformation_mode="asymmetric",
                   nearest_mode="floor")]


def _lstm_step(g: Graph, n: str, c: str, gates: str, cont: str) -> tuple[str, str]:
    """One LSTMUnit on (N, 4H) gate inputs (i, f, o, g): c = cont f c + i g, h = o tanh(c)."""
    i, f, o, gg = g.multi("Split", [gates], n + "_gates", 4, axis=-1)      # opset 17: equal parts
    i, f, o = (g.node("Sigmoid", [v], n + "_sig") for v in (i, f, o))
    c = g.node("Add", [g.node("Mul", [g.node("Mul", [cont, f], n + "_cf"), c], n + "_fc"),
                      g.node("Mul", [i, g.node("Tanh", [gg], n + "_g")], n + "_ig")], n + "_c")
    return c, g.node("Mul", [o, g.node("Tanh", [c], n + "_tc")], n + "_h")


@emits("LSTMUnit")
def _lstm_unit(g: Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> list[str]:
    n, (_, nn, h) = la.name, shapes[0]
    c0 = g.node("Reshape", [ins[0], g.ints(n + "_c2", [nn, h])], n + "_c0")
    gates = g.node("Reshape", [ins[1], g.ints(n + "_g2", [nn, 4 * h])], n + "_g0")
    cont = g.node("Reshape", [ins[2], g.ints(n + "_k2", [nn, 1])], n + "_k")
    c, hh = _lstm_step(g, n, c0, gates, cont)
    shape = g.ints(n + "_out", [1, nn, h])
    return [g.node("Reshape", [c, shape], n + "_C"), g.node("Reshape", [hh, shape], n + "_H")]


def _recurrent_inputs(g: Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]], width: int) -> tuple[str, str | None, list[str]]:
    """(x W^T + b as (T, N, width), the static input's term or None, initial states (N, H)); zeros when not exposed."""
    n, (t_len, nn) = la.name, shapes[0][:2]
    x = g.node("Reshape", [ins[0], g.ints(n + "_x3", [t_len, nn, -1])], n + "_x")
    pre = g.node("Add", [g.node("MatMul", [x, g.const(n + "_wx", blob(la, 0).T.copy())], n + "_mx"), g.const(n + "_bx", blob(la, 1))], n + "_px")
    static = None
    if a(la, "static"):
        xs = g.node("Reshape", [ins[2], g.ints(n + "_xs2", [nn, -1])], n + "_xs")
        static = g.node("MatMul", [xs, g.const(n + "_ws", blob(la, 2).T.copy())], n + "_ms")
    hidden = a(la, "hidden")
    if a(la, "expose"):
        states = [g.node("Reshape", [s, g.ints(n + "_st", [nn, hidden])], n + "_s0") for s in ins[len(ins) - a(la, "states"):]]
    else:
        states = [g.const(n + "_zero", np.zeros((nn, hidden), np.float32)) for _ in range(a(la, "states"))]
    return pre, static, states


@emits("LSTM")
def _lstm(g: Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> list[str]:
    n, (t_len, nn) = la.name, shapes[0][:2]
    pre, static, (h, c) = _recurrent_inputs(g, la, ins, shapes, 4 * a(la, "hidden"))
    w_hc = g.const(n + "_whc", blob(la, len(la.blobs) - 1).T.copy())
    hs = []
    for t in range(t_len):
        ct = g.node("Reshape", [g.node("Gather", [ins[1], g.ints(n + "_t", [t])], n + "_ct", axis=0), g.ints(n + "_k2", [nn, 1])], n + "_k")
        gx = g.node("Reshape", [g.node("Gather", [pre, g.ints(n + "_t", [t])], n + "_gt", axis=0), g.ints(n + "_g2", [nn, -1])], n + "_gx")
        gates = g.node("Add", [gx, g.node("MatMul", [g.node("Mul", [h, ct], n + "_hc"), w_hc], n + "_mh")], n + "_gi")
        if static is not None:
            gates = g.node("Add", [gates, static], n + "_gs")
        c, h = _lstm_step(g, f"{n}_t{t}", c, gates, ct)
        hs.append(g.node("Unsqueeze", [h, g.ints(n + "_u", [0])], n + "_uh"))
    out = g.node("Concat", hs, n + "_h", axis=0) if len(hs) > 1 else hs[0]
    if not a(la, "expose"):
        return [out]
    return [out, g.node("Unsqueeze", [h, g.ints(n + "_u", [0])], n + "_hT"), g.node("Unsqueeze", [c, g.ints(n + "_u", [0])], n + "_cT")]


@emits("RNN")
def _rnn(g: Graph, la: Layer, ins: list[str], shapes: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> list[str]:
    n, (t_len, nn) = la.name, shapes[0][:2]
    pre, static, (h,) = _recurrent_inputs(g, la, ins, shapes, a(la, "hidden"))
    k = len(la.blobs)
    w_hh, w_ho, b_o = (g.const(n + "_whh", blob(la, k - 3).T.copy()), g.const(n + "_who", blob(la, k - 2).T.copy()),
                       g.const(n + "_bo", blob(la, k - 1)))
    os_ = []
    for t in range(t_len):
        ct = g.node("Reshape", [g.node("Gather", [ins[1], g.ints(n + "_t", [t])], n + "_ct", axis=0), g.ints(n + "_k2", [nn, 1])], n + "_k")
        gx = g.node("Reshape", [g.node("Gather", [pre, g.ints(n + "_t", [t])], n + "_gt", axis=0), g.ints(n + "_g2", [nn, -1])], n + "_gx")
        z = g.node("Add", [gx, g.node("MatMul", [g.node("Mul", [h, ct], n + "_hc"), w_hh], n + "_mh")], n + "_z")
        if static is not None:
            z = g.node("Add", [z, static], n + "_zs")
        h = g.node("Tanh", [z], n + "_h")
        o = g.node("Tanh", [g.node("Add", [g.node("MatMul", [h, w_ho], n + "_mo"), b_o], n + "_po")], n + "_o")
        os_.append(g.node("Unsqueeze", [o, g.ints(n + "_u", [0])], n + "_uo"))
    out = g.node("Concat", os_, n + "_out", axis=0) if len(os_) > 1 else os_[0]
    return [out, g.node("Unsqueeze", [h, g.ints(n + "_u", [0])], n + "_hT")] if a(la, "expose") else [out]
