"""Horovod's TensorFlow/Keras API under mpiexec (run at 2 ranks): SyncBatchNormalization equals
one process, a model built at its first batch trains with every callback, TF collectives, and
Horovod 0.28.1's conventions in TF 1 graphs: error classes, gradient scaling, in-place
broadcasts, local gradient sources, the Keras optimizer's compute_gradients."""

from __future__ import annotations

import os
import sys
import tempfile

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import ddl.tensorflow as hvd  # noqa: E402
import ddl.tensorflow.keras as hvdk  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
hvd.init()
R, P = hvd.rank(), hvd.size()
assert P == 2, "this worker runs at 2 ranks"


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30))


def check_sync_batch_normalization() -> None:
    """2 ranks on 5 samples each == one process on 10 with keras.layers.BatchNormalization."""
    def make(bn: type) -> keras.Model:
        keras.utils.set_random_seed(0)
        return keras.Sequential([keras.Input((6, 6, 2), dtype="float64"),
                                 keras.layers.Conv2D(3, 3, use_bias=False, dtype="float64"),  # a bias before BN only trains noise
                                 bn(momentum=0.8, dtype="float64"),
                                 keras.layers.ReLU(dtype="float64"), keras.layers.Flatten(dtype="float64"),
                                 keras.layers.Dense(4, dtype="float64")])

    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((10, 6, 6, 2)) for _ in range(3)]
    ys = [rng.standard_normal((10, 4)) for _ in range(3)]
    ref, sync = make(keras.layers.BatchNormalization), make(hvd.SyncBatchNormalization)
    ref_opt, opt = keras.optimizers.SGD(0.1, momentum=0.9), keras.optimizers.SGD(0.1, momentum=0.9)
    lo, hi = 5 * R, 5 * R + 5
    for x, y in zip(xs, ys, strict=True):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(ref(x, training=True) - y))
        ref_opt.apply(tape.gradient(loss, ref.trainable_variables), ref.trainable_variables)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(sync(x[lo:hi], training=True) - y[lo:hi]))
        dtape = hvd.DistributedGradientTape(tape)
        opt.apply(dtape.gradient(loss, sync.trainable_variables), sync.trainable_variables)
    diffs = {b.path: rel(np.asarray(a), np.asarray(b)) for a, b in zip(sync.variables, ref.variables, strict=True)}
    worst = max(diffs.values())
    assert worst <= 1e-5, diffs
    print(f"EQUIV syncbatchnormalization ranks={P} max_rel_diff={worst:.2e}", flush=True)


def check_unbuilt_model_with_every_callback() -> None:
    """Horovod's canonical Keras example: a Sequential without an input shape is built at
    its first batch; the broadcast callback must wait for it (it crashed every rank before)."""
    keras.utils.set_random_seed(10 + R)  # different initial weights on each rank
    model = keras.Sequential([keras.layers.Conv2D(4, 3, activation="relu"), keras.layers.Flatten(),
                              keras.layers.Dense(3)])
    opt = hvdk.DistributedOptimizer(keras.optimizers.Adam(0.001 * P))
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    rng = np.random.default_rng(R)
    x, y = rng.standard_normal((32, 8, 8, 1)).astype("float32"), rng.integers(0, 3, 32)
    with tempfile.TemporaryDirectory() as tmp:
        best = hvdk.callbacks.BestModelCheckpoint(monitor="loss", filepath=os.path.join(tmp, "best.keras"))
        callbacks = [hvdk.callbacks.BroadcastGlobalVariablesCallback(0), hvdk.callbacks.MetricAverageCallback(),
                     hvdk.callbacks.LearningRateWarmupCallback(0.001 * P, warmup_epochs=1),
                     hvdk.callbacks.LearningRateScheduleCallback(0.001 * P, multiplier=lambda e: 0.25, start_epoch=1)]
        history = model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[*callbacks, *([best] if R == 0 else [])])
        # Warm-up from lr/size at the last batch of epoch 0 (epoch 0.75), then the schedule's lr/4.
        expect = [0.001 * (1 + 0.75 * (P - 1)), 0.00025 * P]
        assert np.allclose(history.history["lr"], expect, rtol=1e-6), history.history
        if R == 0:
            assert os.path.exists(os.path.join(tmp, "best.keras"))
            loaded = hvdk.load_model(os.path.join(tmp, "best.keras"))
            assert isinstance(loaded.optimizer, hvdk.DistributedOptimizer), type(loaded.optimizer)
    flat = np.concatenate([np.asarray(v).reshape(-1) for v in model.trainable_variables])
    everyone = hvd.allgather(flat[None]).numpy()
    assert np.array_equal(everyone[0], everyone[1])
    print(f"PASS keras unbuilt model with callbacks rank {R}", flush=True)


