"""Keras ``fit`` on in-memory data (cached, shuffled, prefetched) with a compute-heavy CNN.

Stages: 2,048 random 32x32x3 images and labels (numpy) → ``from_tensor_slices`` →
``.cache().shuffle(1024).batch(32).prefetch(AUTOTUNE).repeat()``; a VGG-style CNN (3x3 convs
64, 64, max-pool, 128, 128, 128, global average pool, dense 10), Adam, TF's default threads.

Expected diagnosis: ``device_bound`` (the "device" is the CPU here): the input is ready before
each step (input wait ~1 %) and no other host work stands out. Nothing to fix in the pipeline.

Measured on the shared 2-core dev box: ``--measure`` (3 runs of 20 batches) loop step 66-75 ms,
``next(it)`` ~0.5 ms per batch, input wait share 0.008-0.009; ``fit`` (RESULT, default 40
steps): 447-509 samples/s, step 63-72 ms. Process ~7-10 s.
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
import keras
from keras_common import StepTimer, interleaved

BATCH = 32
IMAGE = (32, 32, 3)
SAMPLES = 2048


def make_dataset():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((SAMPLES, *IMAGE), dtype=np.float32)
    y = rng.integers(0, 10, SAMPLES).astype(np.int32)
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    return ds.cache().shuffle(1024, seed=0).batch(BATCH).prefetch(tf.data.AUTOTUNE).repeat()


def make_model():
    """A VGG-style CNN: five 3x3 convolutions in two blocks (64, 64 | 128 x 3), global pooling, a dense head."""
    model = keras.Sequential([
        keras.Input(IMAGE),
        keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(128, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(128, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(128, 3, padding="same", activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def measure(steps):
    """Standalone: the compiled train step alone on one batch, and interleaved with ``next(it)``
    as ``fit`` does (input wait share = time in ``next(it)`` / loop time)."""
    model = make_model()
    step = tf.function(model.train_step)
    it = iter(make_dataset())
    x, y = next(it)
    for _ in range(3):
        step((x, y))
    t_c = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step((x, y))["loss"].numpy()
        t_c.append(time.perf_counter() - t0)
    waits, t_step = interleaved(step, it, steps)
    print(f"MEASURE compute_per_batch_ms={1e3 * np.median(t_c):.1f} loop_step_ms={1e3 * np.mean(t_step):.1f} "
          f"input_per_batch_ms={1e3 * np.median(waits):.2f} input_wait_share={sum(waits) / sum(t_step):.3f}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--measure", action="store_true", help="time the input and the train step separately")
    args = p.parse_args(argv)
    keras.utils.set_random_seed(0)
    if args.measure:
        measure(args.steps)
        return 0
    model = make_model()
    timer = StepTimer()
    model.fit(make_dataset(), epochs=1, steps_per_epoch=args.steps, callbacks=[timer], verbose=0)
    sps, step_s = timer.result(BATCH)
    print(f"RESULT samples_per_s={sps:.1f} step_s={step_s:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
