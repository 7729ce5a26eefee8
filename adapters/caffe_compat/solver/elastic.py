"""``ddl-caffe train --elastic``: the solver's state committed every few iterations, its data readers resharded.

Run under ``ddlrun --elastic``: a lost host ends the world it was in, and the next world
(the hosts left, and those that join) resumes from the last commit, which every host keeps
on its tmpfs (see ``docs/guides/elastic.md``). The state is what Caffe's ``.solverstate``
holds (the weights, the solver's history, ``iter``, the lr policy's ``current_step``) and
how many records the world has read from each ``Data`` layer: a new world positions its
LMDB readers there and deals the following records over its own ranks, so no record is
read twice or skipped. The learning rate is the solver's, for the averaged gradient, in
every world (Caffe's multi-GPU rule); ``base_lr`` is not rescaled on a resize.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import logging
import time
from typing import Any

import torch

import ddl
from ddl.runtime.elastic import State, run, wait_for_host_updates, world_number
from ddl.runtime.elastic.position import DataPosition

from .solver import Solver

log = logging.getLogger("ddl.caffe")
#: The longest ``--wait-for-hosts-at`` holds for an announcement of new hosts.
HOLD_SECONDS = 120.0


def add_arguments(train: argparse.ArgumentParser) -> None:
    """``ddl-caffe train``'s elastic flags."""
    train.add_argument("--elastic", "-elastic", action="store_true",
                       help="train under ddlrun --elastic: commit the solver state, survive lost hosts")
    train.add_argument("--commit-every", "-commit_every", type=int, default=10, metavar="N",
                       help="with --elastic: iterations between commits (default 10)")
    train.add_argument("--wait-for-hosts-at", "-wait_for_hosts_at", type=int, default=0, metavar="ITER",
                       help="with --elastic, in a world smaller than the first: hold at this iteration until "
                            f"ddlrun announces new hosts, at most {HOLD_SECONDS:g} s (demos, tests)")


class CaffeState(State):
    """The solver's weights, history, iteration and lr step, and the position of each Data layer's record stream."""

    def __init__(self, solver: Solver) -> None:
        super().__init__()
        for layer in solver.net.layers:
            if layer.type == "HDF5Data":
                raise ValueError(f"ddl-caffe train --elastic reshards LMDB Data layers; layer '{layer.name}' is "
                                 "HDF5Data, whose rows are split per rank once: convert it to LMDB (ddl-caffe convert)")
        self.solver = solver
        self.positions = {layer.name: DataPosition() for layer in self._data_layers()}
        self.first_size = ddl.size()  # the world size the job started with (travels with the state)
        self._saved: dict[str, Any] = {}
        self.save()

    def _data_layers(self) -> list[Any]:
        return [layer for layer in self.solver.net.layers if layer.type == "Data"]

    def iteration_done(self) -> None:
        """Count the records the world read in the iteration that just ended."""
        for layer in self._data_layers():
            self.positions[layer.name].advance(per_rank=layer.batch * self.solver.sp.iter_size, size=ddl.size())

    def save(self) -> None:
        s = self.solver
        self._saved = {
            "params": [p.tensor.detach().clone() for p in s.params],
            "history": [h.detach().clone() for h in s.history],
            "iter": s.iter, "current_step": s.current_step,
            "positions": {name: p.state_dict() for name, p in self.positions.items()},
            "first_size": self.first_size,
        }

    def restore(self) -> None:
        s, saved = self.solver, self._saved
        with torch.no_grad():
            for p, value in zip(s.params, saved["params"], strict=True):
                p.tensor.copy_(value)
            for h, value in zip(s.history, saved["history"], strict=True):
                h.copy_(value)
        s.iter, s.current_step = int(saved["iter"]), int(saved["current_step"])
        for name, position in saved["positions"].items():
            self.positions.setdefault(name, DataPosition()).load_state_dict(position)
        self.first_size = int(saved["first_size"])
        s.join_world(ddl.rank(), ddl.size())  # a fresh diff exchange: this world's ranks agree on its buckets anew
        reshard(self._data_layers(), self.positions, rank=ddl.rank(), size=ddl.size())

    def saved_bytes(self) -> bytes:
        buffer = io.BytesIO()
        torch.save(self._saved, buffer)
        return buffer.getvalue()

    def load_saved_bytes(self, payload: bytes) -> None:
        self._saved = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=False)


def reshard(layers: list[Any], positions: dict[str, DataPosition], *, rank: int, size: int) -> None:
    """Put each Data layer's reader at the world's position, dealing what follows over ``size`` ranks.

    The records of one LMDB form one endless stream (key order, wrapping); after ``g``
    records read by the world, rank ``r`` of the new world reads records ``g + r``,
    ``g + r + size``, ... (the reader keeps those whose offset from here is ``r`` mod ``size``).
    """
    for layer in layers:
        reader = layer.reader
        reader.rank, reader.size = rank, size
        reader.cursor.first()
        position = positions.get(layer.name, DataPosition())
        for _ in range(position.stream_offset(reader.count)):
            if not reader.cursor.next():
                reader.cursor.first()
        reader.offset = 0


def train(a: argparse.Namespace, solver: Solver) -> None:
    """Run the solver to ``max_iter`` as an elastic job (``ddl-caffe train --elastic``)."""
    sp = solver.sp
    state = CaffeState(solver)
    if a.commit_every < 1:
        raise ValueError(f"--commit-every {a.commit_every}: give a whole number >= 1")

    def on_iteration(iteration: int) -> None:
        state.iteration_done()
        if ddl.rank() == 0:
            loss = solver.smoothed_loss
            print(f"step {iteration:5d} world {world_number()} size {ddl.size()} loss {loss:.4f} t={time.time():.3f}",
                  flush=True)
        if iteration % a.commit_every == 0 or iteration == sp.max_iter:
            if iteration == a.wait_for_hosts_at and ddl.size() < state.first_size \
                    and not wait_for_host_updates(HOLD_SECONDS):
                log.warning("elastic: no new hosts announced in %g s at iteration %d; going on", HOLD_SECONDS,
                            iteration)
            state.commit()

    def report_world() -> None:
        if ddl.rank() == 0:
            log.info("elastic: world %d, %d rank(s), resuming at iteration %d", world_number(), ddl.size(), solver.iter)

    state.register_reset_callbacks([report_world])

    @run
    def solve(state: CaffeState) -> None:
        solver.step(sp.max_iter - solver.iter, on_iter=on_iteration)

    solve(state)
    if ddl.rank() == 0 and sp.snapshot_after_train and sp.snapshot_prefix:
        solver.snapshot()
    if sp.test_interval and solver.iter % sp.test_interval == 0:
        solver.test_all()
    if ddl.rank() == 0:
        log.info("Optimization Done.")
    digest = hashlib.sha256(b"".join(p.tensor.detach().numpy().tobytes() for p in solver.params)).hexdigest()[:16]
    print(f"final rank {ddl.rank()} of {ddl.size()}: step {solver.iter}, iterations {sp.max_iter}, weights {digest}",
          flush=True)