def check_collectives() -> None:
    out, received = hvd.alltoall(tf.range(5) + 10 * R, splits=[2, 3] if R == 0 else [4, 1])
    assert received.numpy().tolist() == ([2, 4] if R == 0 else [3, 1]), received
    expect = [0, 1, 10, 11, 12, 13] if R == 0 else [2, 3, 4, 14]
    assert out.numpy().tolist() == expect, out
    sl = hvd.allreduce(tf.IndexedSlices(tf.ones((1, 2)) * (R + 1), tf.constant([R]), tf.constant([2, 2])))
    assert np.array_equal(tf.convert_to_tensor(sl).numpy(), [[0.5, 0.5], [1.0, 1.0]])
    assert hvd.allreduce(tf.constant([3, -3], tf.int8), op=hvd.Average).numpy().tolist() == [3, -3]
    scaled = hvd.allreduce(tf.ones(2), op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25)
    assert scaled.numpy().tolist() == [1.0, 1.0]

    @tf.function
    def in_graph(x: tf.Tensor) -> tf.Tensor:
        return hvd.reducescatter(x, op=hvd.Sum)

    assert in_graph(tf.ones((4, 2))).numpy().tolist() == [[2.0, 2.0], [2.0, 2.0]]
    steps = 2 + R
    for s in range(steps):
        got = hvd.allreduce(tf.ones(2) * (R + 1), name=f"tf.s{s}")
    # Horovod's rule: after rank 0 joined, the Average still divides by both ranks.
    assert float(got[0]) == (1.5 if steps == 2 else 1.0), got
    assert int(hvd.join()) == 1
    print(f"PASS tf collectives rank {R}", flush=True)


def check_session_graph_errors_and_broadcast_in_place() -> None:
    """In a TF 1 graph run by a Session: a mismatch is FailedPreconditionError on every rank (the
    status op; ddl_status_op_built says whether this machine could build it), and broadcast_
    changes the variables."""
    from ddl.tensorflow import status_op

    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        wrong = hvd.allreduce(tf.ones([3 + R]), op=hvd.Sum)
        expected = tf.errors.FailedPreconditionError if status_op.load() is not None else tf.errors.UnknownError
        try:
            sess.run(wrong)
            raise AssertionError("ranks with different shapes did not fail")
        except expected as exc:
            assert "(3,)" in exc.message and "(4,)" in exc.message, exc.message
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        v = tf.compat.v1.Variable(tf.fill([4], float(R + 10)), use_resource=True)
        sess.run(tf.compat.v1.global_variables_initializer())
        (new,) = hvd.broadcast_([v], root_rank=1)
        assert sess.run(new).tolist() == [11.0] * 4 and sess.run(v).tolist() == [11.0] * 4
        again = hvd.allreduce(tf.ones([2]), op=hvd.Sum)  # the runtime is still usable
        assert sess.run(again).tolist() == [2.0, 2.0]
    print(f"PASS session graph errors and broadcast_ rank {R} status_op={status_op.load() is not None}",
          flush=True)


