"""A custom TensorFlow training loop (``tf.GradientTape`` in a ``@tf.function`` step, no Keras
model, no ``fit``) iterating eagerly over a tf.data pipeline whose ``map`` is sequential and slow.

Stages: ``Dataset.range(...).map(tf_load).batch(32)`` where ``tf_load`` is C03's
``tf.numpy_function`` (2 ms sleep + ~0.3 ms numpy decoding per 32x32x3 sample), no
``num_parallel_calls``, no ``prefetch``; ``for x, y in ds:`` in Python, ``train_step(x, y)`` a
``@tf.function`` with a ``GradientTape`` over a plain ``tf.Module`` CNN (conv 16 → conv 32 → GAP
→ dense 10) and a hand-written SGD update. (Importing tensorflow loads parts of ``keras``
anyway; the script itself uses no Keras API.)

Expected diagnosis: framework ``tensorflow``, ``input_bound`` (cause ``sequential_map``); fix as
C03 (``num_parallel_calls=tf.data.AUTOTUNE``, ``.prefetch(tf.data.AUTOTUNE)``).

Measured on the shared 2-core dev box (``--measure``: time between the end of one step and the
start of the next loop body = input wait), 2 runs of 40 steps: input 77-84 ms per batch, train
step 8-9 ms, input wait share 0.91; RESULT 350-372 samples/s (step 86-91 ms). TF's default
tf.data optimizations already load the next batch in a background thread during the step
(see c03_tfdata_sequential_map.py), so the step is about the loading time. Process ~7 s.
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

BATCH = 32
IMAGE = (32, 32, 3)
READ_LATENCY_S = 0.002  # an I/O-like read per sample (sleep: releases the GIL)
DECODE_ROUNDS = 6       # numpy "decoding": ~0.3 ms of CPU per sample

_MIX = np.random.default_rng(0).standard_normal((IMAGE[2] * 4, IMAGE[2] * 4)).astype(np.float32) / 4


def load_sample(index):
    time.sleep(READ_LATENCY_S)
    rng = np.random.default_rng(int(index))
    raw = rng.integers(0, 256, size=IMAGE[0] * IMAGE[1] * IMAGE[2], dtype=np.uint8)
    img = raw.reshape(IMAGE[0] * IMAGE[1] // 4, IMAGE[2] * 4).astype(np.float32) / 255.0
    for _ in range(DECODE_ROUNDS):
        img = np.tanh(img @ _MIX)
        img = (img - img.mean(axis=0)) / (img.std(axis=0) + 1e-3)
    return img.reshape(IMAGE).astype(np.float32), np.int32(int(index) % 10)


def tf_load(index):
    img, label = tf.numpy_function(load_sample, [index], [tf.float32, tf.int32])
    img.set_shape(IMAGE)
    label.set_shape(())
    return img, label


def make_dataset(steps):
    return tf.data.Dataset.range((steps + 2) * BATCH).map(tf_load).batch(BATCH)


class SmallCNN(tf.Module):
    """conv 3x3 (16) → conv 3x3 (32) → global average pool → dense 10, in plain TensorFlow."""

    def __init__(self):
        super().__init__()
        init = tf.random.stateless_normal
        self.w1 = tf.Variable(init((3, 3, 3, 16), seed=(1, 0)) * 0.2)
        self.w2 = tf.Variable(init((3, 3, 16, 32), seed=(2, 0)) * 0.1)
        self.w3 = tf.Variable(init((32, 10), seed=(3, 0)) * 0.1)
        self.b3 = tf.Variable(tf.zeros(10))

    def __call__(self, x):
        x = tf.nn.relu(tf.nn.conv2d(x, self.w1, 1, "SAME"))
        x = tf.nn.relu(tf.nn.conv2d(x, self.w2, 1, "SAME"))
        return tf.matmul(tf.reduce_mean(x, axis=[1, 2]), self.w3) + self.b3


model = SmallCNN()
LR = 0.01


@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        logits = model(x)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
    grads = tape.gradient(loss, model.trainable_variables)
    for v, g in zip(model.trainable_variables, grads):
        v.assign_sub(LR * g)
    return loss


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--measure", action="store_true", help="also print the input wait share and compute per batch")
    args = p.parse_args(argv)
    tops, ends = [], []
    step = 0
    for x, y in make_dataset(args.steps):
        tops.append(time.perf_counter())
        loss = train_step(x, y)
        loss.numpy()
        ends.append(time.perf_counter())
        step += 1
        if step >= args.steps:
            break
    skip = 3 if step > 5 else 0
    steady = (ends[-1] - ends[skip]) / max(1, len(ends) - 1 - skip)
    print(f"RESULT samples_per_s={BATCH / steady:.1f} step_s={steady:.4f}")
    if args.measure:
        waits = [tops[i] - ends[i - 1] for i in range(skip + 1, len(ends))]
        compute = [ends[i] - tops[i] for i in range(skip + 1, len(ends))]
        print(f"MEASURE input_per_batch_ms={1e3 * np.median(waits):.1f} compute_per_batch_ms={1e3 * np.median(compute):.1f} "
              f"input_wait_share={sum(waits) / (ends[-1] - ends[skip]):.2f} keras_imported={'keras' in sys.modules}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
