"""Keras ``fit`` fed by ``tf.data.Dataset.from_generator`` over a slow pure-Python generator.

Stages: the user's generator ``records()`` makes a CSV-like text record (96 fields) and parses it
with hand-written Python (``parse_record``: ``split``, ``float()``, running mean/std, binning into
64 features), ~0.9 ms of CPU per element that holds the GIL; ``.batch(32).prefetch(AUTOTUNE)``;
a small MLP (64 → 512 → 512 → 10). ``from_generator`` runs the generator through a Python call
in a tf.data thread, one element at a time: prefetch overlaps it with the step, but it cannot
be parallelised (``num_parallel_calls`` does not apply, and the GIL serialises Python anyway).

Expected diagnosis: ``input_bound``, cause ``python_in_pipeline`` (a ``from_generator`` source);
fix: move the per-element Python work out of the pipeline (precompute/cache the features, or
express the parsing with tf ops such as ``tf.io.decode_csv`` in a parallel ``map``).

Measured on the shared 2-core dev box (``--measure``, 2 runs of 30 batches): generator alone
~29 ms per batch, train step alone 1.1-1.5 ms, loop step 34-36 ms, input wait share 0.81-0.86;
``fit`` (RESULT, default 60 steps): 857-913 samples/s, step 35-37 ms. Process ~6 s.
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
FEATURES = 64
FIELDS = 96          # comma-separated fields in one synthetic record
PARSE_PASSES = 50    # pure-Python passes over a record: ~1 ms of CPU (GIL held) per element


def make_record(index):
    """One synthetic CSV-like text record (what a reader would hand to a parser)."""
    rng = (index * 2654435761) % 4294967296
    fields = []
    for j in range(FIELDS):
        rng = (rng * 1103515245 + 12345) % 2147483648
        fields.append(f"{(rng % 100000) / 1000:.3f}")
    return ",".join(fields)


def parse_record(text):
    """Hand-written Python feature extraction: split, float(), running statistics, binning."""
    values = [float(v) for v in text.split(",")]
    feats = [0.0] * FEATURES
    for p in range(PARSE_PASSES):
        mean = sum(values) / len(values)
        var = sum((v - mean) ** 2 for v in values) / len(values)
        std = var ** 0.5 + 1e-6
        for j, v in enumerate(values):
            z = (v - mean) / std
            feats[(j * 7 + p) % FEATURES] += z * z if j % 2 else z
        values = [v * 0.5 + (i % 3) for i, v in enumerate(values)]
    return feats


def records(n):
    """The user's generator: reads (here: makes) and parses one record per element."""
    for i in range(n):
        yield np.asarray(parse_record(make_record(i)), dtype=np.float32), np.int32(i % 10)


def make_dataset(steps):
    n = (steps + 4) * BATCH
    ds = tf.data.Dataset.from_generator(
        lambda: records(n),
        output_signature=(tf.TensorSpec((FEATURES,), tf.float32), tf.TensorSpec((), tf.int32)))
    return ds.batch(BATCH).prefetch(tf.data.AUTOTUNE)


def make_model():
    model = keras.Sequential([
        keras.Input((FEATURES,)),
        keras.layers.Dense(512, activation="relu"),
        keras.layers.Dense(512, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def measure(steps):
    """Standalone: per batch, the generator alone, the compiled train step alone, and the two
    interleaved as ``fit`` does (input wait share = time in ``next(it)`` / loop time)."""
    model = make_model()
    step = tf.function(model.train_step)
    x = tf.constant(np.stack([parse_record(make_record(i)) for i in range(BATCH)]).astype(np.float32))
    y = tf.constant(np.arange(BATCH, dtype=np.int32) % 10)
    for _ in range(3):
        step((x, y))
    t_c = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step((x, y))["loss"].numpy()
        t_c.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    for i in range(BATCH * 4):
        parse_record(make_record(i))
    t_gen = (time.perf_counter() - t0) / 4
    it = iter(make_dataset(steps + 3))
    for _ in range(3):
        step(next(it))["loss"].numpy()
    waits, t_step = interleaved(step, it, steps)
    print(f"MEASURE generator_per_batch_ms={1e3 * t_gen:.1f} compute_per_batch_ms={1e3 * np.median(t_c):.1f} "
          f"loop_step_ms={1e3 * np.mean(t_step):.1f} input_wait_share={sum(waits) / sum(t_step):.2f}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--measure", action="store_true", help="time the generator and the train step separately")
    args = p.parse_args(argv)
    keras.utils.set_random_seed(0)
    if args.measure:
        measure(args.steps)
        return 0
    model = make_model()
    timer = StepTimer()
    model.fit(make_dataset(args.steps), epochs=1, steps_per_epoch=args.steps, callbacks=[timer], verbose=0)
    sps, step_s = timer.result(BATCH)
    print(f"RESULT samples_per_s={sps:.1f} step_s={step_s:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
