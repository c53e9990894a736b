"""Keras 3 on the PyTorch backend (``KERAS_BACKEND=torch``, default) or the JAX backend
(``--backend jax``): a healthy ``fit`` on in-memory numpy arrays.

Stages: ``os.environ["KERAS_BACKEND"]`` set before ``import keras``; 1,280 random samples of
128 features (numpy); an MLP (128 → 1024 → 1024 → 10), Adam, ``model.fit(x, y, batch_size=32)``:
40 steps by default. ``keras.utils.set_random_seed`` also imports TensorFlow (it seeds TF when TF
is installed), as in many real scripts: TF is loaded although the backend is torch or JAX.

Expected: a report with framework ``keras``, the step timing (>= 20 steps) and the input wait
measured (``keras.input_wait.method`` ``fit_input``: Keras slices the arrays in microseconds) and
no alarm: ``device_bound`` (the model's compute fills the step), no warning or critical finding.
On JAX the steps are on the computation's pace (JAX dispatches them asynchronously) and the
first step's ``jit`` compilation is start-up.

Measured on the shared 2-core dev box (RESULT, without whyidle): torch 2,790-3,910 samples/s
(step 8-12 ms), jax 8,000-8,860 samples/s (step 3.6-4.0 ms), 3 runs each on 2026-12-04. Under
whyidle: torch input wait ~3 %, jax ~0 %, no warning of the program's (only ``cpu_contention``
when other jobs share the box). Process ~6-8 s (TF and torch / JAX imports; JAX's first step
compiles for ~0.6 s).
"""

import argparse
import os
import sys

BACKEND = sys.argv[sys.argv.index("--backend") + 1] if "--backend" in sys.argv else "torch"
os.environ["KERAS_BACKEND"] = BACKEND

import numpy as np
import keras
from keras_common import StepTimer

BATCH = 32
FEATURES = 128


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--backend", choices=("torch", "jax"), default="torch")
    args = p.parse_args(argv)
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    n = args.steps * BATCH
    x = rng.standard_normal((n, FEATURES)).astype(np.float32)
    y = (x[:, :10].argmax(axis=1)).astype(np.int32)
    model = keras.Sequential([
        keras.Input((FEATURES,)),
        keras.layers.Dense(1024, activation="relu"),
        keras.layers.Dense(1024, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    timer = StepTimer()
    model.fit(x, y, batch_size=BATCH, epochs=1, callbacks=[timer], verbose=0)
    sps, step_s = timer.result(BATCH)
    print(f"RESULT samples_per_s={sps:.1f} step_s={step_s:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
