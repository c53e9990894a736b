"""Overhead of `whyidle run` on a Keras `fit`, measured against a plain run in the same session.

A small Keras MLP (~10 ms steps on 2 CPU cores) runs alternately plain and under ``whyidle run``
(A B A B ..., so machine drift hits both alike). ``--backend tensorflow`` (default) feeds it
in-memory, cached and prefetched tf.data; ``--backend torch`` or ``jax`` (``KERAS_BACKEND``) feeds
a ``keras.utils.PyDataset`` of in-memory batches, the input whose every batch whyidle's input
timer sees on those backends (torch with one intra-op thread). Each run times its own batches with ``time.perf_counter`` from a
callback's ``on_train_batch_begin`` (on JAX, which dispatches steps asynchronously, from its
``on_train_batch_end``, which Keras runs once the step's logs are computed: the computation's
pace; the callback is ``async_safe``, so Keras's dispatch is the same in both runs) and prints the
median step time and the time of the whole ``fit``. Printed: the ratio of
median step times (whyidle's callback, train-function wrapper and, off TensorFlow, its input
timer; goal ≤ 1.02) and the ratio of ``fit`` times, which on TensorFlow also carries the
TensorFlow profiler window (10 steps) and its trace read, and on JAX the first step's compilation; and the ratio of the process's CPU time during
``fit`` (not stolen by other jobs, so steadier on a shared box).

    flock /tmp/whyidle-timing.lock python benchmarks/keras_overhead.py [--rounds 3] [--steps 400]
        [--backend torch] [--whyidle-args "--stack-hz 0"] [--pin 0|none]

The training process is pinned to one CPU (``--pin``, default CPU 0, plain and observed alike), as
in ``benchmarks/overhead.py``: other jobs on a shared box then move its steps less.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

WORKLOAD = r'''
import json, os, sys, time
os.environ["KERAS_BACKEND"] = sys.argv[2]
import numpy as np
import keras
steps = int(sys.argv[1])
x = np.random.rand(8192, 256).astype("float32"); y = np.random.randint(0, 10, 8192)
if sys.argv[2] == "tensorflow":
    import tensorflow as tf
    ds = tf.data.Dataset.from_tensor_slices((x, y)).cache().shuffle(8192).batch(128).repeat().prefetch(tf.data.AUTOTUNE)
else:
    if sys.argv[2] == "torch":  # one intra-op thread: OpenMP's spinning threads swing the steps on a shared box
        import torch
        torch.set_num_threads(1)
    class Batches(keras.utils.PyDataset):  # batches of 64: ~10 ms steps on one thread
        def __len__(self):
            return steps
        def __getitem__(self, i):
            j = i % 128 * 64
            return x[j:j + 64], y[j:j + 64]
    ds = Batches()
model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(1024, activation="relu"),
                          keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(10)])
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
class Clock(keras.callbacks.Callback):
    async_safe = True  # JAX: batch ends stay in Keras's threads, seen once each step's logs are computed
    def __init__(self):
        super().__init__(); self.t = []; self.ends = []
    def on_train_batch_begin(self, batch, logs=None):
        self.t.append(time.perf_counter())
    def on_train_batch_end(self, batch, logs=None):
        if sys.argv[2] == "jax":
            self.ends.append(time.perf_counter())
clock = Clock()
t0, c0 = time.perf_counter(), sum(os.times()[:2])
model.fit(ds, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[clock])
fit_s, cpu_s = time.perf_counter() - t0, sum(os.times()[:2]) - c0
t = sorted(clock.ends) if sys.argv[2] == "jax" else clock.t  # JAX: the computation's pace, not the dispatch's
d = sorted(b - a for a, b in zip(t[20:], t[21:]))
print("RESULT " + json.dumps({"median_s": d[len(d) // 2], "fit_s": fit_s, "cpu_s": cpu_s}))
'''


#: Command prefix pinning the training process (plain and observed alike) to one CPU (``--pin``).
PIN: list[str] = []


def run(script: str, steps: int, backend: str, observed: bool, out: str, extra: list[str] = ()) -> dict:
    cmd = PIN + [sys.executable, script, str(steps), backend]
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
    ap.add_argument("--backend", default="tensorflow", choices=("tensorflow", "torch", "jax"))
    ap.add_argument("--pin", default="0", help="CPU to pin the training process to with taskset ('none': no pin)")
    ap.add_argument("--whyidle-args", default="", help="extra `whyidle run` options, e.g. '--stack-hz 0'")
    args = ap.parse_args()
    if args.pin != "none" and shutil.which("taskset"):
        PIN[:] = ["taskset", "-c", args.pin]
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "keras_workload.py")
        with open(script, "w") as f:
            f.write(WORKLOAD)
        plain, watched = [], []
        for r in range(args.rounds):
            plain.append(run(script, args.steps, args.backend, False, ""))
            watched.append(run(script, args.steps, args.backend, True, os.path.join(tmp, f"run{r}"),
                               args.whyidle_args.split()))
            print(f"round {r + 1}: plain {plain[-1]['median_s'] * 1000:.2f} ms/step, {plain[-1]['fit_s']:.2f} s fit; "
                  f"whyidle {watched[-1]['median_s'] * 1000:.2f} ms/step, {watched[-1]['fit_s']:.2f} s fit")
    step_ratio = statistics.median(w["median_s"] for w in watched) / statistics.median(p["median_s"] for p in plain)
    fit_ratio = statistics.median(w["fit_s"] for w in watched) / statistics.median(p["fit_s"] for p in plain)
    pairs = statistics.median(w["median_s"] / p["median_s"] for w, p in zip(watched, plain))
    print(f"median step time ratio (whyidle / plain): {step_ratio:.3f}  (goal <= 1.02); median of the rounds' "
          f"ratios {pairs:.3f}")
    print(f"fit time ratio (whyidle / plain; TensorFlow: includes the profiler window): {fit_ratio:.3f}")
    cpu_ratio = statistics.median(w["cpu_s"] for w in watched) / statistics.median(p["cpu_s"] for p in plain)
    print(f"fit CPU time ratio (the process's user + system time, whyidle's threads in it; steadier on a shared "
          f"box): {cpu_ratio:.3f}")


if __name__ == "__main__":
    main()
