"""``ddl-caffe time``: per-layer forward and backward times, measured and reported as ``caffe time`` does."""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from ddl.caffe.net.net import Net

log = logging.getLogger("ddl.caffe")


class LayerRunner:
    """Runs a net forward layer by layer (each timed) and backward as Caffe's Net does, with per-layer times.

    A net with a loss runs one autograd pass: each layer reads its own view of every bottom that needs a
    diff, so a hook on that view marks the end of that layer's backward, and a hook on each top the
    start (its diff complete: every consumer done). CPU autograd runs the nodes one at a time, later
    layers first, so the per-layer spans add up to the pass. A net without a loss (a deploy net) runs,
    as Caffe's ``time`` does there, every layer's backward on its own with zero top diffs: parameter
    gradients only, no bottom diffs (Caffe's net analysis gives none).
    """

    def __init__(self, net: Net) -> None:
        self.net = net
        self.need = net.bottom_need_backward()
        self.has_loss = any(la.loss_weight(j) for la in net.layers for j in range(len(la.top)))
        self.stamps: dict[int, float] = {}
        self.backward_seconds = 0.0          # wall time of the last one-pass backward
        self.param_layer: dict[int, int] = {}
        for i, la in enumerate(net.layers):
            if any(self.need[i]):
                continue                        # its bottoms' views mark the end of its backward
            for t in la.blobs:
                if t.requires_grad and id(t) not in self.param_layer:
                    self.param_layer[id(t)] = i
                    t.register_post_accumulate_grad_hook(self._param_done)  # type: ignore[no-untyped-call]

    def _param_done(self, t: torch.Tensor) -> None:
        i = self.param_layer[id(t)]
        self.stamps[-1 - i] = max(self.stamps.get(-1 - i, 0.0), time.perf_counter())

    def _stamp(self, key: int) -> Any:
        def hook(g: torch.Tensor) -> None:
            self.stamps[key] = max(self.stamps.get(key, 0.0), time.perf_counter())
        return hook

    def iteration(self, fwd: list[float], bwd: list[float]) -> float:
        return self._one_pass(fwd, bwd) if self.has_loss else self._per_layer(fwd, bwd)

    def _one_pass(self, fwd: list[float], bwd: list[float]) -> float:
        net, n = self.net, len(self.net.layers)
        blobs: dict[str, torch.Tensor] = {}
        producer: dict[str, int] = {}
        consumers: list[list[int]] = [[] for _ in range(n)]
        self.stamps.clear()
        roots: list[torch.Tensor] = []
        grads: list[torch.Tensor] = []
        loss = 0.0
        tops_of: list[list[torch.Tensor]] = []
        for i, la in enumerate(net.layers):
            ins = []
            for j, b in enumerate(la.bottom):
                x = blobs[b]
                if self.need[i][j] and x.requires_grad:
                    # This layer's own handle on the bottom: its gradient marks the end of this layer's
                    # backward, and (over all readers) the start of the producer's.
                    x = x.view_as(x)
                    x.register_hook(self._stamp(n + i))                # type: ignore[no-untyped-call]
                    consumers[producer[b]].append(i)
                elif x.requires_grad:
                    x = x.detach()
                ins.append(x)
            t0 = time.perf_counter()
            tops = net.run_layer(i, ins)
            fwd[i] += time.perf_counter() - t0
            for j, (name, t) in enumerate(zip(la.top, tops, strict=True)):
                blobs[name] = t
                producer[name] = i
                w = la.loss_weight(j)
                if w:
                    loss += w * float(t.detach().sum())
                    if t.requires_grad:
                        roots.append(t)
                        grads.append(torch.full_like(t, w))
            tops_of.append(tops)
        start = time.perf_counter()
        if roots:
            torch.autograd.backward(roots, grads)
        done = time.perf_counter()
        self.backward_seconds = done - start
        # A layer's span starts when its top diffs are complete and the layer before it in the run has
        # finished: parallel branches become ready together but run one after another.
        spans = []
        for i in range(n):
            if any(t.requires_grad for t in tops_of[i]):
                ready = max([self.stamps.get(n + c, start) for c in consumers[i]] or [start])
                end = max(self.stamps.get(n + i, 0.0), self.stamps.get(-1 - i, 0.0)) or ready
                spans.append((min(end, done), ready, i))
        prev = start
        for end, ready, i in sorted(spans):
            begin = max(ready, prev)
            bwd[i] += max(end - begin, 0.0)
            prev = max(prev, end)
        return loss

    def _per_layer(self, fwd: list[float], bwd: list[float]) -> float:
        net = self.net
        blobs: dict[str, torch.Tensor] = {}
        tops_of: list[list[torch.Tensor]] = []
        for i, la in enumerate(net.layers):
            ins = [blobs[b].detach() for b in la.bottom]
            t0 = time.perf_counter()
            tops = net.run_layer(i, ins)
            fwd[i] += time.perf_counter() - t0
            blobs.update(zip(la.top, tops, strict=True))
            tops_of.append(tops)
        for i in range(len(net.layers) - 1, -1, -1):
            outs = [t for t in tops_of[i] if t.requires_grad]
            if outs:
                t0 = time.perf_counter()
                torch.autograd.backward(outs, [torch.zeros_like(t) for t in outs])
                bwd[i] += time.perf_counter() - t0
        return 0.0


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