def check_horovod_gradient_conventions() -> None:
    """Horovod 0.28.1's gradients, traced into a Session graph and eagerly: allgather averages the
    ranks' output gradients before slicing, broadcast gives the root the average, reducescatter
    gives the gathered gradient times size for Sum and times the scale factors."""
    rows = [3, 2][R]
    mean = [[1.5] * 2] * 3 if R == 0 else [[15.0] * 2] * 2  # not a sum (3, 30), not this rank's own

    def grads(graph_mode: bool) -> list[np.ndarray]:
        if graph_mode:
            with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
                x, y = tf.ones([rows, 2]), tf.ones([4, 2])
                dy_all = tf.concat([tf.fill([3, 2], R + 1.0), tf.fill([2, 2], R * 10.0 + 10)], 0)  # per rank
                outs = [tf.gradients(hvd.allgather(x), x, dy_all)[0],
                        tf.gradients(hvd.broadcast(y, root_rank=1), y, tf.fill([4, 2], float(R + 1)))[0],
                        tf.gradients(hvd.reducescatter(y, op=hvd.Sum), y, tf.ones([2, 2]))[0],
                        tf.gradients(hvd.reducescatter(y, op=hvd.Average, postscale_factor=0.5), y,
                                     tf.ones([2, 2]))[0]]
                return [np.asarray(o) for o in sess.run(outs)]
        x, y = tf.ones([rows, 2]), tf.ones([4, 2])
        dy_all = tf.concat([tf.fill([3, 2], R + 1.0), tf.fill([2, 2], R * 10.0 + 10)], 0)
        with tf.GradientTape(persistent=True) as tape:
            tape.watch([x, y])
            g, b = hvd.allgather(x), hvd.broadcast(y, root_rank=1)
            s, a = hvd.reducescatter(y, op=hvd.Sum), hvd.reducescatter(y, op=hvd.Average, postscale_factor=0.5)
        return [tape.gradient(g, x, dy_all).numpy(), tape.gradient(b, y, tf.fill([4, 2], float(R + 1))).numpy(),
                tape.gradient(s, y, tf.ones([2, 2])).numpy(), tape.gradient(a, y, tf.ones([2, 2])).numpy()]

    for graph_mode in (True, False):
        gather, bcast, rs_sum, rs_avg = grads(graph_mode)
        assert gather.tolist() == mean, (graph_mode, gather)
        assert bcast.tolist() == ([[1.5] * 2] * 4 if R == 1 else [[0.0] * 2] * 4), (graph_mode, bcast)
        assert rs_sum.tolist() == [[2.0] * 2] * 4 and rs_avg.tolist() == [[0.5] * 2] * 4, (graph_mode, rs_sum, rs_avg)
    print(f"PASS horovod gradient conventions rank {R}", flush=True)


def check_local_gradient_sources() -> None:
    """A model-parallel part (a different shape on each rank) stays local, divided by size."""
    local, shared = tf.Variable(tf.ones([3 + R])), tf.Variable([1.0, 1.0])

    @tf.function
    def step() -> list[tf.Tensor]:
        with tf.GradientTape() as plain:
            loss = tf.reduce_sum(local) * 4.0 + tf.reduce_sum(shared) * float(R + 1)
        tape = hvd.DistributedGradientTape(plain)
        tape.register_local_source(local)
        return tape.gradient(loss, [local, shared])

    g_local, g_shared = step()
    assert g_local.numpy().tolist() == [2.0] * (3 + R) and g_shared.numpy().tolist() == [1.5, 1.5]
    print(f"PASS local gradient sources rank {R}", flush=True)


def check_keras_compute_gradients() -> None:
    """The Keras optimizer's compute_gradients returns reduced gradients, which apply once."""
    x = tf.Variable([0.0])
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(1.0))
    pairs = opt.compute_gradients(lambda: tf.reduce_sum(x) * float(R + 1), [x])
    assert pairs[0][0].numpy().tolist() == [1.5]
    opt.apply_gradients(pairs)
    assert x.numpy().tolist() == [-1.5]
    print(f"PASS keras compute_gradients rank {R}", flush=True)


for check in (check_sync_batch_normalization, check_unbuilt_model_with_every_callback, check_collectives,
              check_session_graph_errors_and_broadcast_in_place, check_horovod_gradient_conventions,
              check_local_gradient_sources, check_keras_compute_gradients):
    check()
hvd.shutdown()
print(f"PASS horovod tensorflow rank {R}/{P}", flush=True)
sys.exit(0)
