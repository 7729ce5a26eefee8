"""torch and Keras in one process under ddlrun: one runtime, both train like one process, in any interleaving."""

from __future__ import annotations

import random
import sys
import threading

import numpy as np

import ddl
import ddl.tensorflow as dtf
import ddl.tensorflow.keras as dk
import ddl.torch as dt
from ddl.onnx import read_model
from ddl.tools.conformance.adapter_hooks import RECIPES
from ddl.tools.conformance.data import digits_batches, shard
from ddl.tools.conformance.metrics import max_rel_diff
from ddl.tools.conformance.models import MODELS

dt.init()
dtf.init()
ctx = ddl.context()
assert dt.is_initialized() and dtf.is_initialized() and ddl.context() is ctx, "two runtimes in one process"
R, P = ddl.rank(), ddl.size()
assert P > 1, "run me with -np 2 or more"

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
import torch  # noqa: E402

import ddl.tensorflow.conformance as tfh  # noqa: E402
import ddl.torch.conformance as th  # noqa: E402

th.init()
tfh.init()
spec = read_model(MODELS["mlp"]())
recipe = RECIPES["sgd"]
batches = digits_batches(recipe.steps, recipe.batch)
mine = [shard(b, R, P) for b in batches]


def torch_alone() -> dict[str, np.ndarray]:
    """One process on the global batch, no ddl: the reference."""
    model = th.build(spec)
    opt = torch.optim.SGD(model.parameters(), lr=recipe.lr, momentum=recipe.momentum)
    for x, y in batches:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        opt.step()
    return th.get_weights(model, spec)


def keras_alone() -> dict[str, np.ndarray]:
    logits, _ = tfh.build(spec)
    opt = keras.optimizers.SGD(learning_rate=recipe.lr, momentum=recipe.momentum)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    for x, y in batches:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, logits(x, training=False))
        opt.apply(tape.gradient(loss, logits.trainable_variables), logits.trainable_variables)
    return tfh.get_weights(logits, spec)


class Slow(list):  # type: ignore[type-arg]
    """The shards, with a rank- and framework-dependent random pause before each step."""

    def __init__(self, items: list, seed: int) -> None:  # type: ignore[type-arg]
        super().__init__(items)
        self.rng = random.Random(seed)

    def __iter__(self):  # type: ignore[no-untyped-def]
        for item in list.__iter__(self):
            import time

            time.sleep(self.rng.random() * 0.01)
            yield item


ref = {"torch": torch_alone(), "keras": keras_alone()}
results: dict[str, dict[str, np.ndarray]] = {}

# (1) one thread, the two frameworks alternating step by step (the same order on every
# rank: synchronous collectives issued in different orders by one thread would wait on
# each other, in ddl as in MPI).
tm = th.build(spec)
dt.broadcast_parameters(tm.state_dict(), root_rank=0)
topt = dt.DistributedOptimizer(torch.optim.SGD(tm.parameters(), lr=recipe.lr, momentum=recipe.momentum),
                               named_parameters=tm.named_parameters())
km, _ = tfh.build(spec)
dtf.broadcast_variables(km.variables, root_rank=0)
kopt = dk.DistributedOptimizer(keras.optimizers.SGD(learning_rate=recipe.lr, momentum=recipe.momentum))
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
for x, y in mine:
    topt.zero_grad()
    torch.nn.functional.cross_entropy(tm(torch.from_numpy(x)), torch.from_numpy(y)).backward()
    topt.step()
    with tf.GradientTape() as tape:
        kloss = loss_fn(y, km(x, training=False))
    kopt.apply(tape.gradient(kloss, km.trainable_variables), km.trainable_variables)
results["alternating-torch"] = th.get_weights(tm, spec)
results["alternating-keras"] = tfh.get_weights(km, spec)
order = ["torch", "keras"] if R % 2 == 0 else ["keras", "torch"]
# (2) two threads at once, started in a different order and with different random pauses
# on every rank, so the two frameworks' requests reach the engine interleaved differently.
errors: list[BaseException] = []


def run(fw: str) -> None:
    try:
        results[f"thread-{fw}"] = (th if fw == "torch" else tfh).train(spec, recipe, Slow(mine, seed=R * 10 + len(fw)))
    except BaseException as exc:  # noqa: BLE001 - reported below, then the job fails
        errors.append(exc)


threads = [threading.Thread(target=run, args=(fw,)) for fw in order]
for t in threads:
    t.start()
for t in threads:
    t.join()
if errors:
    raise errors[0]
worst = 0.0
for key, w in sorted(results.items()):
    fw = key.split("-")[1]
    d = max_rel_diff(w, ref[fw])
    same = len(set(ddl.allgather_object(np.concatenate([w[n].ravel() for n in spec.param_names()]).tobytes()))) == 1
    print(f"MIXED {key} rank {R}/{P} max_rel_diff={d:.2e} identical={'yes' if same else 'NO'}", flush=True)
    if not (d <= 1e-5 and same):
        print(f"FAIL {key}", flush=True)
        sys.exit(1)
    worst = max(worst, d)
ddl.barrier()
print(f"PASS mixed rank {R}/{P} worst={worst:.2e}", flush=True)
