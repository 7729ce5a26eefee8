"""``ddl-caffe time``: per-layer forward and backward times, reported as ``caffe time`` does."""

from __future__ import annotations

import logging
import time

import torch

from .net import Net

log = logging.getLogger("ddl.caffe")


class _Clock:
    """Per-layer backward times from one autograd pass: CPU autograd runs the graph's nodes one at
    a time in reverse order, so a layer's backward lies between the moment the gradient of its tops
    is complete and the moment the gradients of its bottoms (or, for the first layer, of its
    parameters) are; hooks stamp those moments."""

    def __init__(self, net: Net) -> None:
        self.stamps: dict[int, float] = {}
        self.param_layer: dict[int, int] = {}
        for i, la in enumerate(net.layers):
            for t in la.blobs:
                if t.requires_grad and id(t) not in self.param_layer:
                    self.param_layer[id(t)] = i
                    t.register_post_accumulate_grad_hook(self._param_hook)  # type: ignore[no-untyped-call]

    def _param_hook(self, t: torch.Tensor) -> None:
        k = id(t)
        self.stamps[k] = max(self.stamps.get(k, 0.0), time.perf_counter())

    def watch(self, t: torch.Tensor) -> None:
        k = id(t)

        def hook(g: torch.Tensor) -> None:
            self.stamps[k] = time.perf_counter()
        t.register_hook(hook)  # type: ignore[no-untyped-call]


def _iteration(net: Net, clock: _Clock, fwd: list[float], bwd: list[float], *, want_loss: bool = False) -> float:
    """One forward (each layer timed) and one backward (attributed per layer by ``clock``)."""
    blobs: dict[str, torch.Tensor] = {}
    outs_of: list[list[torch.Tensor]] = []
    loss: torch.Tensor = torch.zeros(())
    clock.stamps.clear()
    for i, la in enumerate(net.layers):
        ins = [blobs[b] for b in la.bottom]
        t0 = time.perf_counter()
        outs = la.forward(ins)
        fwd[i] += time.perf_counter() - t0
        for j, (name, t) in enumerate(zip(la.top, outs, strict=True)):
            blobs[name] = t
            w = la.loss_weight(j)
            if w:
                loss = loss + (t.sum() if w == 1 else w * t.sum())
            if t.requires_grad:
                clock.watch(t)
        outs_of.append(outs)
    value = float(loss.detach()) if want_loss else 0.0
    if not loss.requires_grad:
        return value
    start = time.perf_counter()
    loss.backward()  # type: ignore[no-untyped-call]
    done: float = start
    for i in range(len(net.layers) - 1, -1, -1):
        la = net.layers[i]
        begin = max([clock.stamps[id(t)] for t in outs_of[i] if id(t) in clock.stamps] or [done])
        ends = [clock.stamps[id(blobs_t)] for blobs_t in _bottoms(net, outs_of, i) if id(blobs_t) in clock.stamps]
        ends += [clock.stamps[id(p)] for p in la.blobs if id(p) in clock.stamps and clock.param_layer.get(id(p)) == i]
        end = max(ends) if ends else begin
        bwd[i] += max(end - begin, 0.0)
        done = max(done, end)
    return value


def _bottoms(net: Net, outs_of: list[list[torch.Tensor]], i: int) -> list[torch.Tensor]:
    """The tensors layer ``i`` read: the latest earlier top of each bottom name."""
    found = []
    for b in net.layers[i].bottom:
        for k in range(i - 1, -1, -1):
            if b in net.layers[k].top:
                found.append(outs_of[k][net.layers[k].top.index(b)])
                break
    return found


def time_net(net: Net, iterations: int) -> dict[str, float]:
    """Run Caffe's benchmark: one warm-up forward/backward, then ``iterations`` timed ones.

    Returns:
        ``forward_ms``, ``backward_ms``, ``total_ms`` (all averages per iteration) and ``loss``.
    """
    n = len(net.layers)
    fwd, bwd = [0.0] * n, [0.0] * n
    clock = _Clock(net)
    log.info("Performing Forward")
    log.info("Performing Backward")
    loss = _iteration(net, clock, [0.0] * n, [0.0] * n, want_loss=True)
    log.info("Initial loss: %g", loss)
    log.info("*** Benchmark begins ***")
    log.info("Testing for %d iterations.", iterations)
    total0 = time.perf_counter()
    for j in range(iterations):
        for p in net.params:
            p.tensor.grad = None
        t0 = time.perf_counter()
        _iteration(net, clock, fwd, bwd)
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
