"""Tier 1: ddl.tensorflow in a world of one (graph shapes, gradients, XLA error, Keras wrapper, bench arithmetic)."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from ddl_bench.tensorflow_training import format_table, summarize  # noqa: E402

import ddl  # noqa: E402
import ddl.tensorflow as dtf  # noqa: E402
import ddl.tensorflow.keras as dk  # noqa: E402
from ddl.tensorflow.gradients import name_for, reduce_gradients  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def world() -> None:
    ddl.init()
    assert ddl.size() == 1


def test_collectives_keep_values_and_static_shapes_in_graphs() -> None:
    @tf.function
    def f(x: tf.Tensor) -> tuple[tf.Tensor, ...]:
        a = dtf.allreduce(x, op=ddl.Sum)
        g = dtf.allgather(x)
        r = dtf.reducescatter(x)
        b = dtf.broadcast(x, root_rank=0)
        (s,) = dtf.grouped_allreduce([x])
        assert a.shape == (3, 2) and g.shape.as_list() == [None, 2] and r.shape == (3, 2) and b.shape == (3, 2)
        assert s.shape == (3, 2)
        return a, g, r, b, s

    x = tf.reshape(tf.range(6, dtype=tf.float32), (3, 2))
    for out in f(x):
        np.testing.assert_array_equal(out, x)
    eager = dtf.allreduce(tf.constant([1, 2], tf.int64), op=ddl.Max)
    assert eager.dtype == tf.int64 and eager.numpy().tolist() == [1, 2]


def test_allreduce_and_allgather_have_gradients() -> None:
    x = tf.Variable([1.0, 2.0])
    with tf.GradientTape(persistent=True) as tape:
        a = tf.reduce_sum(dtf.allreduce(x, op=ddl.Sum) * 3.0)
        b = tf.reduce_sum(dtf.allgather(x) * 2.0)
    np.testing.assert_array_equal(tape.gradient(a, x), [3.0, 3.0])
    np.testing.assert_array_equal(tape.gradient(b, x), [2.0, 2.0])
    with tf.GradientTape() as tape:
        m = tf.reduce_sum(dtf.allreduce(x, op=ddl.Max))
    with pytest.raises(ValueError, match="has no gradient"):
        tape.gradient(m, x)


def test_eager_collectives_skip_custom_gradient_only_where_nothing_records(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside a tape an eager collective has nobody to give a gradient to, and wrapping it in
    ``tf.custom_gradient`` cost most of a small call: it is skipped there, kept under a tape,
    and the values are the same either way."""
    wrapped: list[str] = []
    real = tf.custom_gradient

    def spy(f):  # type: ignore[no-untyped-def]
        wrapped.append(f.__qualname__)
        return real(f)

    monkeypatch.setattr(tf, "custom_gradient", spy)
    x = tf.Variable([[1.0, 2.0], [3.0, 4.0]])

    def every(v: tf.Variable) -> list[tf.Tensor]:
        return [dtf.allreduce(v, op=ddl.Sum), dtf.allgather(v), dtf.broadcast(v, root_rank=0), dtf.alltoall(v),
                dtf.reducescatter(v, op=ddl.Sum), *dtf.grouped_allreduce([v], op=ddl.Sum)]

    plain = every(x)
    assert wrapped == []
    with tf.GradientTape() as tape:
        taped = every(x)
        total = tf.add_n([tf.reduce_sum(t) for t in taped])
    assert len(wrapped) == 6
    for a, b in zip(plain, taped, strict=True):
        np.testing.assert_array_equal(a, b)
    assert tape.gradient(total, x) is not None


def test_xla_gets_a_clear_error() -> None:
    f = tf.function(lambda x: dtf.allreduce(x), jit_compile=True)
    with pytest.raises(ValueError, match="jit_compile=False"):
        f(tf.ones(3))


