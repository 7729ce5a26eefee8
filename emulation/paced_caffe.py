"""``python -m emulation.paced_caffe --pace K <ddl-caffe arguments>``: ``ddl-caffe`` whose compute leaves the cores
free K/(K+1) of the time, for rehearsals on a machine whose cores every emulated host shares.

Each stretch of a training iteration's compute lasts K+1 times the CPU time it took, the rest asleep: every layer's
forward, backward from one learnable blob's diff to the next (the moments ``ddl-caffe``'s diff exchange starts
buckets) and the update after the averaged diffs. The trainer is the real one (its net, data layers, hooks, buckets,
engine and solver); only the clock is stretched, as if each rank had a compute device of its own K+1 times slower
than a core, and the network stack and the allreduce, which run on the cores, find them mostly free, as they would
beside an accelerator. Measured in CPU time, a stretch lasts the same however busy the machine is (unless the load
delays it past its due time). ``K = 0`` is ``ddl-caffe`` itself.

``--alternate B``: blocks of B iterations alternate between
each rank computing alone (the first block) and the ranks averaging their diffs, all ranks starting each block
together: the rehearsal's compute-only time and its step, from one job.

Example (what ``emulation.caffe_rehearsal --pace`` runs on every rank):
    python -m emulation.paced_caffe --pace 15 train --solver solver.prototxt --threads 1
"""

from __future__ import annotations

import sys
import time
from typing import Any


class Pacer:
    """Stretches each stretch of compute to K+1 times the CPU time it took (a device K+1 times slower than a core,
    whatever else the cores run meanwhile), sleeping the difference in pieces of at least ``quantum`` seconds (a
    sleep costs a wake-up: hundreds of short ones would add their own time)."""

    def __init__(self, k: float, quantum: float = 0.005) -> None:
        self.k, self.quantum = k, quantum
        self.debt = 0.0
        self.start()

    def start(self, *, new_iteration: bool = False) -> None:
        if new_iteration:
            self.debt = 0.0
        self.cpu, self.wall = time.thread_time(), time.perf_counter()

    def pause(self, *_: object, flush: bool = False) -> None:
        """End a stretch of compute: owe (K+1) x its CPU time less the wall time it took; sleep what is owed."""
        self.debt += (self.k + 1) * (time.thread_time() - self.cpu) - (time.perf_counter() - self.wall)
        if self.debt >= self.quantum or (flush and self.debt > 0):
            t0 = time.perf_counter()
            time.sleep(self.debt)
            self.debt -= time.perf_counter() - t0
        self.start()


def install(k: float) -> Pacer:
    """Pace every Net and Solver made from now on in this process."""
    from ddl.caffe.net.net import Net
    from ddl.caffe.solver.solver import Solver

    pacer = Pacer(k)
    net_init, run_layer, forward = Net.__init__, Net.run_layer, Net.forward
    diffs, apply_update = Solver._diffs, Solver.apply_update

    def paced_init(self: Net, *args: Any, **kwargs: Any) -> None:
        net_init(self, *args, **kwargs)
        # Registered before the solver builds its diff exchange, so each pause comes before the bucket's launch.
        for p in self.params:
            if p.tensor.requires_grad:
                p.tensor.register_post_accumulate_grad_hook(pacer.pause)  # type: ignore[no-untyped-call]

    def paced_forward(self: Net, *args: Any, **kwargs: Any) -> Any:
        pacer.start(new_iteration=True)
        return forward(self, *args, **kwargs)

    def paced_run_layer(self: Net, i: int, ins: list[Any]) -> Any:
        tops = run_layer(self, i, ins)
        pacer.pause()
        return tops

    def paced_diffs(self: Solver) -> Any:
        out = diffs(self)
        pacer.start()  # the wait for the other ranks is not compute
        return out

    def paced_update(self: Solver) -> None:
        apply_update(self)
        pacer.pause(flush=True)

    Net.__init__ = paced_init  # type: ignore[method-assign]
    Net.forward = paced_forward  # type: ignore[method-assign]
    Net.run_layer = paced_run_layer  # type: ignore[method-assign]
    Solver._diffs = paced_diffs  # type: ignore[method-assign]
    Solver.apply_update = paced_update  # type: ignore[method-assign]
    return pacer


def alternate(block: int) -> None:
    """Make every Solver alternate blocks of ``block`` iterations with the other ranks and without them: in the
    first block and every other one its diffs stay its own (each rank computing alone, its exchange set aside), in
    the others they are averaged as usual. All ranks wait for each other at each block's start, so both kinds of
    block run with the same processes on the same cores, one after the other."""
    import ddl
    from ddl.caffe.solver.solver import Solver

    step = Solver.step

    def alternating_step(self: Solver, iters: int, *, on_iter: Any = None) -> None:
        stop = self.iter + iters
        while self.iter < stop:
            n = min(block - self.iter % block, stop - self.iter)
            exchange = self.exchange
            if exchange is not None and (self.iter // block) % 2 == 0:
                exchange.reducer.no_sync = True  # its hooks only accumulate
                self.exchange = None
            if ddl.is_initialized() and ddl.size() > 1:
                ddl.barrier()
            try:
                step(self, n, on_iter=on_iter)
            finally:
                self.exchange = exchange

    Solver.step = alternating_step  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[0] != "--pace":
        print("usage: python -m emulation.paced_caffe --pace K [--alternate B] <ddl-caffe arguments>", file=sys.stderr)
        return 2
    try:
        k = float(args[1])
    except ValueError:
        print(f"paced_caffe: --pace {args[1]!r}: give a number >= 0", file=sys.stderr)
        return 2
    if k < 0:
        print(f"paced_caffe: --pace {k:g}: give a number >= 0", file=sys.stderr)
        return 2
    from ddl.caffe.command.cli import main as caffe_main
    from ddl.caffe.command.memory import reuse_freed_memory

    reuse_freed_memory()
    install(k)
    rest = args[2:]
    if rest[:1] == ["--alternate"]:
        alternate(int(rest[1]))
        rest = rest[2:]
    return caffe_main(rest)


if __name__ == "__main__":
    raise SystemExit(main())
