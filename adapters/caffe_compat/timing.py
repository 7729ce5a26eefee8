"""``ddl-caffe time``: per-layer forward and backward times, reported as ``caffe time`` does."""

from __future__ import annotations

import logging
import time

import torch

from .net import Net

log = logging.getLogger("ddl.caffe")


def _forward(net: Net, fwd: list[float]) -> tuple[list[tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]], float]:
    """Forward layer by layer, each on detached bottoms so each layer's backward runs alone."""
    blobs: dict[str, torch.Tensor] = {}
    tape = []
    loss = 0.0
    for i, la in enumerate(net.layers):
        orig = [blobs[b] for b in la.bottom]
        ins = [x.detach().requires_grad_(x.is_floating_point()) for x in orig]
        t0 = time.perf_counter()
        outs = la.forward(ins)
        fwd[i] += time.perf_counter() - t0
        for j, (name, t) in enumerate(zip(la.top, outs, strict=True)):
            blobs[name] = t
            w = la.loss_weight(j)
            if w:
                loss += w * float(t.detach().sum())
        tape.append((orig, ins, outs))
    return tape, loss


def _backward(net: Net, tape: list[tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]], bwd: list[float]) -> None:
    grads: dict[int, torch.Tensor] = {}
    for i in range(len(net.layers) - 1, -1, -1):
        la = net.layers[i]
        orig, ins, outs = tape[i]
        ts, gs = [], []
        for j, t in enumerate(outs):
            g = grads.pop(id(t), None)
            w = la.loss_weight(j)
            if w:
                g = torch.full_like(t, w) if g is None else g + w
            if g is not None and t.requires_grad:
                ts.append(t)
                gs.append(g)
        t0 = time.perf_counter()
        if ts:
            torch.autograd.backward(ts, gs)
        bwd[i] += time.perf_counter() - t0
        for o, x in zip(orig, ins, strict=True):
            if x.grad is not None:
                k = id(o)
                grads[k] = x.grad if k not in grads else grads[k] + x.grad


def time_net(net: Net, iterations: int) -> dict[str, float]:
    """Run Caffe's benchmark: one warm-up forward/backward, then ``iterations`` timed ones.

    Returns:
        ``forward_ms``, ``backward_ms``, ``total_ms`` (all averages per iteration) and ``loss``.
    """
    n = len(net.layers)
    fwd, bwd = [0.0] * n, [0.0] * n
    log.info("Performing Forward")
    tape, loss = _forward(net, [0.0] * n)
    log.info("Initial loss: %g", loss)
    log.info("Performing Backward")
    _backward(net, tape, [0.0] * n)
    log.info("*** Benchmark begins ***")
    log.info("Testing for %d iterations.", iterations)
    total0 = time.perf_counter()
    for j in range(iterations):
        for p in net.params:
            p.tensor.grad = None
        t0 = time.perf_counter()
        tape, _ = _forward(net, fwd)
        _backward(net, tape, bwd)
        log.info("Iteration: %d forward-backward time: %g ms.", j + 1, (time.perf_counter() - t0) * 1e3)
    total = (time.perf_counter() - total0) * 1e3
    log.info("Average time per layer: ")
    for i, la in enumerate(net.layers):
        log.info("%10s\tforward: %g ms.", la.name, fwd[i] * 1e3 / iterations)
        log.info("%10s\tbackward: %g ms.", la.name, bwd[i] * 1e3 / iterations)
    out = {"forward_ms": sum(fwd) * 1e3 / iterations, "backward_ms": sum(bwd) * 1e3 / iterations,
           "total_ms": total / iterations, "loss": loss}
    log.info("Average Forward pass: %g ms.", out["forward_ms"])
    log.info("Average Backward pass: %g ms.", out["backward_ms"])
    log.info("Average Forward-Backward: %g ms.", out["total_ms"])
    log.info("Total Time: %g ms.", total)
    log.info("*** Benchmark ends ***")
    return out