def test_indexed_slices_allreduce_gathers_them() -> None:
    # Horovod's rule: IndexedSlices are allgathered (indices and values), an Average divides the values.
    out = dtf.allreduce(tf.IndexedSlices(tf.ones((1, 2)) * 4, tf.constant([2]), tf.constant([3, 2])), op=ddl.Sum)
    assert isinstance(out, tf.IndexedSlices)
    np.testing.assert_array_equal(out.indices, [2])
    np.testing.assert_array_equal(tf.convert_to_tensor(out), [[0, 0], [0, 0], [4, 4]])


def test_bad_inputs_are_refused_clearly() -> None:
    with pytest.raises(TypeError, match="dtype"):
        dtf.allreduce(tf.constant([True]))
    with pytest.raises(ValueError, match="at least one dimension"):
        dtf.allgather(tf.constant(1.0))
    with pytest.raises(ValueError, match="root_rank"):
        dtf.broadcast_variables([tf.Variable(1.0)], root_rank=3)
    with pytest.raises(TypeError, match="GradientTape"):
        dtf.DistributedGradientTape(object())  # type: ignore[arg-type]


def test_gradient_names_follow_shapes_not_keras_names() -> None:
    a = [tf.Variable(tf.zeros((2, 3)), name="a"), tf.Variable(tf.zeros(3), name="b")]
    b = [tf.Variable(tf.zeros((2, 3)), name="other"), tf.Variable(tf.zeros(3), name="names")]
    assert name_for(a, "p") == name_for(b, "p") != name_for(a[:1], "p")


def test_one_rank_reduction_passes_gradients_through() -> None:
    sl = tf.IndexedSlices(tf.ones((2, 2)), tf.constant([0, 2]), tf.constant([4, 2]))
    dense = tf.ones(3)
    out = reduce_gradients([dense, None, sl], name="t")
    assert out[0] is dense and out[1] is None and out[2] is sl
    densified = reduce_gradients([sl], name="t", sparse_as_dense=True)[0]
    np.testing.assert_array_equal(densified, [[1, 1], [0, 0], [1, 1], [0, 0]])


def _mlp() -> keras.Model:
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(3)])


def test_optimizer_config_round_trip_and_argument_checks() -> None:
    opt = dk.DistributedOptimizer(keras.optimizers.Adam(3e-3), backward_passes_per_step=2, op=ddl.Sum,
                                  compression=ddl.Compression.fp16, sparse_as_dense=True)
    config = keras.saving.serialize_keras_object(opt)
    assert config["registered_name"] == "ddl>DistributedOptimizer"
    back = keras.saving.deserialize_keras_object(config)
    assert isinstance(back, dk.DistributedOptimizer) and isinstance(back.inner_optimizer, keras.optimizers.Adam)
    assert back.get_config() == opt.get_config()
    assert float(back.learning_rate) == pytest.approx(3e-3)
    with pytest.raises(TypeError, match="wrap it once"):
        dk.DistributedOptimizer(opt)
    with pytest.raises(TypeError, match="Keras 3 optimizer"):
        dk.DistributedOptimizer(object())
    with pytest.raises(ValueError, match="Average or ddl.Sum"):
        dk.DistributedOptimizer(keras.optimizers.SGD(), op=ddl.Max)
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        dk.DistributedOptimizer(keras.optimizers.SGD(), backward_passes_per_step=0)
    with pytest.raises(ValueError, match="not both"):
        dk.DistributedOptimizer(keras.optimizers.SGD(gradient_accumulation_steps=2), backward_passes_per_step=2)


def test_backward_passes_match_keras_gradient_accumulation() -> None:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 4)).astype(np.float32), rng.integers(0, 3, 64)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    weights = []
    for opt in (keras.optimizers.SGD(0.1, momentum=0.9, gradient_accumulation_steps=2),
                dk.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), backward_passes_per_step=2,
                                         average_aggregated_gradients=True)):
        model = _mlp()
        model.compile(optimizer=opt, loss=loss)
        model.fit(x, y, batch_size=8, shuffle=False, verbose=0)
        weights.append(model.get_weights())
        assert int(model.optimizer.iterations) == 4  # 8 batches, one update per 2
    for a, b in zip(*weights, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7)
    assert not np.array_equal(weights[1][0], _mlp().get_weights()[0])


