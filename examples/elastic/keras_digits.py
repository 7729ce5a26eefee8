"""Elastic Keras 3 model.fit on the digits CNN: a lost host costs the batches since the last commit.

    ddlrun --elastic --min-np 2 --max-np 3 --host-discovery-script examples/elastic/discover_hosts.sh \
        python examples/elastic/keras_digits.py

The differences from examples/keras_digits.py are marked "elastic:". The KerasState holds
the model, its optimizer, the ElasticDataset (which samples the world has seen) and the
step; the callbacks keep it current and commit it; each world fits one epoch per call
until the step budget is spent.
"""

import argparse
import hashlib
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # quiet TensorFlow's start-up banner

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

import ddl.tensorflow.keras as dk
import ddl.tensorflow.keras.elastic as elastic
from ddl.runtime.elastic import wait_for_host_updates

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=150)
parser.add_argument("--batch-size", type=int, default=32, help="per rank")
parser.add_argument("--lr", type=float, default=0.05, help="for one rank; scaled by the world size")
parser.add_argument("--commit-every", type=int, default=5, help="batches between commits")
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--step-seconds", type=float, default=0.0, help="sleep after each step (a slower model)")
parser.add_argument("--wait-for-hosts-at", type=int, default=0, metavar="STEP",
                    help="in a world smaller than the first, hold at this step until ddlrun announces new hosts "
                         "(demos and tests: a join at a chosen step)")
args = parser.parse_args()

dk.init()
tf.config.threading.set_intra_op_parallelism_threads(1)  # one core per rank: ranks share the machine
tf.config.threading.set_inter_op_parallelism_threads(1)
import keras  # noqa: E402  (after the threading settings)

keras.utils.set_random_seed(args.seed)
digits = load_digits()
images = (digits.images / 16.0).astype(np.float32)[..., None]
labels = digits.target.astype(np.int32)
order = np.random.default_rng(1234).permutation(len(labels))
test_idx, train_idx = order[:360], order[360:]
# elastic: this rank's share of what is left of the epoch, dealt again when the world changes
data = elastic.ElasticDataset(images[train_idx], labels[train_idx], batch_size=args.batch_size, seed=args.seed)

model = keras.Sequential([
    keras.Input((8, 8, 1)),
    keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
    keras.layers.Conv2D(32, 3, padding="same", activation="relu"), keras.layers.MaxPooling2D(),
    keras.layers.Flatten(), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10),
])
optimizer = dk.DistributedOptimizer(keras.optimizers.SGD(args.lr * dk.size(), momentum=0.9))
model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              jit_compile=False)

# elastic: what travels from world to world (the optimizer comes with the model)
state = elastic.KerasState(model, data=data, epoch=0, batch=0, step=0, first_size=dk.size())


def scale_learning_rate() -> None:
    """The global batch is batch-size x world size: scale the step with it (linear scaling rule)."""
    optimizer.learning_rate = args.lr * dk.size()
    if dk.rank() == 0:
        print(f"world {elastic.world_number()}: {dk.size()} rank(s), lr {args.lr * dk.size():g}, "
              f"resuming at step {state.step}", flush=True)


state.register_reset_callbacks([scale_learning_rate])


class Steps(keras.callbacks.Callback):
    """Counts steps across fits and worlds, logs them, and stops at the budget."""

    def on_train_batch_end(self, batch, logs=None):
        state.step += 1
        if dk.rank() == 0:
            print(f"step {state.step:4d} world {elastic.world_number()} size {dk.size()} "
                  f"loss {float(logs['loss']):.4f} t={time.time():.3f}", flush=True)
        if args.step_seconds:
            time.sleep(args.step_seconds)
        if state.step == args.wait_for_hosts_at and dk.size() < state.first_size:
            wait_for_host_updates(120)  # a demo's hold, until ddlrun announces the returning host
        if state.step >= args.steps:
            self.model.stop_training = True


callbacks = [
    Steps(),
    elastic.UpdateBatchStateCallback(state),  # elastic: state.batch and the data's progress
    elastic.UpdateEpochStateCallback(state),  # elastic: state.epoch, and the next epoch's order
    elastic.CommitStateCallback(state, batches_per_commit=args.commit_every),  # elastic
]


@elastic.run  # elastic: syncs the newest commit, runs the reset callbacks, leaves for the next world
def train(state):
    while state.step < args.steps:
        model.fit(data, epochs=1, callbacks=callbacks, verbose=0)


train(state)

x_test, y_test = images[test_idx][dk.rank()::dk.size()], labels[test_idx][dk.rank()::dk.size()]
correct = np.array([(np.argmax(model(x_test, training=False), axis=1) == y_test).sum(), len(y_test)], np.float64)
correct = dk.allreduce(tf.constant(correct), op=dk.Sum, name="test.correct").numpy()
digest = hashlib.sha256(b"".join(np.asarray(w).tobytes() for w in model.get_weights())).hexdigest()[:16]
print(f"final rank {dk.rank()} of {dk.size()}: step {state.step}, test accuracy {correct[0] / correct[1]:.4f}, "
      f"weights {digest}", flush=True)
dk.shutdown()
