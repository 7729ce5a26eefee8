"""Train a small CNN on scikit-learn's digits with Keras 3 and ddl: ddlrun -np 2 python examples/keras_digits.py

The digits data set (1797 8x8 images) ships inside the scikit-learn wheel, so nothing is
downloaded. The changes from a single-process Keras script are the ones marked "ddl:".
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # quiet TensorFlow's start-up banner

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

import ddl.tensorflow.keras as dk

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--epochs", type=int, default=12)
parser.add_argument("--batch-size", type=int, default=32, help="per rank")
parser.add_argument("--lr", type=float, default=0.05, help="for one rank; scaled by the world size")
parser.add_argument("--warmup-epochs", type=float, default=2.0)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--fp16-allreduce", action="store_true", help="send gradients as float16")
args = parser.parse_args()

dk.init()  # ddl: one process per rank, started by ddlrun
tf.config.threading.set_intra_op_parallelism_threads(1)  # one core per rank: ranks share the machine
tf.config.threading.set_inter_op_parallelism_threads(1)
import keras  # noqa: E402  (after the threading settings)

keras.utils.set_random_seed(args.seed + dk.rank())  # different inits: the broadcast makes them equal

# Data: the same split on every rank; each rank trains on its shard of the training set.
digits = load_digits()
images = (digits.images / 16.0).astype(np.float32)[..., None]
labels = digits.target.astype(np.int32)
order = np.random.default_rng(1234).permutation(len(labels))
test_idx, train_idx = order[:360], order[360:]
train = (tf.data.Dataset.from_tensor_slices((images[train_idx], labels[train_idx]))
         .shard(dk.size(), dk.rank())  # ddl: this rank's 1/size of the images
         .shuffle(2048, seed=args.seed).batch(args.batch_size))
test = tf.data.Dataset.from_tensor_slices((images[test_idx], labels[test_idx])).shard(dk.size(), dk.rank()).batch(120)

model = keras.Sequential([
    keras.Input((8, 8, 1)),
    keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
    keras.layers.Conv2D(32, 3, padding="same", activation="relu"), keras.layers.MaxPooling2D(),
    keras.layers.Flatten(), keras.layers.Dense(64, activation="relu"), keras.layers.Dropout(0.1),
    keras.layers.Dense(10),
])
steps_per_epoch = len(train)
lr = args.lr * dk.size()  # ddl: the global batch grows with the ranks, so does the step
decay = keras.optimizers.schedules.CosineDecay(lr, decay_steps=args.epochs * steps_per_epoch)
optimizer = keras.optimizers.SGD(lr, momentum=0.9, weight_decay=1e-4)
compression = dk.Compression.fp16 if args.fp16_allreduce else dk.Compression.none
optimizer = dk.DistributedOptimizer(optimizer, compression=compression)  # ddl
model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])


class CosineAfterWarmup(keras.callbacks.Callback):
    """Cosine decay from lr, taking over from the warm-up."""

    def on_train_batch_begin(self, batch, logs=None):
        step = self.params["steps"] * self.epoch + batch
        if step >= args.warmup_epochs * steps_per_epoch:
            self.model.optimizer.learning_rate = float(decay(step))

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch


callbacks = [
    dk.callbacks.BroadcastGlobalVariablesCallback(root_rank=0),  # ddl: rank 0's weights and optimizer state
    dk.callbacks.MetricAverageCallback(),  # ddl: logged loss and accuracy averaged over the ranks
    dk.callbacks.LearningRateWarmupCallback(lr, warmup_epochs=args.warmup_epochs),  # ddl: lr/size -> lr
    CosineAfterWarmup(),
]
if dk.rank() == 0:
    print(f"ddl.tensorflow digits: {dk.size()} rank(s), {len(train_idx)} train / {len(test_idx)} test images, "
          f"{model.count_params()} parameters, global batch {args.batch_size * dk.size()}, lr {lr:g}", flush=True)
start = time.perf_counter()
model.fit(train, epochs=args.epochs, callbacks=callbacks, verbose=2 if dk.rank() == 0 else 0)  # ddl: rank 0 logs

# Test accuracy over the whole test set: each rank scores its shard, the counts are summed.
correct = np.zeros(2)
for x, y in test:
    correct += [(np.argmax(model(x, training=False), axis=1) == y.numpy()).sum(), len(y)]
correct = dk.allreduce(tf.constant(correct), op=dk.Sum, name="test.correct").numpy()  # ddl
accuracy = correct[0] / correct[1]
if dk.rank() == 0:
    print(f"final test accuracy {accuracy:.4f} ({accuracy * 100:.1f} %) after {time.perf_counter() - start:.1f} s "
          f"on {dk.size()} rank(s)")
dk.shutdown()
