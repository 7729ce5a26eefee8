"""Keras recipes on 2-3 ranks, each against one process on the same global batches (one TensorFlow import per rank).

The questions the torch matrix asks, for ``dk.DistributedOptimizer(shard_optimizer_state=True)``,
``dk.LocalSGD``, ``dk.DiLoCo`` and PowerSGD, with Keras's learning-rate schedules and its
``LossScaleOptimizer`` (what ``model.compile`` wraps an optimizer in under ``mixed_float16``),
inside and around ddl's optimizers, fresh and resumed through ``ddl.tensorflow.keras.checkpoint``.
Each configuration is trained fresh (saving a checkpoint at SAVE_AT, which changes nothing) and
resumed from it in new objects; each prints
``KERAS <configuration> <fresh|resumed-same|resumed-from-N> ranks=<P> max_abs_diff=<d> identical=<yes|no> ok=<yes|no>``;
``REFUSED <what> ranks=<P> ok=<yes|no> message=...`` where a combination is refused.

References: one process (``model.fit`` on whole batches); for PowerSGD, one process running
it (a DistributedOptimizer over a one-rank process set); for LocalSGD and DiLoCo, their
replicas simulated in one process (custom loops, rounds here). Under a loss scaler, one
variable's gradient (a ``Spike`` layer's) is infinite on rank 1 at step OVERFLOW: a sharded
optimizer's owner of it alone would see it.

Usage: ``worker_recipe_keras.py --folder DIR`` (fresh cases, saving checkpoints under
DIR/p<P>) or ``--other N`` (only resuming what N ranks saved there).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

import keras  # noqa: E402

import ddl  # noqa: E402
import ddl.tensorflow as dtf  # noqa: E402
import ddl.tensorflow.keras as dk  # noqa: E402

dtf.init()
R, P = dtf.rank(), dtf.size()
B, STEPS, SAVE_AT, OVERFLOW = 12, 8, 4, 2
TOLERANCE = 1e-6
FOLDER = Path(sys.argv[sys.argv.index("--folder") + 1])
OTHER = int(sys.argv[sys.argv.index("--other") + 1]) if "--other" in sys.argv else None
SINGLE = [ddl.add_process_set([r]) for r in range(P)]
rng = np.random.default_rng(44)
X = np.concatenate([rng.normal(size=(STEPS * B, 8)), np.zeros((STEPS * B, 1))], axis=1).astype(np.float32)
Y = rng.normal(size=(STEPS * B, 4)).astype(np.float32)
X_OVER = X.copy()
X_OVER[OVERFLOW * B + 6 : OVERFLOW * B + 8, -1] = 1.0  # rows of rank 1's shard at 2 ranks and at 3
failed: list[str] = []


class Spike(keras.layers.Layer):
    """Passes the features on; its weight's gradient is inf in a batch whose last column holds a 1
    (an overflow in one variable), zero otherwise."""

    def build(self, shape: Any) -> None:
        self.w = self.add_weight(shape=(int(shape[-1]) - 1,), initializer="zeros", name="spike")

    def call(self, inputs: Any) -> Any:
        x, hit = inputs[:, :-1], tf.reduce_any(inputs[:, -1] > 0)

        @tf.custom_gradient
        def touch(w: Any) -> Any:
            def grad(dy: Any) -> Any:
                return tf.where(hit, tf.fill(tf.shape(w), tf.constant(np.inf, w.dtype)), tf.zeros_like(w))
            return tf.identity(w), grad

        return x + tf.cast(0.0, x.dtype) * touch(tf.cast(tf.convert_to_tensor(self.w), x.dtype))


def mlp(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((9,)), Spike(), keras.layers.Dense(16, activation="tanh"),
                             keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(4)])


def rows(a: np.ndarray, steps: range, rank: int, world: int) -> np.ndarray:
    """``rank``'s rows of the global batches ``steps`` (all of them for world 1)."""
    n = B // world
    return np.concatenate([a[s * B + rank * n : s * B + (rank + 1) * n] for s in steps])


