"""Overhead of `whyidle run` on a Keras `fit`, measured against a plain run in the same session.

A small Keras MLP on in-memory, cached and prefetched tf.data (~10 ms steps on 2 CPU cores) runs
alternately plain and under ``whyidle run`` (A B A B ..., so machine drift hits both alike). Each
run times its own batches with ``time.perf_counter`` from a callback's ``on_train_batch_begin``
(no batch-end hook, so Keras's dispatch is the same in both runs) and prints the median step time
and the time of the whole ``fit``. Printed: the ratio of median step times (whyidle's callback and
train-function wrapper; goal ≤ 1.02) and the ratio of ``fit`` times, which also carries the
TensorFlow profiler window (10 steps) and its trace read.

    python benchmarks/keras_overhead.py [--rounds 3] [--steps 400] [--whyidle-args "--stack-hz 0"]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

WORKLOAD = r'''
import json, sys, time
import numpy as np
import tensorflow as tf
import keras
steps = int(sys.argv[1])
x = np.random.rand(8192, 256).astype("float32"); y = np.random.randint(0, 10, 8192)
ds = tf.data.Dataset.from_tensor_slices((x, y)).cache().shuffle(8192).batch(128).repeat().prefetch(tf.data.AUTOTUNE)
model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(1024, activation="relu"),
                          keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(10)])
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
class Clock(keras.callbacks.Callback):
    def __init__(self):
        super().__init__(); self.t = []
    def on_train_batch_begin(self, batch, logs=None):
        self.t.append(time.perf_counter())
clock = Clock()
t0 = time.perf_counter()
model.fit(ds, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[clock])
fit_s = time.perf_counter() - t0
d = sorted(b - a for a, b in zip(clock.t[20:], clock.t[21:]))
print("RESULT " + json.dumps({"median_s": d[len(d) // 2], "fit_s": fit_s}))
'''


def run(script: str, steps: int, observed: bool, out: str, extra: list[str] = ()) -> dict:
    cmd = [sys.executable, script, str(steps)]
    if observed:
        cmd = [sys.executable, "-m", "whyidle", "run", "-q", "--out", out, *extra, "--"] + cmd
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"workload failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(line[7:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--whyidle-args", default="", help="extra `whyidle run` options, e.g. '--stack-hz 0'")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "keras_workload.py")
        with open(script, "w") as f:
            f.write(WORKLOAD)
        plain, watched = [], []
        for r in range(args.rounds):
            plain.append(run(script, args.steps, False, ""))
            watched.append(run(script, args.steps, True, os.path.join(tmp, f"run{r}"), args.whyidle_args.split()))
            print(f"round {r + 1}: plain {plain[-1]['median_s'] * 1000:.2f} ms/step, {plain[-1]['fit_s']:.2f} s fit; "
                  f"whyidle {watched[-1]['median_s'] * 1000:.2f} ms/step, {watched[-1]['fit_s']:.2f} s fit")
    step_ratio = statistics.median(w["median_s"] for w in watched) / statistics.median(p["median_s"] for p in plain)
    fit_ratio = statistics.median(w["fit_s"] for w in watched) / statistics.median(p["fit_s"] for p in plain)
    print(f"median step time ratio (whyidle / plain): {step_ratio:.3f}  (goal <= 1.02)")
    print(f"fit time ratio (whyidle / plain, includes the profiler window): {fit_ratio:.3f}")


if __name__ == "__main__":
    main()
