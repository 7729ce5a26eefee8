"""Caffe's Solver: the Step loop, testing, display, snapshots and restore, with ranks averaging gradients."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ddl.caffe.formats import schema
from ddl.caffe.formats.blobs import to_array
from ddl.caffe.formats.caffemodel import (
    read_hdf5_solverstate,
    write_hdf5_solverstate,
    write_solverstate,
)
from ddl.caffe.formats.errors import CaffeFormatError
from ddl.caffe.formats.protofile import read_binary, read_net
from ddl.caffe.net.net import Net
from ddl.caffe.net.weights import load_weights
from ddl.caffe.solver import lr_policy, updates
from ddl.caffe.solver.exchange import (
    DiffExchange,
    agree_seed,
    average_statistics,
    broadcast_parameters,
)

log = logging.getLogger("ddl.caffe")
HDF5, BINARYPROTO = 0, 1


def _f32(x: float) -> float:
    return float(np.float32(x))


def _fmt(x: float) -> str:
    return f"{x:g}"


def net_params(sp: Any) -> tuple[Any, list[tuple[Any, Any]]]:
    """(train NetParameter, [(test NetParameter, its NetState)]) as Caffe's Solver resolves them.

    Test nets come from test_net_param, then test_net files, then one instance of the generic
    ``net``/``net_param`` per remaining ``test_iter`` (so one net with two test_states gives two).
    """
    given = [f for f in ("net", "net_param", "train_net", "train_net_param") if sp.HasField(f)]
    if len(given) != 1:
        raise CaffeFormatError(f"the solver must give exactly one of net, net_param, train_net, train_net_param; got {given or 'none'}")
    f = given[0]
    train = read_net(getattr(sp, f)) if f in ("net", "train_net") else _upgraded(getattr(sp, f))
    generic = f in ("net", "net_param")
    specific = [_upgraded(p) for p in sp.test_net_param] + [read_net(p) for p in sp.test_net]
    n_iter = len(sp.test_iter)
    if generic and n_iter < len(specific) or not generic and n_iter != len(specific):
        raise CaffeFormatError(f"the solver has {len(specific)} test_net/test_net_param entries and {n_iter} test_iter "
                               "values; give one test_iter per test net")
    tests = specific + [train] * (n_iter - len(specific) if generic else 0)
    if len(sp.test_state) and len(sp.test_state) != len(tests):
        raise CaffeFormatError(f"the solver gives {len(sp.test_state)} test_state entries for {len(tests)} test nets "
                               "(one per test_iter); give none or one per test net")
    if tests and sp.test_interval <= 0:
        raise CaffeFormatError(f"the solver has {len(tests)} test net(s) but no positive test_interval")
    states = []
    for i in range(len(tests)):
        st = schema.NetState(phase=schema.TEST)
        if len(sp.test_state):
            st.MergeFrom(sp.test_state[i])
        states.append(st)
    return train, list(zip(tests, states, strict=True))


def _upgraded(param: Any) -> Any:
    from ddl.caffe.formats.upgrade import upgrade_net
    upgrade_net(param, source="the solver's inline net")
    return param


def check_solver(sp: Any) -> None:
    """Refuse, before any iteration, the settings that would otherwise fail later (or silently differ).

    Raises:
        CaffeFormatError / LrPolicyError: the setting and what to do.
    """
    kind = updates.solver_type(sp)
    # Caffe's AdaGrad and RMSProp solvers abort at construction on these (their constructor_sanity_check).
    if kind in ("AdaGrad", "RMSProp") and sp.momentum != 0:
        raise CaffeFormatError(f"momentum cannot be used with {kind} (Caffe refuses it too); got momentum: {sp.momentum:g}. "
                               f"Remove the momentum line, or use type \"SGD\", \"Nesterov\" or \"Adam\" for momentum")
    if kind == "RMSProp" and not 0 <= sp.rms_decay < 1:
        raise CaffeFormatError(f"rms_decay must lie in [0, 1) for RMSProp, got {sp.rms_decay:g}")
    if not sp.HasField("lr_policy"):
        raise lr_policy.LrPolicyError("the solver needs an lr_policy (e.g. \"fixed\")")
    lr_policy.check(sp)
    if sp.regularization_type not in ("L1", "L2"):
        raise CaffeFormatError(f"regularization_type '{sp.regularization_type}' is unknown; use L2 or L1")
    for name, low in (("iter_size", 1), ("average_loss", 1), ("max_iter", 0)):
        if getattr(sp, name) < low:
            raise CaffeFormatError(f"{name} must be at least {low}, got {getattr(sp, name)}")
    if sp.snapshot < 0 or sp.display < 0:
        raise CaffeFormatError("snapshot and display must not be negative")
    if sp.snapshot and not sp.snapshot_prefix:
        raise CaffeFormatError(f"the solver snapshots every {sp.snapshot} iterations but gives no snapshot_prefix")
    if sp.snapshot_prefix and (sp.snapshot or sp.snapshot_after_train):
        # One probe per process: ranks sharing a folder must not remove each other's.
        probe = Path(f"{sp.snapshot_prefix}_iter_0.{os.getpid()}.tempfile")
        try:
            probe.parent.mkdir(parents=True, exist_ok=True)
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            raise CaffeFormatError(f"cannot write snapshots to '{sp.snapshot_prefix}' ({e.strerror}); make sure "
                                   "that the folder exists and is writable") from None
        if sp.snapshot_format == HDF5:
            import h5py  # noqa: F401  (an install without h5py fails here, not at the first snapshot)
    if sp.debug_info:
        log.warning("debug_info is not supported by ddl-caffe and is ignored")


class Solver:
    """Trains a net as Caffe's SGDSolver family does.

    Args:
        sp: the SolverParameter.
        rank, size: this process among ``size`` ranks of ddl (rank 0 logs and snapshots). With ``size`` > 1,
            ddl must be initialized: the diffs are averaged over the ranks by a :class:`DiffExchange`
            (``solver/exchange.py``: layer by layer during backward when ``layer_wise_reduce``, Caffe's default),
            and rank 0's weights are given to every rank.
    """

    def __init__(self, sp: Any, *, rank: int = 0, size: int = 1, device: torch.device | str | None = None) -> None:
        self.sp, self.rank, self.size = sp, rank, size
        check_solver(sp)
        self.kind = updates.solver_type(sp)
        self.seed = sp.random_seed if sp.random_seed >= 0 else int(time.time_ns() % (1 << 31))
        if size > 1 and sp.random_seed < 0:
            # One seed for the world, so that the data layers deal one shuffled order; each rank's own randomness
            # (dropout, crops) still differs, as _reseed mixes in the rank.
            self.seed = agree_seed(self.seed)
        self.gen = torch.Generator().manual_seed(self.seed)
        train, tests = net_params(sp)
        quiet = rank != 0
        tstate = sp.train_state if sp.HasField("train_state") else schema.NetState(phase=schema.TRAIN)
        self.net = Net(train, schema.TRAIN, gen=self.gen, level=tstate.level if tstate.HasField("level") else None,
                       stages=tuple(tstate.stage), rank=rank, size=size, quiet=quiet, device=device)
        self.test_nets = []
        for tp, st in tests:
            tn = Net(tp, schema.TEST, gen=self.gen, level=st.level if st.HasField("level") else None,
                     stages=tuple(st.stage), quiet=True, device=device)
            tn.share_from(self.net)
            self.test_nets.append(tn)
        self.params = self.net.params
        # BatchNorm's running statistics: each rank's forward moves them, so ranks average them after each update.
        self.statistics = [t for la in self.net.layers if la.type == "BatchNorm" for t in la.blobs[:2]]
        self.history = [torch.zeros_like(p.tensor, requires_grad=False)
                        for _ in range(updates.history_count(self.kind, 1)) for p in self.params]
        self.iter = 0
        self.current_step = 0
        self.losses: list[float] = []
        self.smoothed_loss = 0.0
        self.step_seconds = 0.0
        self.exchange: DiffExchange | None = None
        self.join_world(rank, size)
        if len(sp.weights):
            load_weights(self.net, list(sp.weights))
        self.sync_params()

    # ----------------------------------------------------------------- setup helpers
    def join_world(self, rank: int, size: int) -> None:
        """Take part in a world of ``size`` ranks of ddl as ``rank`` (again, after an elastic resize)."""
        if self.exchange is not None:
            self.exchange.close()
        self.rank, self.size = rank, size
        self.exchange = DiffExchange(self.params, layer_wise=self.sp.layer_wise_reduce) if size > 1 else None

    def sync_params(self) -> None:
        """Give every rank rank 0's weights (and BatchNorm statistics), in one fused broadcast."""
        if self.size > 1:
            broadcast_parameters(self.params)

    def _reseed(self) -> None:
        # With random_seed set (or a world's agreed seed), each iteration's randomness depends only on (seed,
        # iteration, rank), so a run resumed from a snapshot draws exactly what an uninterrupted one does.
        if self.sp.random_seed >= 0 or self.size > 1:
            self.gen.manual_seed((self.seed * 1_000_003 + self.iter * 7919 + self.rank) % (1 << 63))

    # ----------------------------------------------------------------- training
    def _update_smoothed_loss(self, loss: float, start_iter: int) -> None:
        avg = self.sp.average_loss
        if len(self.losses) < avg:
            self.losses.append(loss)
            n = len(self.losses)
            self.smoothed_loss = (self.smoothed_loss * (n - 1) + loss) / n
        else:
            idx = (self.iter - start_iter) % avg
            self.smoothed_loss += (loss - self.losses[idx]) / avg
            self.losses[idx] = loss

    def forward_backward(self) -> tuple[float, dict[str, torch.Tensor]]:
        loss, blobs = self.net.forward()
        if loss.requires_grad:
            loss.backward()  # type: ignore[no-untyped-call]
        return float(loss.detach()), blobs

    def step(self, iters: int, *, on_iter: Callable[[int], None] | None = None) -> None:
        """Run ``iters`` iterations (Caffe's Solver::Step)."""
        sp = self.sp
        start_iter, stop_iter = self.iter, self.iter + iters
        self.losses, self.smoothed_loss = [], 0.0
        shown_at, shown_iter = time.perf_counter(), self.iter
        while self.iter < stop_iter:
            self._zero_diffs()
            if sp.test_interval and self.iter % sp.test_interval == 0 and (self.iter > 0 or sp.test_initialization):
                # Every rank tests (rank 0 alone logs): no rank idles in a collective long
                # enough to trip ddl's stall timeout while rank 0 scores a big test set.
                self.test_all()
            self._reseed()
            display = sp.display and self.iter % sp.display == 0
            t0 = time.perf_counter()
            loss = 0.0
            blobs: dict[str, torch.Tensor] = {}
            for k in range(sp.iter_size):
                if self.exchange is not None:  # the diffs of the last sub-iteration's backward go to the wire
                    self.exchange.begin_backward(last=k == sp.iter_size - 1)
                lv, blobs = self.forward_backward()
                loss += lv
            loss /= sp.iter_size
            self._update_smoothed_loss(loss, start_iter)
            if display and self.rank == 0:
                # Caffe's line: iterations per second and seconds since the last display (at the first, since Step
                # began; Caffe prints an uninitialized count there).
                lapse = time.perf_counter() - shown_at
                log.info("Iteration %d (%s iter/s, %ss/%d iters), loss = %s", self.iter,
                         _fmt(_f32((self.iter - shown_iter) / (lapse or 1))), _fmt(_f32(lapse)), sp.display,
                         _fmt(self.smoothed_loss))
                shown_at, shown_iter = time.perf_counter(), self.iter
                self._log_outputs("Train", self.net, [blobs[o].detach().reshape(-1).tolist() for o in self.net.outputs])
            self.apply_update()
            self.step_seconds += time.perf_counter() - t0
            if sp.snapshot and self.iter % sp.snapshot == 0 and self.rank == 0:
                self.snapshot()
            if on_iter is not None:
                on_iter(self.iter)

    def _zero_diffs(self) -> None:
        if self.exchange is not None:
            self.exchange.zero_diffs()
            return
        for p in self.params:
            p.tensor.grad = None

    def _diffs(self) -> list[torch.Tensor]:
        """Each learnable blob's diff, averaged over the ranks (Caffe's on_gradients_ready before ApplyUpdate)."""
        if self.exchange is not None:
            return self.exchange.averaged_diffs()
        out = []
        for p in self.params:
            if p.tensor.grad is None:
                p.tensor.grad = torch.zeros_like(p.tensor)
            out.append(p.tensor.grad)
        return out

    def apply_update(self) -> None:
        """Caffe's ApplyUpdate: average across ranks, clip, then per param normalize, regularize, update."""
        sp = self.sp
        rate, self.current_step = lr_policy.learning_rate(sp, self.iter, self.current_step)
        if sp.display and self.iter % sp.display == 0 and self.rank == 0:
            log.info("Iteration %d, lr = %s", self.iter, _fmt(rate))
        diffs = self._diffs()
        updates.clip_gradients(diffs, sp.clip_gradients)
        n = len(self.params)
        with torch.no_grad():
            for i, (p, d) in enumerate(zip(self.params, diffs, strict=True)):
                if sp.iter_size > 1:
                    d.mul_(_f32(1.0 / sp.iter_size))
                updates.regularize(d, p.tensor, _f32(sp.weight_decay * p.decay_mult), sp.regularization_type)
                hist = [self.history[i]] + ([self.history[i + n]] if len(self.history) > n else [])
                updates.compute_update(self.kind, d, hist, _f32(rate * p.lr_mult), momentum=_f32(sp.momentum),
                                       momentum2=_f32(sp.momentum2), delta=_f32(sp.delta),
                                       rms_decay=_f32(sp.rms_decay), t=self.iter + 1)
                p.tensor.sub_(d)
        if self.exchange is not None:
            average_statistics(self.statistics)
        self.iter += 1

    def solve(self, resume: str | None = None, *, on_iter: Callable[[int], None] | None = None) -> None:
        """Caffe's Solver::Solve: optional restore, Step to max_iter, final snapshot, loss and test."""
        sp = self.sp
        if self.rank == 0:
            log.info("Solving %s", self.net.name)
            log.info("Learning Rate Policy: %s", sp.lr_policy)
        if resume:
            if self.rank == 0:
                log.info("Restoring previous solver status from %s", resume)
            self.restore(resume)
        start_iter = self.iter
        self.step(sp.max_iter - self.iter, on_iter=on_iter)
        if self.rank == 0 and sp.snapshot_after_train and (not sp.snapshot or self.iter % sp.snapshot != 0):
            self.snapshot()
        if sp.display and self.iter % sp.display == 0:
            with torch.no_grad():
                loss, _ = self.net.forward()
            self._update_smoothed_loss(float(loss), start_iter)
            if self.rank == 0:
                log.info("Iteration %d, loss = %s", self.iter, _fmt(self.smoothed_loss))
        if sp.test_interval and self.iter % sp.test_interval == 0:
            self.test_all()
        if self.rank == 0:
            log.info("Optimization Done.")

    # ----------------------------------------------------------------- testing
    def _log_outputs(self, kind: str, net: Net, values: list[list[float]]) -> None:
        idx = 0
        for name, vals in zip(net.outputs, values, strict=True):
            w = net.loss_weights.get(name, 0.0)
            for v in vals:
                extra = f" (* {_fmt(w)} = {_fmt(w * v)} loss)" if w else ""
                log.info("    %s net output #%d: %s = %s%s", kind, idx, name, _fmt(v), extra)
                idx += 1

    def test_all(self) -> list[list[float]]:
        """Run every test net for its test_iter batches and log Caffe's lines; returns the mean scores."""
        out = []
        for i, tn in enumerate(self.test_nets):
            log.info("Iteration %d, Testing net (#%d)", self.iter, i)
            scores, loss = test_net(tn, self.sp.test_iter[i])
            if self.sp.test_compute_loss:
                log.info("Test loss: %s", _fmt(loss))
            self._log_outputs("Test", tn, scores)
            out.extend(scores)
        return out

    # ----------------------------------------------------------------- snapshots
    def _filename(self, ext: str) -> str:
        return f"{self.sp.snapshot_prefix}_iter_{self.iter}{ext}"

    def snapshot(self) -> tuple[str, str]:
        """Write <prefix>_iter_<N>.caffemodel and .solverstate (or their .h5 forms with snapshot_format: HDF5)."""
        h5 = self.sp.snapshot_format == HDF5
        model = self._filename(".caffemodel.h5" if h5 else ".caffemodel")
        Path(model).parent.mkdir(parents=True, exist_ok=True)
        log.info("Snapshotting to %s %s", "HDF5 file" if h5 else "binary proto file", model)
        self.net.save(model, write_diff=self.sp.snapshot_diff)
        path = self._filename(".solverstate.h5" if h5 else ".solverstate")
        log.info("Snapshotting solver state to %s %s", "HDF5 file" if h5 else "binary proto file", path)
        write = write_hdf5_solverstate if h5 else write_solverstate
        write(path, it=self.iter, learned_net=model, current_step=self.current_step, history=self.history)
        return model, path

    def restore(self, path: str) -> None:
        """Load a .solverstate or .solverstate.h5 (and the model it names) into this solver."""
        if path.endswith(".h5"):
            it, learned, step, hist = read_hdf5_solverstate(path)
        else:
            state = read_binary(path, schema.SolverState())
            it, learned, step = state.iter, state.learned_net, state.current_step
            hist = [to_array(b, where=f"{path}: history blob {i}") for i, b in enumerate(state.history)]
        if learned:
            model = Path(learned)
            if not model.exists() and (Path(path).parent / model.name).exists():
                model = Path(path).parent / model.name
            load_weights(self.net, [str(model)])
        if len(hist) != len(self.history):
            raise CaffeFormatError(
                f"{path}: {len(hist)} history blobs, but a {self.kind} solver on this net keeps "
                f"{len(self.history)}; the state belongs to another net or solver type")
        for i, (arr, h) in enumerate(zip(hist, self.history, strict=True)):
            if arr.size != h.numel():
                raise CaffeFormatError(f"{path}: history blob {i} has shape {list(arr.shape)}, the net's param has {list(h.shape)}")
            h.copy_(torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32).reshape(tuple(h.shape))))
        self.iter, self.current_step = it, step
        skip_consumed_data(self.net, self.iter * self.sp.iter_size)
        self.sync_params()


def skip_consumed_data(net: Net, batches: int) -> None:
    """Advance the train net's Data/HDF5Data/ImageData readers past ``batches`` batches (resume sees new data)."""
    for la in net.layers:
        if la.type == "Data":
            for _ in range(batches * la.batch):                  # type: ignore[attr-defined]
                la.reader.next_raw()                               # type: ignore[attr-defined]
        elif la.type in ("HDF5Data", "ImageData"):
            la.deal.advance(batches * la.batch)                    # type: ignore[attr-defined]


def test_net(net: Net, iters: int) -> tuple[list[list[float]], float]:
    """Forward ``iters`` batches; (mean of each output element, mean loss)."""
    sums: list[np.ndarray] | None = None
    loss = 0.0
    with torch.no_grad():
        for _ in range(iters):
            lv, blobs = net.forward()
            loss += float(lv)
            vals = [blobs[o].detach().reshape(-1).double().cpu().numpy() for o in net.outputs]
            sums = vals if sums is None else [a + b for a, b in zip(sums, vals, strict=True)]
    assert sums is not None
    return [list(s / iters) for s in sums], loss / max(iters, 1)