def test_callbacks_refuse_xla_and_warm_up_at_one_rank() -> None:
    model = _mlp()
    model.compile(optimizer=dk.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse", jit_compile=True)
    cb = dk.callbacks.BroadcastGlobalVariablesCallback(0)
    cb.set_model(model)
    with pytest.raises(ValueError, match="jit_compile=False"):
        cb.on_train_begin()
    warm = dk.callbacks.LearningRateWarmupCallback(0.4, warmup_epochs=2)
    assert warm.lr_at(0.0) == warm.lr_at(5.0) == pytest.approx(0.4)  # lr/size with size 1
    with pytest.raises(ValueError, match="warmup_epochs"):
        dk.callbacks.LearningRateWarmupCallback(0.1, warmup_epochs=0)


def test_bench_arithmetic() -> None:
    runs = [
        {"size": 1, "batch": 64, "step_s": {"keras": 0.020, "ddl-fit": 0.021, "ddl-tape": 0.020, "mwms": 0.025}},
        {"size": 2, "batch": 64, "step_s": {"keras": 0.025, "ddl-fit": 0.040, "ddl-tape": 0.038, "mwms": 0.100},
         "cpu_s": {"keras": 0.02, "ddl-fit": 0.03, "ddl-tape": 0.03, "mwms": 0.06},
         "params": 10, "tensorflow": "x", "keras": "y"},
    ]
    runs[0].update(params=10, tensorflow="x", keras="y")
    rows = {(r["ranks"], r["contender"]): r for r in summarize(runs)["rows"]}
    two = rows[(2, "ddl-fit")]
    assert two["vs_mwms"] == pytest.approx(0.4) and two["vs_keras_1rank"] == pytest.approx(2.0)
    assert two["scaling_efficiency"] == pytest.approx(0.5) and two["samples_per_s"] == pytest.approx(3200)
    assert rows[(1, "ddl-fit")]["vs_keras_1rank"] == pytest.approx(1.05)
    assert two["cpu_vs_mwms"] == pytest.approx(0.5) and rows[(1, "ddl-fit")]["cpu_ms"] is None
    assert "ddl-tape" in format_table(summarize(runs))


def test_fused_allreduce_returns_aligned_views_in_input_order() -> None:
    from ddl.tensorflow.gradients import fused_allreduce

    arrays = [np.arange(5, dtype=np.float32), np.ones((2, 3)), np.zeros(0, np.float32),
              np.full((3, 3), 2, np.float32)]
    outs = fused_allreduce(arrays, op=ddl.Sum, name="fused", compression=None)
    for a, o in zip(arrays, outs, strict=True):
        assert o.dtype == a.dtype and o.shape == a.shape
        np.testing.assert_array_equal(o, a)
        assert o.size == 0 or o.ctypes.data % 64 == 0  # TensorFlow takes these without a copy
    assert np.shares_memory(outs[0], outs[3]) is False and outs[0].base is outs[3].base


# SGD and Adam are checked against one process at 2 and 4 ranks (tier 2); these two
# check that the wrapper hands every setting and slot through to the wrapped optimizer.
@pytest.mark.parametrize("make", [lambda: keras.optimizers.AdamW(1e-2, weight_decay=0.1),
                                  lambda: keras.optimizers.RMSprop(1e-2, momentum=0.5)], ids=["adamw", "rmsprop"])
def test_wrapped_optimizers_step_like_the_plain_ones(make) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(32, 4)).astype(np.float32), rng.integers(0, 3, 32)
    weights = []
    for opt in (make(), dk.DistributedOptimizer(make())):
        model = _mlp()
        model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, batch_size=8, shuffle=False, verbose=0)
        state = opt.inner_optimizer.variables if isinstance(opt, dk.DistributedOptimizer) else opt.variables
        weights.append(model.get_weights() + [np.asarray(v) for v in state])
    assert int(opt.iterations) == 4
    for a, b in zip(*weights, strict=True):
        np.testing.assert_array_equal(b, a)
