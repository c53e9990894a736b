"""Keras ``fit`` with a user callback that logs heavily after every batch.

Stages: 1,024 random 32x32x3 images in memory, ``.cache().shuffle().batch(32).prefetch(AUTOTUNE)``;
a modest CNN (conv 48 → conv 96 → GAP → dense 10) with an accuracy metric; the user's
``ExperimentLogger`` callback calls ``log_batch(...)`` in ``on_train_batch_end``: it reads the
logs, copies 3,000 weights of every variable (``get_weights()`` + ``tolist()`` + rounding),
formats a status line and a 2,000-value loss trend string, sorts a 30,000-entry history, and
writes one ``json.dumps`` record (~1 MB) to a file in a temporary directory, flushed, every batch.

Expected diagnosis: ``host_bound``, naming ``log_batch`` (keras_logging_callback.py) as the host
work between steps; input wait is small. Fix: log every N batches (or in ``on_epoch_end``), keep
less per record, or log from a background thread.

Measured on the shared 2-core dev box (``--measure``: the callback times its own ``log_batch``
calls; a second ``fit`` without the logger gives the plain step), 3 runs of 60 steps: step
48-50 ms with the logger, 24-25 ms without, ``log_batch`` 22-24 ms per batch = 0.47-0.49 of the
step. ``fit`` (RESULT): 624-672 samples/s. Process ~8-9 s.
"""

import argparse
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
import keras
from keras_common import StepTimer

BATCH = 32
IMAGE = (32, 32, 3)
SAMPLES = 1024
HISTORY = 30000      # recent per-batch values kept and dumped with every log record
WEIGHT_SAMPLE = 3000 # weights per layer copied into every log record


def make_dataset():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((SAMPLES, *IMAGE), dtype=np.float32)
    y = rng.integers(0, 10, SAMPLES).astype(np.int32)
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    return ds.cache().shuffle(SAMPLES, seed=0).batch(BATCH).prefetch(tf.data.AUTOTUNE).repeat()


def make_model():
    model = keras.Sequential([
        keras.Input(IMAGE),
        keras.layers.Conv2D(48, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(96, 3, padding="same", activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def log_batch(log_file, step, logs, history, model):
    """What a hand-written experiment logger does after every batch: a formatted status line, a
    JSON record with the recent history and a sample of every layer's weights, written and
    flushed."""
    history.append({k: float(v) for k, v in logs.items()})
    del history[:-HISTORY]
    layers = {}
    for layer in model.layers:
        for i, w in enumerate(layer.get_weights()):
            flat = w.ravel()[:WEIGHT_SAMPLE].tolist()
            layers[f"{layer.name}/{i}"] = {
                "shape": list(w.shape),
                "sample": [round(v, 6) for v in flat],
                "mean": sum(flat) / len(flat),
                "absmax": max(abs(v) for v in flat),
            }
    losses = [h["loss"] for h in history]
    status = " | ".join(f"{k}={v:.5f}" for k, v in sorted(history[-1].items()))
    trend = ", ".join(f"{v:.4f}" for v in losses[-2000:])
    record = {
        "step": step,
        "time": time.time(),
        "status": status,
        "trend": trend,
        "loss_mean": sum(losses) / len(losses),
        "loss_sorted": sorted(losses)[:: max(1, len(losses) // 100)],
        "history": history,
        "layers": layers,
    }
    log_file.write(json.dumps(record, sort_keys=True) + "\n")
    log_file.flush()


class ExperimentLogger(keras.callbacks.Callback):
    """The user's callback: ``log_batch`` after every training batch."""

    def __init__(self, path):
        super().__init__()
        self.log_file = open(path, "w")
        self.history = [{"loss": 2.3, "accuracy": 0.1}] * HISTORY
        self.log_s = 0.0
        self.calls = 0

    def on_train_batch_end(self, batch, logs=None):
        t0 = time.perf_counter()
        log_batch(self.log_file, batch, logs or {}, self.history, self.model)
        self.log_s += time.perf_counter() - t0
        self.calls += 1

    def on_train_end(self, logs=None):
        self.log_file.close()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--measure", action="store_true",
                   help="also print the time spent in log_batch and, from a second fit without the "
                        "logger, the step time without it")
    args = p.parse_args(argv)
    keras.utils.set_random_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        model = make_model()
        logger = ExperimentLogger(os.path.join(tmp, "train_log.jsonl"))
        timer = StepTimer()
        model.fit(make_dataset(), epochs=1, steps_per_epoch=args.steps, callbacks=[timer, logger], verbose=0)
        sps, step_s = timer.result(BATCH)
        if args.measure:
            plain = StepTimer()
            model.fit(make_dataset(), epochs=1, steps_per_epoch=args.steps, callbacks=[plain], verbose=0)
            log_ms = 1e3 * logger.log_s / logger.calls
            print(f"MEASURE step_ms={1e3 * step_s:.1f} log_batch_ms={log_ms:.1f} "
                  f"log_share={log_ms / (1e3 * step_s):.2f} step_without_logger_ms={1e3 * plain.result(BATCH)[1]:.1f}")
    print(f"RESULT samples_per_s={sps:.1f} step_s={step_s:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
