"""Keras 3 on the PyTorch or JAX backend, ``fit`` fed by a ``keras.utils.PyDataset`` that decodes
JPEG images for every batch.

Stages: ``KERAS_BACKEND`` = ``--backend`` (``torch``, default, or ``jax``) before ``import keras``;
1,280 photo files (64 synthetic 400x400 RGB photos encoded as JPEG, quality 90, repeated) in
memory, as a reader would hand them over; the user's ``Photos(keras.utils.PyDataset)`` with the
default ``workers=1`` (so Keras calls ``__getitem__`` in the training thread, one batch at a time); per batch: each image decoded
with PIL and resized to 128x128, then a random 112x112 crop, a random flip and scaling to [0, 1]
(numpy); a small CNN (2x2 average pooling, conv 16 / stride 2, conv 32, global pooling, dense
10), Adam, batch 32, ``fit(epochs=3)``, 40 batches per epoch.

- faulty (default): the 32 JPEGs of a batch are decoded again in every ``__getitem__``, every epoch.
- fixed (``--variant fixed``, ``--fixed``): ``Photos`` decodes every photo once when it is built
  and keeps the uint8 arrays (what whyidle's printed fix says: cache the decoded data);
  ``__getitem__`` only crops, flips and scales.

- workers (``--variant workers``): the faulty ``Photos`` with ``workers=2,
  use_multiprocessing=True`` (JAX: 2 worker threads), whyidle's second option.

One compute thread on both backends (``torch.set_num_threads(1)``, ``XLA_FLAGS`` single-threaded
Eigen), as the PyTorch scenarios: a steadier ratio on a shared 2-core box.

Expected diagnosis (faulty, both backends): ``input_bound``, cause ``python_in_pipeline``
(``fit_input`` ``PyDataset``, built in the training thread), printed fix: decode once and keep the
decoded arrays (``decode_share`` 0.93-0.95: the part of the loading in PIL's decoding, from the
stack samples), with ``PyDataset(workers=2, use_multiprocessing=True)`` (JAX: worker threads) as an
option; nothing of TensorFlow. The fixed variant waits little for its remaining per-batch work
(crop, flip, Keras's conversion: ~2.7 ms a batch on torch, 0.13-0.14 of its step; with the 4x4
pooling of the first version the step was 11-14 ms and the wait 0.22-0.25, without whyidle too:
on the edge of a critical input wait, which the test's fixed run read in 3 of 9 runs).

Measured on the shared 2-core dev box on 2026-12-05 (2x2 pooling; RESULT samples/s of ``fit``,
each variant under ``whyidle run`` one after the other, under a lock), against whyidle's estimate
from the faulty run:

- torch: faulty 536-554 samples/s (step 58-60 ms, data wait 0.70-0.71), fixed 1,540-1,658 (19-21
  ms, data wait 0.13-0.14, ``input_bound`` warning): fixed/faulty 2.8-3.1×; estimated 2.92×.
  Without whyidle: faulty 544, fixed 1,371-1,608 (2.5-3.0×).
- jax: faulty 762 samples/s (42 ms, data wait 0.60), fixed 2,435 (13 ms; ``startup_bound``: the jit
  compilation of a short run): 3.2×; estimated 2.52×.
- With the 4x4 pooling (2026-12-04): torch 4.2-4.9× measured, 4.07× estimated; jax 9.2-9.3×,
  7.93×; workers 1.38× (torch) and 1.80× (jax threads) measured, 1.69× and 1.53× estimated.

Process ~12-20 s (imports, 120 steps).
"""

import argparse
import io
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("torch", "jax"), default="torch")
    p.add_argument("--variant", choices=("faulty", "fixed", "workers"), default="faulty")
    p.add_argument("--fixed", dest="variant", action="store_const", const="fixed")
    p.add_argument("--steps", type=int, default=40, help="batches per epoch")
    p.add_argument("--epochs", type=int, default=3)
    return p.parse_args(argv)


ARGS = parse()
os.environ["KERAS_BACKEND"] = ARGS.backend
# one compute thread, as the other scenarios (torch.set_num_threads(1) below): steadier on a shared 2-core box
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import numpy as np  # noqa: E402
import keras  # noqa: E402
from PIL import Image  # noqa: E402

from keras_common import StepTimer  # noqa: E402

BATCH = 32
PHOTO = 400  # the stored photos' side (320 until 2026-12-05: the JAX faulty run waited 45-49 % on an AVX2 EPYC VM)
SIDE = 128   # decoded and resized to this side
CROP = 112


def make_photos(n, seed=0, unique=64):
    """``n`` photo files as JPEG bytes: ``unique`` synthetic photos (smooth gradients plus noise, so
    JPEG has something to encode), repeated (a cheap set-up: the decoding cost is per file)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:PHOTO, 0:PHOTO].astype(np.float32) / PHOTO
    noise = rng.normal(0, 12, (PHOTO, PHOTO, 3)).astype(np.float32)
    photos = []
    for k in range(unique):
        a, b, c = rng.uniform(0, 255, 3)
        img = np.stack([a * xx, b * yy, c * (1 - xx * yy)], axis=-1) + np.roll(noise, 7 * k, axis=(0, 1))
        buf = io.BytesIO()
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(buf, format="JPEG", quality=90)
        photos.append(buf.getvalue())
    return [photos[i % unique] for i in range(n)], rng.integers(0, 10, n).astype(np.int32)


def decode(data):
    """JPEG bytes → a SIDE x SIDE uint8 RGB array (decoded, then resized to the training size)."""
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB").resize((SIDE, SIDE), Image.BILINEAR))


class Photos(keras.utils.PyDataset):
    def __init__(self, files, labels, decode_once=False, **kwargs):
        super().__init__(**kwargs)
        self.files, self.labels = files, labels
        self.images = np.stack([decode(f) for f in files]) if decode_once else None
        self.rng = np.random.default_rng(1)

    def __len__(self):
        return len(self.labels) // BATCH

    def __getitem__(self, i):
        out = np.empty((BATCH, CROP, CROP, 3), np.float32)
        for k, j in enumerate(range(i * BATCH, (i + 1) * BATCH)):
            img = self.images[j] if self.images is not None else decode(self.files[j])
            y, x = self.rng.integers(0, SIDE - CROP, 2)
            img = img[y:y + CROP, x:x + CROP]
            if self.rng.random() < 0.5:
                img = img[:, ::-1]
            out[k] = img
        out *= 1 / 255.0
        return out, self.labels[i * BATCH:(i + 1) * BATCH]


def make_model():
    model = keras.Sequential([
        keras.Input((CROP, CROP, 3)),
        keras.layers.AveragePooling2D(2),
        keras.layers.Conv2D(16, 3, strides=2, activation="relu"),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def main():
    if ARGS.backend == "torch":  # one intra-op thread, as the other PyTorch scenarios (steadier on a shared 2-core box)
        import torch
        torch.set_num_threads(1)
    keras.utils.set_random_seed(0)
    files, labels = make_photos(ARGS.steps * BATCH)
    workers = {"workers": 2, "use_multiprocessing": ARGS.backend != "jax"} if ARGS.variant == "workers" else {}
    data = Photos(files, labels, decode_once=ARGS.variant == "fixed", **workers)
    model = make_model()
    timer = StepTimer()
    model.fit(data, epochs=ARGS.epochs, callbacks=[timer], verbose=0)
    sps, step_s = timer.result(BATCH)
    print(f"RESULT samples_per_s={sps:.1f} step_s={step_s:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
