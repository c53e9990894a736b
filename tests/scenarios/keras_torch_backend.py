"""Keras 3 on the PyTorch backend (``KERAS_BACKEND=torch``): ``fit`` on in-memory numpy arrays.

Stages: ``os.environ["KERAS_BACKEND"] = "torch"`` before ``import keras``; 1,280 random samples of
128 features (numpy); an MLP (128 → 1024 → 1024 → 10), Adam, ``model.fit(x, y, batch_size=32)``:
40 steps by default. ``keras.utils.set_random_seed`` also imports TensorFlow (it seeds TF when TF
is installed), as in many real scripts: TF is loaded although the backend is torch.

Expected: a report with framework ``keras`` and the step timing (>= 20 steps); nothing to
diagnose in particular (no tf.data, no TF profiler for a torch backend).

Measured on the shared 2-core dev box: RESULT 3,560-3,910 samples/s (step 8-9 ms), 2 runs.
Process ~6 s (TF and torch imports).
"""

import argparse
import os
import sys

os.environ["KERAS_BACKEND"] = "torch"

import numpy as np
import keras
from keras_common import StepTimer

BATCH = 32
FEATURES = 128


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40)
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
