"""Checking one layer on its own: build it from prototxt text, run it in float64, compare its gradient with finite differences.

The test-suite uses this for every layer type; authors of Python layers can use it too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ddl.caffe.formats import schema
from ddl.caffe.formats.protofile import parse_text
from ddl.caffe.layers.base import Layer
from ddl.caffe.layers.registry import LAYERS


def single_layer(text: str, shapes: Sequence[tuple[int, ...]], *, phase: int = schema.TEST, seed: int = 0,
                 double: bool = True) -> Layer:
    """The layer described by ``text`` (the body of a ``layer { }`` block, bottoms and tops included), set up for
    bottoms of ``shapes``; its learnable blobs in float64 when ``double``."""
    lp = parse_text(text, schema.LayerParameter())
    la = LAYERS[lp.type](lp, phase, torch.Generator().manual_seed(seed))
    la.rank, la.size = 0, 1                                    # type: ignore[attr-defined]
    la.setup([tuple(s) for s in shapes])
    if double:
        la.blobs = [torch.nn.Parameter(b.detach().double(), requires_grad=b.requires_grad) if b.is_floating_point() else b
                    for b in la.blobs]
    return la


def forward(la: Layer, bottoms: Sequence[Any]) -> list[np.ndarray]:
    """The layer's tops (float64 numpy) for numpy or tensor bottoms (float arrays become float64)."""
    ins = [_tensor(b) for b in bottoms]
    with torch.no_grad():
        return [t.detach().double().numpy() for t in la.forward(ins)]


def _tensor(b: Any) -> torch.Tensor:
    t = torch.as_tensor(np.asarray(b) if not isinstance(b, torch.Tensor) else b)
    return t.double() if t.is_floating_point() else t


def gradients(la: Layer, bottoms: Sequence[Any], top_diffs: Sequence[Any], wrt: Sequence[int] = (0,)) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(bottom diffs for ``wrt``, blob diffs) of one backward with the given top diffs (Caffe's Backward)."""
    ins = [_tensor(b) for b in bottoms]
    for i in wrt:
        ins[i] = ins[i].clone().requires_grad_(True)
    for b in la.blobs:
        b.grad = None
    tops = la.forward(ins)
    pairs = [(t, _tensor(d)) for t, d in zip(tops, top_diffs, strict=False) if t.requires_grad]
    torch.autograd.backward([t for t, _ in pairs], [d.reshape(t.shape) for t, d in pairs])
    gb = [_numpy(ins[i].grad, tuple(ins[i].shape)) for i in wrt]
    gp = [_numpy(b.grad, tuple(b.shape)) for b in la.blobs]
    return gb, gp


def _numpy(grad: torch.Tensor | None, shape: tuple[int, ...]) -> np.ndarray:
    return grad.detach().numpy() if grad is not None else np.zeros(shape)


def numeric_check(la: Layer, bottoms: Sequence[Any], wrt: Sequence[int] = (0,), *, params: bool = True,
                  eps: float = 1e-6, atol: float = 1e-5, rtol: float = 1e-3, fast: bool = True) -> None:
    """Assert that the gradient of every top, with respect to bottoms ``wrt`` and (with ``params``) the
    learnable blobs, matches central finite differences (torch.autograd.gradcheck in float64)."""
    base = [_tensor(b) for b in bottoms]
    blobs = [b for b in la.blobs if b.requires_grad] if params else []
    ins = [base[i].clone().requires_grad_(True) for i in wrt]

    def f(*args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        xs = list(base)
        for i, a in zip(wrt, args[: len(wrt)], strict=True):
            xs[i] = a
        saved = list(la.blobs)
        it = iter(args[len(wrt):])
        la.blobs = [next(it) if (b.requires_grad and params) else b for b in saved]
        try:
            return tuple(t for t in la.forward(xs) if t.is_floating_point())
        finally:
            la.blobs = saved
    targets = ins + [b.detach().clone().requires_grad_(True) for b in blobs]
    # State a forward would update (carried recurrent state, BatchNorm averages) stays fixed meanwhile.
    la.update_stats = False
    # fast_mode compares random projections of the Jacobian: the same test at a fraction of the cost.
    assert torch.autograd.gradcheck(f, tuple(targets), eps=eps, atol=atol, rtol=rtol, fast_mode=fast)