def fit(model: keras.Model, opt: Any, steps: range, *, rank: int = R, world: int = P, x: np.ndarray = X,
        callbacks: Any = ()) -> None:
    if not model.compiled or model.optimizer is not opt:
        model.compile(optimizer=opt, loss="mse")
    model.fit(rows(x, steps, rank, world), rows(Y, steps, rank, world), batch_size=B // world, epochs=1,
              shuffle=False, verbose=0, callbacks=list(callbacks))


def step_eager(model: keras.Model, opt: Any, step: int, rank: int, world: int, x: np.ndarray) -> None:
    """One step of a replica in a custom loop (the loss as model.fit's: the batch's mean square)."""
    xb, yb = rows(x, range(step, step + 1), rank, world), rows(Y, range(step, step + 1), rank, world)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(xb, training=True) - yb))
        scaled = opt.scale_loss(loss)
    opt.apply(tape.gradient(scaled, model.trainable_variables), model.trainable_variables)


def weights(model: keras.Model) -> np.ndarray:
    return np.concatenate([np.asarray(w).reshape(-1) for w in model.get_weights()])


def report(case: str, model: keras.Model, ref: np.ndarray | keras.Model, note: str = "",
           tolerance: float = TOLERANCE) -> None:
    mine = weights(model)
    want = ref if isinstance(ref, np.ndarray) else weights(ref)
    d = float(np.abs(mine - want).max()) if np.isfinite(mine).all() else float("inf")
    same = len({w.tobytes() for w in dtf.allgather_object(mine)}) == 1
    ok = all(dtf.allgather_object(d <= tolerance and same))
    if R == 0:
        print(f"KERAS {case} ranks={P} max_abs_diff={d:.3g} identical={'yes' if same else 'no'}{note} "
              f"ok={'yes' if ok else 'no'}", flush=True)
    if not ok:
        failed.append(case)


def attempt(case: str, fn: Any) -> None:
    try:
        fn()
    except Exception as exc:  # the case reports what it got
        if R == 0:
            print(f"KERAS {case} ranks={P} error={type(exc).__name__}: {str(exc)[:300]!r} ok=no", flush=True)
        failed.append(case)


def refused(what: str, words: tuple[str, ...], fn: Any) -> None:
    try:
        fn()
    except Exception as exc:  # the refusal under test
        ok, message = all(w in str(exc) for w in words), str(exc)
    else:
        ok, message = False, "(not refused)"
    ok = all(dtf.allgather_object(ok))
    if R == 0:
        print(f"REFUSED {what} ranks={P} ok={'yes' if ok else 'no'} message={message[:150]!r}", flush=True)
    if not ok:
        failed.append(what)


def schedule() -> Any:
    """A warm-up then cosine decay (Keras 3's CosineDecay with warmup_steps)."""
    return keras.optimizers.schedules.CosineDecay(0.001, decay_steps=6, warmup_target=0.01, warmup_steps=3)


def sgd() -> keras.optimizers.Optimizer:
    return keras.optimizers.SGD(0.05, momentum=0.9)


