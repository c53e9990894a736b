"""C03: a tf.data ``map`` that runs sequentially (no ``num_parallel_calls``) and no ``prefetch``.

Stages (shared/cases.md C03, CPU scenario): ``tf.data.Dataset.range(3000)`` mapped through
``tf.numpy_function(load_sample)``, which sleeps 4 ms (an I/O-like read that releases the GIL) and
spends ~0.3 ms of numpy "decoding" into a 32x32x3 float image; ``.batch(32)``; a small CNN
(Conv → Conv → GAP → Dense 10) trained with ``model.fit(ds, steps_per_epoch=N)``.

- faulty: ``ds.map(tf_load)`` (one call at a time), no ``prefetch``.
- fixed:  ``ds.map(tf_load, num_parallel_calls=tf.data.AUTOTUNE)`` and ``.prefetch(tf.data.AUTOTUNE)``.

Expected diagnosis (faulty): ``input_bound``, cause ``sequential_map`` (the map calls Python, so
``python_in_pipeline`` is acceptable too); the fix is ``num_parallel_calls=tf.data.AUTOTUNE`` on the
map and ``.prefetch(tf.data.AUTOTUNE)``. The fixed run is not input-bound (compute-bound).

Calibration: two things on TF 2.21 and this 2-core box differ from the case's arithmetic.

1. TF's default tf.data optimizations already overlap the faulty pipeline with the step: the
   sequential ``map`` + ``batch`` is fused into one asynchronous MapAndBatch (and a ``prefetch`` is
   injected when it is not), so the next batch is loaded in a background thread, one sample at a
   time, while the model trains. The faulty step is max(load, compute), not load + compute
   (measured with a 64/192 model, ~62 ms per step alone: 91-122 ms per step with the defaults,
   ~165 ms with ``map_and_batch_fusion`` and ``inject_prefetch`` turned off). Its input wait is
   about 1 - compute/load.
2. tf.data's thread pool has as many threads as the machine has cores, and AUTOTUNE never runs more
   map calls at once than that: 2 here, so the fixed pipeline loads at most ~2x faster (~42 ms per
   batch) and the fixed run could not be both >= 1.8x faster and free of input wait.

So: the pipeline's thread pool is set to 8 threads (``options.threading.private_threadpool_size``,
both variants; it stands in for the case's many-core nodes), the CNN is widened from 16/32 to
40/80 filters (~23 ms per step on one thread: the faulty run stays well input-bound, the fixed
one is compute-bound), and TF runs ops on one intra-op thread (like the PyTorch scenarios: with
two, every op of the step waits for a core the loading threads hold, which made the step time
bimodal).

Measured on the shared 2-core dev box (load average 1-2), ``--measure`` (3 runs each, 40 batches,
times per batch, medians; see ``measure``):

    variant  input alone   train step alone   loop step   input wait share   samples/s
    faulty   79-84 ms      22-30 ms           87-91 ms    0.64               350-369
    fixed    20-24 ms      23-25 ms           37-41 ms    0.03               779-858

That was with a 2 ms read. On 2026-12-01 the same box ran the train step alone in 54-68 ms and
the pipeline in ~119 ms per batch, so the faulty run's input wait fell to 0.30-0.37 (without
whyidle too) and the scenario no longer showed its fault; the read is now 4 ms, which keeps the
faulty pipeline well behind the step on a box ~2.5x slower than the one above: ``--measure``
faulty input 181 ms, train step 54 ms, loop 192 ms, input wait 0.62, 166 samples/s; fixed input
59 ms, train step 64 ms, loop 83 ms, input wait 0.02, 387 samples/s (2.3x).

Earlier figures (2 ms read), ``fit`` (RESULT, 3 alternating runs of 80 steps): faulty 303-351 samples/s (step 91-106 ms),
fixed 744-789 samples/s (step 41-43 ms): fixed/faulty 2.25-2.52x (2.45x in 2 runs of 50 steps).
The fixed step is longer than the train step alone because the loading threads' CPU work
(~12 ms of CPU per batch) shares the two cores with it. Process time: faulty ~9-11 s at the
default 60 steps (case: 80 steps, ~11-15 s), fixed ~8 s.

``--measure`` times, instead of fitting: the pipeline alone (``next(it)`` back to back), Keras'
``train_step`` in a ``tf.function`` alone on a batch held in memory, and the two interleaved as
``fit`` runs them (input wait = time in ``next(it)`` / loop time).
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
READ_LATENCY_S = 0.004  # the "read" of one pickled sample: an I/O-like wait that releases the GIL
DECODE_ROUNDS = 6       # numpy "decoding" rounds: ~0.3 ms of CPU per sample on the 2-core dev box
DATA_THREADS = 8        # tf.data thread-pool size (see make_dataset)

_MIX = np.random.default_rng(0).standard_normal((IMAGE[2] * 4, IMAGE[2] * 4)).astype(np.float32) / 4


def load_sample(index):
    """What the case's ``py_function`` does per sample: read a file, decode it into an image."""
    time.sleep(READ_LATENCY_S)
    rng = np.random.default_rng(int(index))
    raw = rng.integers(0, 256, size=IMAGE[0] * IMAGE[1] * IMAGE[2], dtype=np.uint8)
    img = raw.reshape(IMAGE[0] * IMAGE[1] // 4, IMAGE[2] * 4).astype(np.float32) / 255.0
    for _ in range(DECODE_ROUNDS):  # a colour transform + normalisation, as a decoder would do
        img = np.tanh(img @ _MIX)
        img = (img - img.mean(axis=0)) / (img.std(axis=0) + 1e-3)
    label = np.int32(int(index) % 10)
    return img.reshape(IMAGE).astype(np.float32), label


def tf_load(index):
    img, label = tf.numpy_function(load_sample, [index], [tf.float32, tf.int32])
    img.set_shape(IMAGE)
    label.set_shape(())
    return img, label


def make_dataset(steps, fixed):
    """``range → map(load) → batch(32)``; the fix adds ``num_parallel_calls`` and ``prefetch``."""
    n = max(3000, (steps + 2) * BATCH)
    options = tf.data.Options()
    # tf.data's thread pool is as large as the machine's core count, and AUTOTUNE never runs more
    # map calls at once than that pool has threads: 2 on the dev box, so the fixed pipeline could
    # load at most ~2x faster. The case ran on many-core nodes; 8 threads stand in for them (both
    # variants: the sequential map uses one call at a time anyway).
    options.threading.private_threadpool_size = DATA_THREADS
    ds = tf.data.Dataset.range(n).with_options(options)
    if fixed:
        ds = ds.map(tf_load, num_parallel_calls=tf.data.AUTOTUNE)
    else:
        ds = ds.map(tf_load)
    ds = ds.batch(BATCH)
    if fixed:
        ds = ds.prefetch(tf.data.AUTOTUNE)
    return ds


def make_model():
    """The case's small CNN (Conv → Conv → GAP → Dense 10), widened from 16/32 to 40/80 filters so
    that a step costs ~30 % of loading a batch sequentially (see the module docstring)."""
    model = keras.Sequential([
        keras.Input(IMAGE),
        keras.layers.Conv2D(40, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(80, 3, padding="same", activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def measure(steps, fixed):
    """Standalone calibration, three timings per batch (medians):

    - input: ``next(it)`` alone, back to back (the pipeline's throughput);
    - compute: the compiled train step (Keras' own ``train_step`` in a ``tf.function``, as
      ``fit`` runs it) alone on one batch held in memory;
    - loop: ``next(it)`` then the train step, as ``fit`` interleaves them; the share of the loop
      spent in ``next(it)`` is the input wait.
    """
    model = make_model()
    step = tf.function(model.train_step)
    samples = [load_sample(i) for i in range(BATCH)]
    x = tf.constant(np.stack([s[0] for s in samples]))
    y = tf.constant(np.array([s[1] for s in samples]))
    for _ in range(3):
        step((x, y))
    t_c = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step((x, y))["loss"].numpy()
        t_c.append(time.perf_counter() - t0)
    it = iter(make_dataset(3 * steps + 10, fixed))
    next(it)
    next(it)
    t_in = []
    for _ in range(steps):
        t0 = time.perf_counter()
        next(it)
        t_in.append(time.perf_counter() - t0)
    del it
    it = iter(make_dataset(3 * steps + 10, fixed))
    for _ in range(3):
        step(next(it))["loss"].numpy()
    waits, t_step = interleaved(step, it, steps)
    print(f"MEASURE variant={'fixed' if fixed else 'faulty'} input_per_batch_ms={1e3 * np.median(t_in):.1f} "
          f"compute_per_batch_ms={1e3 * np.median(t_c):.1f} loop_step_ms={1e3 * np.mean(t_step):.1f} "
          f"input_wait_share={sum(waits) / sum(t_step):.2f} samples_per_s={BATCH * len(t_step) / sum(t_step):.1f}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variant", choices=["faulty", "fixed"], default="faulty")
    p.add_argument("--fixed", action="store_const", const="fixed", dest="variant")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--measure", action="store_true",
                   help="time the input pipeline and the train step separately instead of fitting")
    args = p.parse_args(argv)
    fixed = args.variant == "fixed"
    keras.utils.set_random_seed(0)
    # one compute thread (like the PyTorch scenarios): the model keeps one core, the loading the
    # other; two compute threads make every op wait for a core the loading threads hold
    tf.config.threading.set_intra_op_parallelism_threads(1)
    if args.measure:
        measure(args.steps, fixed)
        return 0
    ds = make_dataset(args.steps, fixed)
    model = make_model()
    timer = StepTimer()
    model.fit(ds, epochs=1, steps_per_epoch=args.steps, callbacks=[timer], verbose=0)
    sps, step_s = timer.result(BATCH)
    print(f"RESULT samples_per_s={sps:.1f} step_s={step_s:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
