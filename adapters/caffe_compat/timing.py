"""``ddl-caffe time``: per-layer forward and backward times, measured and reported as ``caffe time`` does."""

from __future__ import annotations

import logging
import time

import torch

from .net import Net

log = logging.getLogger("ddl.caffe")


class LayerRunner:
    """Runs a net one layer at a time, forward then backward in reverse order, as Caffe's Net does.

    Each layer reads detached copies of its bottoms, so its backward is one ``torch.autograd.backward``
    call that is timed on its own; the bottoms' diffs are then handed to the layers that produced them.
    A bottom gets a diff exactly where Caffe's net analysis says it does (so on a deploy net only the
    parameter gradients are computed, as in Caffe), and a top nobody differentiates gets zeros.
    """

    def __init__(self, net: Net) -> None:
        self.net = net
        self.need = net.bottom_need_backward()

    def iteration(self, fwd: list[float], bwd: list[float]) -> float:
        net = self.net
        blobs: dict[str, torch.Tensor] = {}
        leaves: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
        tops_of: list[list[torch.Tensor]] = []
        diffs: dict[int, torch.Tensor] = {}
        loss = 0.0
        for i, la in enumerate(net.layers):
            ins, pairs = [], []
            for j, b in enumerate(la.bottom):
                src = blobs[b]
                x = src.detach()
                if self.need[i][j] and x.is_floating_point():
                    x.requires_grad_(True)
                    pairs.append((x, src))
                ins.append(x)
            t0 = time.perf_counter()
            tops = net.run_layer(i, ins)
            fwd[i] += time.perf_counter() - t0
            for j, (name, t) in enumerate(zip(la.top, tops, strict=True)):
                blobs[name] = t
                w = la.loss_weight(j)
                if w:
                    loss += w * float(t.detach().sum())
                    if t.requires_grad:
                        diffs[id(t)] = torch.full_like(t, w)           # Caffe's loss top diff: the loss weight
            leaves.append(pairs)
            tops_of.append(tops)
        for i in range(len(net.layers) - 1, -1, -1):
            outs = [t for t in tops_of[i] if t.requires_grad]
            if not outs:
                continue
            grads = [diffs.pop(id(t), None) for t in outs]
            t0 = time.perf_counter()
            torch.autograd.backward(outs, [g if g is not None else torch.zeros_like(t) for g, t in zip(grads, outs, strict=True)])
            bwd[i] += time.perf_counter() - t0
            for x, src in leaves[i]:
                if x.grad is not None and src.requires_grad:
                    prev = diffs.get(id(src))
                    diffs[id(src)] = x.grad if prev is None else prev + x.grad
        return loss


def time_net(net: Net, iterations: int) -> dict[str, float]:
    """Caffe's benchmark: one warm-up forward/backward, then ``iterations`` timed ones, every layer both ways.

    Returns:
        ``forward_ms``, ``backward_ms`` (sums of the per-layer averages), ``total_ms`` (the
        average iteration, wall clock) and ``loss``.
    """
    n = len(net.layers)
    fwd, bwd = [0.0] * n, [0.0] * n
    runner = LayerRunner(net)
    log.info("Performing Forward")
    log.info("Performing Backward")
    loss = runner.iteration([0.0] * n, [0.0] * n)
    log.info("Initial loss: %g", loss)
    log.info("*** Benchmark begins ***")
    log.info("Testing for %d iterations.", iterations)
    total0 = time.perf_counter()
    for j in range(iterations):
        for p in net.params:
            p.tensor.grad = None
        t0 = time.perf_counter()
        runner.iteration(fwd, bwd)
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