def lso(inner: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
    return keras.optimizers.LossScaleOptimizer(inner, initial_scale=1024.0, dynamic_growth_steps=3)


def powersgd(inner: Any, process_set: Any = None) -> Any:
    return dk.DistributedOptimizer(inner, compression=ddl.PowerSGD(rank=1, start_iter=2), process_set=process_set)


def one_process(make: Any, x: np.ndarray = X) -> keras.Model:
    model = mlp(0)
    fit(model, make(), range(STEPS), rank=0, world=1, x=x)
    return model


# -- LocalSGD / DiLoCo simulated in one process ----------------------------------------------------
class Replicas:
    """``world`` replicas of a Keras LocalSGD/DiLoCo job stepped one after the other, rounds here."""

    def __init__(self, kind: str, make_inner: Any, world: int, *, period: int, overlap: int = 0) -> None:
        self.kind, self.make_inner, self.period, self.overlap = kind, make_inner, period, overlap
        self.models = [mlp(0) for _ in range(world)]
        self.opts = [make_inner() for _ in range(world)]
        self.anchor = [np.asarray(v).copy() for v in self.models[0].trainable_variables]
        self.outer_vars = [keras.Variable(a) for a in self.anchor]
        self.outer = keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True)
        self.steps = self.unsent = self.merge_at = 0
        self.in_flight = False
        self.boundary: list[list[np.ndarray]] = []

    def tvs(self, r: int) -> list[Any]:
        return self.models[r].trainable_variables

    def step(self, step: int, x: np.ndarray) -> None:
        for r, (m, opt) in enumerate(zip(self.models, self.opts, strict=True)):
            step_eager(m, opt, step, r, len(self.models), x)
        self.steps += 1
        self.unsent += 1
        if self.overlap and self.in_flight and self.steps >= self.merge_at:
            self.merge()
        if self.steps % self.period == 0:
            self.round()

    def average(self, of: list[list[np.ndarray]]) -> list[np.ndarray]:
        return [np.mean(np.stack([a - w[i] for w in of]).astype(np.float64), axis=0).astype(np.float32)
                for i, a in enumerate(self.anchor)]

    def outer_update(self, averaged: list[np.ndarray]) -> None:
        if self.kind == "localsgd":
            self.anchor = [a - d for a, d in zip(self.anchor, averaged, strict=True)]
            return
        for v, a in zip(self.outer_vars, self.anchor, strict=True):
            v.assign(a)
        self.outer.apply([tf.constant(d) for d in averaged], self.outer_vars)
        self.anchor = [np.asarray(v).copy() for v in self.outer_vars]

    def now(self) -> list[list[np.ndarray]]:
        return [[np.asarray(v).copy() for v in self.tvs(r)] for r in range(len(self.models))]

    def round(self) -> None:
        if not self.overlap:
            self.outer_update(self.average(self.now()))
            self.set_all(self.anchor)
        else:
            self.boundary = self.now()
            self.in_flight, self.merge_at = True, self.steps + self.overlap
        self.unsent = 0

    def merge(self) -> None:
        moved = [[w - b for w, b in zip(ws, bs, strict=True)] for ws, bs in zip(self.now(), self.boundary, strict=True)]
        self.outer_update(self.average(self.boundary))
        for r, ds in enumerate(moved):
            for v, a, d in zip(self.tvs(r), self.anchor, ds, strict=True):
                v.assign(a + d)
        self.in_flight = False

    def set_all(self, values: list[np.ndarray]) -> None:
        for r in range(len(self.models)):
            for v, a in zip(self.tvs(r), values, strict=True):
                v.assign(a)

    def synchronize(self) -> None:
        if self.in_flight:
            self.merge()
        if self.unsent:
            self.outer_update(self.average(self.now()))
            self.set_all(self.anchor)
            self.unsent = 0

    def regroup(self, world: int) -> None:
        """On at another world size from the synchronized weights, with the replicas' mean inner
        optimizer slots and rank 0's counters (what a checkpoint gives)."""
        self.synchronize()
        old = self.opts
        self.models = [mlp(0) for _ in range(world)]
        self.set_all(self.anchor)
        self.opts = [self.make_inner() for _ in range(world)]
        for opt, m in zip(self.opts, self.models, strict=True):
            opt.build(m.trainable_variables)
            for v, *theirs in zip(opt.variables, *(o.variables for o in old), strict=True):
                scalar = tuple(v.shape) == ()
                v.assign(np.asarray(theirs[0]) if scalar else
                         np.mean(np.stack([np.asarray(t) for t in theirs]).astype(np.float64), axis=0).astype(np.float32))

    def model(self) -> keras.Model:
        return self.models[0]


def simulated(kind: str, make_inner: Any, x: np.ndarray, *, period: int, overlap: int = 0,
              saved_by: int | None = None) -> keras.Model:
    sim = Replicas(kind, make_inner, saved_by or P, period=period, overlap=overlap)
    for step in range(STEPS):
        if saved_by is not None and step == SAVE_AT:
            sim.regroup(P)
        sim.step(step, x)
    sim.synchronize()
    return sim.model()


