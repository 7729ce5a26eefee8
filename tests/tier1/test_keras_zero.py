"""ddl.tensorflow.keras's sharded optimizer and checkpoints in a world of one: the contract, refusals, files."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import ddl  # noqa: E402
import ddl.tensorflow.keras as dk  # noqa: E402
from ddl.checkpoint import CheckpointError, read_manifest  # noqa: E402
from ddl.tools import checkpoint as cli  # noqa: E402

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
X = np.random.default_rng(0).normal(size=(32, 8)).astype(np.float32)
Y = np.random.default_rng(1).integers(0, 4, size=32).astype(np.int32)


@pytest.fixture(scope="module", autouse=True)
def world() -> None:
    ddl.init()


def mlp(seed: int = 0, width: int = 16) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(width, activation="tanh"), keras.layers.Dense(4)])


def fit(model: keras.Model, opt: keras.optimizers.Optimizer, rows: slice = slice(0, 32)) -> keras.Model:
    model.compile(optimizer=opt, loss=LOSS)
    model.fit(X[rows], Y[rows], batch_size=8, shuffle=False, verbose=0)
    return model


def test_sharded_fit_in_one_process_is_plain_fit() -> None:
    plain = fit(mlp(), keras.optimizers.Adam(1e-2))
    opt = dk.DistributedOptimizer(keras.optimizers.Adam(1e-2), shard_optimizer_state=True)
    sharded = fit(mlp(), opt)
    for a, b in zip(plain.get_weights(), sharded.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert len(opt.owned_variables()) == 4 and int(opt.iterations.numpy()) == 4
    assert [v.path for v in opt.replicated_variables()] == [v.path for v in opt._variables] + [
        opt.inner_optimizer._iterations.path, opt.inner_optimizer._learning_rate.path]
    assert opt.get_config()["shard_optimizer_state"] is True


def test_what_sharding_cannot_do_is_refused() -> None:
    for inner, match in ((keras.optimizers.SGD(0.1, global_clipnorm=1.0), "global_clipnorm"),
                         (keras.optimizers.SGD(0.1, use_ema=True), "use_ema")):
        with pytest.raises(ValueError, match=match):
            dk.DistributedOptimizer(inner, shard_optimizer_state=True)
    with pytest.raises(ValueError, match="gradient_accumulation_steps"):
        dk.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=2, shard_optimizer_state=True)
    with pytest.raises(ValueError, match="cannot take a communication hook"):
        dk.DistributedOptimizer(keras.optimizers.SGD(0.1), compression=ddl.PowerSGD(rank=2), shard_optimizer_state=True)


def test_a_checkpoint_round_trips_and_training_goes_on_alike(tmp_path: Path) -> None:
    a = fit(mlp(), keras.optimizers.Adam(1e-2), slice(0, 16))
    dk.checkpoint.save(tmp_path, model=a, optimizer=a.optimizer, extra={"epoch": 2})
    b = mlp(seed=7)
    opt = dk.DistributedOptimizer(keras.optimizers.Adam(1e-2), shard_optimizer_state=True)
    b.compile(optimizer=opt, loss=LOSS)
    opt.build(b.trainable_variables)
    assert dk.checkpoint.load(tmp_path, model=b, optimizer=opt) == {"epoch": 2}
    assert int(opt.iterations.numpy()) == 2
    fit(a, a.optimizer, slice(16, 32))
    b.fit(X[16:], Y[16:], batch_size=8, shuffle=False, verbose=0)
    for x, y in zip(a.get_weights(), b.get_weights(), strict=True):
        np.testing.assert_array_equal(x, y)
    assert read_manifest(tmp_path).meta["optimizer"]["slots"] == ["momentums", "velocities"]


def test_a_checkpoint_refuses_other_shapes_optimizers_and_flipped_bytes(tmp_path: Path) -> None:
    a = fit(mlp(), keras.optimizers.Adam(1e-2), slice(0, 16))
    dk.checkpoint.save(tmp_path, model=a, optimizer=a.optimizer)
    with pytest.raises(CheckpointError, match=r"entry 'model/00000' \(.*kernel\) is float32\[8, 16\]"):
        dk.checkpoint.load(tmp_path, model=mlp(width=5))
    b = mlp()
    sgd = keras.optimizers.SGD(0.1, momentum=0.9)
    sgd.build(b.trainable_variables)
    with pytest.raises(CheckpointError, match=r"meta.optimizer.class is keras.src.optimizers.adam.Adam"):
        dk.checkpoint.load(tmp_path, model=b, optimizer=sgd)
    name = next(f for f in read_manifest(tmp_path).files if f.startswith("model"))
    data = bytearray((tmp_path / name).read_bytes())
    data[-1] ^= 0x04
    (tmp_path / name).write_bytes(bytes(data))
    before = [w.copy() for w in b.get_weights()]
    with pytest.raises(CheckpointError, match=rf"{name}: corrupt"):
        dk.checkpoint.load(tmp_path, model=b)
    for x, y in zip(before, b.get_weights(), strict=True):
        np.testing.assert_array_equal(x, y)


def test_consolidate_writes_a_keras_weights_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = fit(mlp(), dk.DistributedOptimizer(keras.optimizers.SGD(0.1), shard_optimizer_state=True))
    dk.checkpoint.save(tmp_path / "c", model=a, optimizer=a.optimizer)
    out = tmp_path / "m.weights.h5"
    assert cli.main(["consolidate", str(tmp_path / "c"), "-o", str(out)]) == 0
    assert "4 model variables" in capsys.readouterr().out
    b = mlp(seed=3)
    b.load_weights(str(out))
    for x, y in zip(a.get_weights(), b.get_weights(), strict=True):
        np.testing.assert_array_equal(x, y)


# -- loss scaling and layered optimizers (issue 44) -------------------------------------------
def lso(inner: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
    return keras.optimizers.LossScaleOptimizer(inner, initial_scale=256.0, dynamic_growth_steps=2)


def test_loss_scaling_is_refused_where_ranks_would_skip_alone_and_taken_where_they_cannot() -> None:
    with pytest.raises(ValueError, match=r"LossScaleOptimizer\(DistributedOptimizer\(opt, shard_optimizer_state=True"):
        dk.DistributedOptimizer(lso(keras.optimizers.Adam(1e-2)), shard_optimizer_state=True)
    with pytest.raises(ValueError, match="unscaled twice.*auto_scale_loss=False"):
        lso(dk.DistributedOptimizer(lso(keras.optimizers.SGD(0.1))))
    with pytest.raises(TypeError, match="or a LossScaleOptimizer around one; not DistributedOptimizer"):
        dk.LocalSGD(dk.DistributedOptimizer(keras.optimizers.SGD(0.1)), period=2)
    for opt in (dk.LocalSGD(lso(keras.optimizers.SGD(0.1)), period=2),
                lso(dk.DistributedOptimizer(keras.optimizers.SGD(0.1), shard_optimizer_state=True))):
        fit(mlp(), opt)  # both train


def test_a_checkpoint_keeps_every_layer_of_a_layered_optimizer(tmp_path: Path) -> None:
    """A loss scale (inside and around the wrapper), a hook's state and a LocalSGD's counters
    come back, and training goes on as the uninterrupted run."""
    makers = {"lso-in": lambda: dk.DistributedOptimizer(lso(keras.optimizers.SGD(0.1, momentum=0.9))),
              "lso-out": lambda: lso(dk.DistributedOptimizer(keras.optimizers.Adam(1e-2))),
              "powersgd": lambda: dk.DistributedOptimizer(keras.optimizers.SGD(0.1),
                                                          compression=ddl.PowerSGD(rank=1, start_iter=1)),
              "localsgd": lambda: dk.LocalSGD(keras.optimizers.SGD(0.1, momentum=0.9), period=3)}
    for name, make in makers.items():
        a = fit(mlp(), make(), slice(0, 16))
        dk.checkpoint.save(tmp_path / name, model=a, optimizer=a.optimizer)
        b = mlp(seed=5)
        opt = make()
        b.compile(optimizer=opt, loss=LOSS)
        opt.build(b.trainable_variables)
        dk.checkpoint.load(tmp_path / name, model=b, optimizer=opt)
        if name.startswith("lso"):  # 2 finite steps: the scale grew from 256 to 512, and that came back
            scaler = opt if name == "lso-out" else opt.inner_optimizer
            assert float(scaler.dynamic_scale.numpy()) == 512.0 and int(scaler.step_counter.numpy()) == 0
        a.fit(X[16:], Y[16:], batch_size=8, shuffle=False, verbose=0)
        b.fit(X[16:], Y[16:], batch_size=8, shuffle=False, verbose=0)
        for x, y in zip(a.get_weights(), b.get_weights(), strict=True):
            np.testing.assert_array_equal(x, y, err_msg=name)
    meta = read_manifest(tmp_path / "lso-out").meta["optimizer"]
    assert meta["layers"] == {"lossscale-outside": "keras.src.optimizers.loss_scale_optimizer.LossScaleOptimizer",
                              "wrapper": "ddl.tensorflow.keras.optimizer.DistributedOptimizer",
                              "holder": "keras.src.optimizers.adam.Adam"}
