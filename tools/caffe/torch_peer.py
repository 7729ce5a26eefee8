"""The plain-PyTorch peer of a Caffe net for ``python -m tools.caffe.bench``: the same layers as the F.* calls a user would
write (NCHW, one autograd backward), with the net's own weights, and none of ddl-caffe's bookkeeping."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from ddl.caffe.net.net import Net

Step = Callable[[dict[str, torch.Tensor]], None]


def _step(la: object, ws: list[torch.Tensor]) -> Step:
    t = la.type                                                   # type: ignore[attr-defined]
    bot, top = la.bottom, la.top                                  # type: ignore[attr-defined]
    b0, t0 = bot[0] if bot else "", top[0] if top else ""
    if t == "Convolution":
        s, p, d, g = la.stride, la.pad, la.dilation, la.group     # type: ignore[attr-defined]
        bias = ws[1] if len(ws) > 1 else None
        return lambda v: v.__setitem__(t0, F.conv2d(v[b0], ws[0], bias, s, p, d, g))
    if t == "Pooling":
        w = la.window                                             # type: ignore[attr-defined]
        if la.max:                                                # type: ignore[attr-defined]
            return lambda v: v.__setitem__(t0, F.max_pool2d(v[b0], w.kernel, w.stride, w.pad, ceil_mode=w.ceil))
        return lambda v: v.__setitem__(t0, F.avg_pool2d(v[b0], w.kernel, w.stride, w.pad, ceil_mode=w.ceil))
    if t == "ReLU":
        return lambda v: v.__setitem__(t0, F.relu(v[b0]))
    if t == "LRN":
        n, al, be, k = la.size, la.alpha, la.beta, la.k           # type: ignore[attr-defined]
        return lambda v: v.__setitem__(t0, F.local_response_norm(v[b0], n, al, be, k))
    if t == "Concat":
        ax = la.axis                                              # type: ignore[attr-defined]
        return lambda v: v.__setitem__(t0, torch.cat([v[b] for b in bot], ax))
    if t == "InnerProduct":
        bias = ws[1] if len(ws) > 1 else None
        return lambda v: v.__setitem__(t0, F.linear(v[b0].flatten(1), ws[0], bias))
    if t == "Dropout":
        r = la.lp.dropout_param.dropout_ratio                     # type: ignore[attr-defined]
        return lambda v: v.__setitem__(t0, F.dropout(v[b0], r, True))
    if t == "BatchNorm":
        return lambda v: v.__setitem__(t0, F.batch_norm(v[b0], None, None, training=True, eps=la.eps))   # type: ignore[attr-defined]
    if t == "Scale":
        view = la.view                                            # type: ignore[attr-defined]
        return lambda v: v.__setitem__(t0, v[b0] * ws[0].view(view) + ws[1].view(view))
    if t == "Eltwise":
        return lambda v: v.__setitem__(t0, v[bot[0]] + v[bot[1]])
    if t == "Softmax":
        return lambda v: v.__setitem__(t0, torch.softmax(v[b0], 1))
    if t == "SoftmaxWithLoss":
        return lambda v: v.__setitem__(t0, F.cross_entropy(v[b0].flatten(1), v[bot[1]].long()))
    if t == "Flatten":
        return lambda v: v.__setitem__(t0, v[b0].flatten(1))
    raise ValueError(f"the plain-PyTorch peer has no {t} layer")


def peer(net: Net, inputs: dict[str, torch.Tensor]) -> Callable[[], None]:
    """A callable running the net's forward and backward in plain PyTorch on ``inputs`` (the data tops)."""
    steps = []
    params: list[torch.Tensor] = []
    for la in net.layers:
        if la.is_data:
            continue
        ws = [b.detach().clone().requires_grad_(b.requires_grad) for b in la.blobs]
        params += ws
        steps.append(_step(la, ws))
    loss_top = [la.top[0] for la in net.layers if la.is_loss]

    def run() -> None:
        v = dict(inputs)
        for s in steps:
            s(v)
        out = v[loss_top[0]] if loss_top else sum(v[o].sum() for o in net.outputs)
        out.backward()                                           # type: ignore[union-attr]
        for p in params:
            p.grad = None
    return run