# -- the configurations: each trained fresh (saving at SAVE_AT) and resumed ---------------------------
class Config:
    """A Keras recipe: its optimizer (``make(process_set)``), its data, its reference's key."""

    def __init__(self, make: Any, x: np.ndarray, ref: str, *, broadcast: bool = False) -> None:
        self.make, self.x, self.ref, self.broadcast = make, x, ref, broadcast


CONFIGS = {
    "sharded-warmup-cosine-schedule-broadcast": Config(
        lambda ps=None: dk.DistributedOptimizer(keras.optimizers.Adam(schedule()), shard_optimizer_state=True), X,
        "adam-schedule", broadcast=True),
    "sharded-inside-lossscale-one-overflow": Config(
        lambda ps=None: lso(dk.DistributedOptimizer(keras.optimizers.Adam(0.01), shard_optimizer_state=True)), X_OVER,
        "lossscale-adam"),
    "lossscale-inside-distributed-one-overflow": Config(lambda ps=None: dk.DistributedOptimizer(lso(sgd())), X_OVER,
                                                        "lossscale-sgd"),
    "distributed-inside-lossscale-one-overflow": Config(lambda ps=None: lso(dk.DistributedOptimizer(sgd())), X_OVER,
                                                        "lossscale-sgd"),
    "powersgd-around-lossscale-one-overflow": Config(lambda ps=None: powersgd(lso(sgd()), ps), X_OVER, "powersgd"),
    "powersgd-inside-lossscale-one-overflow": Config(lambda ps=None: lso(powersgd(sgd(), ps)), X_OVER, "powersgd"),
    "localsgd-around-lossscale-one-overflow": Config(lambda ps=None: dk.LocalSGD(lso(sgd()), period=3), X_OVER,
                                                     "localsgd"),
    "localsgd-inside-lossscale-one-overflow": Config(lambda ps=None: lso(dk.LocalSGD(sgd(), period=3)), X_OVER,
                                                     "localsgd"),
    "diloco-overlap-warmup-cosine-schedule": Config(
        lambda ps=None: dk.DiLoCo(keras.optimizers.Adam(schedule()), period=2, overlap=1), X, "diloco"),
}
_references: dict[tuple[str, int | None], np.ndarray] = {}


def reference(key: str, saved_by: int | None = None) -> np.ndarray:
    """The reference weights of ``key`` (LocalSGD/DiLoCo: resumed from ``saved_by`` ranks at
    SAVE_AT), computed once per process. PowerSGD's inside and around a loss scaler share one:
    one process runs the same arithmetic either way."""
    cache = (key, saved_by if key in ("localsgd", "diloco") else None)
    if cache not in _references:
        if key == "localsgd":
            model = simulated("localsgd", lambda: lso(sgd()), X_OVER, period=3, saved_by=saved_by)
        elif key == "diloco":
            model = simulated("diloco", lambda: keras.optimizers.Adam(schedule()), X, period=2, overlap=1,
                              saved_by=saved_by)
        elif key == "powersgd":
            model = mlp(0)
            fit(model, powersgd(lso(sgd()), SINGLE[R]), range(STEPS), rank=0, world=1, x=X_OVER)
        else:
            make = {"adam-schedule": lambda: keras.optimizers.Adam(schedule()),
                    "lossscale-adam": lambda: lso(keras.optimizers.Adam(0.01)), "lossscale-sgd": lambda: lso(sgd())}
            model = one_process(make[key], X if key == "adam-schedule" else X_OVER)
        _references[cache] = weights(model)
    return _references[cache]


def synchronized(opt: Any) -> None:
    """LocalSGD/DiLoCo (inside a loss scaler or not): every rank to the same weights."""
    periodic = opt if hasattr(opt, "synchronize") else getattr(opt, "inner_optimizer", None)
    if periodic is not None and hasattr(periodic, "synchronize"):
        periodic.synchronize()


def resume(config: Config, folder: Path) -> keras.Model:
    again = mlp(50 + R)  # another start: everything must come from the checkpoint
    opt = config.make()
    again.compile(optimizer=opt, loss="mse")
    opt.build(again.trainable_variables)
    extra = dk.checkpoint.load(folder, model=again, optimizer=opt)
    assert extra == {"step": SAVE_AT}, extra
    fit(again, opt, range(SAVE_AT, STEPS), x=config.x)
    synchronized(opt)
    return again


def configurations() -> None:
    for name, config in CONFIGS.items():
        def run(name: str = name, config: Config = config) -> None:
            model = mlp(0 if R == 0 or not config.broadcast else 100 + R)
            opt = config.make()
            folder = FOLDER / f"p{P}" / f"keras-{name}"
            start = [dk.callbacks.BroadcastGlobalVariablesCallback(0)] if config.broadcast else []
            fit(model, opt, range(SAVE_AT), x=config.x, callbacks=start)
            dk.checkpoint.save(folder, model=model, optimizer=opt, extra={"step": SAVE_AT})  # changes nothing
            fit(model, opt, range(SAVE_AT, STEPS), x=config.x)
            synchronized(opt)
            note = ""
            if config.ref == "powersgd":
                note = f" vs_unscaled_without_the_step={np.abs(reference('powersgd') - unscaled_powersgd()).max():.3g}"
            report(f"{name} fresh", model, reference(config.ref), note)
            report(f"{name} resumed-same", resume(config, folder), model)

        attempt(name, run)


def unscaled_powersgd() -> np.ndarray:
    """PowerSGD without a loss scale, leaving the overflowing step out (one process)."""
    if ("unscaled", None) not in _references:
        model = mlp(0)
        plain = powersgd(sgd(), SINGLE[R])
        fit(model, plain, range(OVERFLOW), rank=0, world=1)
        fit(model, plain, range(OVERFLOW + 1, STEPS), rank=0, world=1)
        _references[("unscaled", None)] = weights(model)
    return _references[("unscaled", None)]


def refusals() -> None:
    refused("sharded-around-lossscale-at-construction", ("LossScaleOptimizer(DistributedOptimizer(", "mixed_float16"),
            lambda: dk.DistributedOptimizer(lso(keras.optimizers.Adam(0.01)), shard_optimizer_state=True))


def mixed_precision() -> None:
    """``mixed_float16``: compile wraps the DistributedOptimizer in a LossScaleOptimizer. float16
    arithmetic on half batches differs from one process's (so a looser bound); a rank's overflow
    is skipped on every rank, and one holding a LossScaleOptimizer already is refused."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        ref = one_process(sgd, X_OVER)
        model = mlp(0)
        fit(model, dk.DistributedOptimizer(sgd()), range(STEPS), x=X_OVER)
        wrapped = type(model.optimizer).__name__ == "LossScaleOptimizer"
        scale = float(model.optimizer.dynamic_scale.numpy()) if wrapped else 0.0
        report("mixed_float16-compile-wraps-distributed-one-overflow fresh", model, ref,
               f" compiled=LossScaleOptimizer(DistributedOptimizer) scale={scale:g}", tolerance=1e-2)
        refused("mixed_float16-compile-around-distributed-holding-lossscale", ("unscaled twice", "auto_scale_loss"),
                lambda: mlp(0).compile(optimizer=dk.DistributedOptimizer(lso(sgd())), loss="mse"))
    finally:
        keras.mixed_precision.set_global_policy("float32")


def other_world() -> None:
    assert OTHER is not None
    for name, config in CONFIGS.items():
        attempt(name, lambda name=name, config=config: report(
            f"{name} resumed-from-{OTHER}", resume(config, FOLDER / f"p{OTHER}" / f"keras-{name}"),
            reference(config.ref, saved_by=OTHER)))


started = time.perf_counter()
parts = [other_world] if OTHER is not None else [configurations, refusals, mixed_precision]
took = []
for part in parts:
    began = time.perf_counter()
    attempt(part.__name__, part)
    took.append(f"{part.__name__}={time.perf_counter() - began:.1f}")
if R == 0:
    print(f"TOOK keras ranks={P} seconds={time.perf_counter() - started:.1f} {' '.join(took)}", flush=True)
print(f"{'PASS' if not failed else 'FAIL'} keras rank {R}/{P} failed={','.join(failed) or '-'}", flush=True)
dtf.shutdown()
sys.exit(1 if failed else 0)
