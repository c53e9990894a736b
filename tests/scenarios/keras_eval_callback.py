"""Keras ``fit`` with an epoch-end evaluation callback that predicts one image at a time.

Stages: 512 random 32x32x3 images in memory, ``fit(x, y, batch_size=32, epochs=4)`` of a small
CNN (conv 32 → conv 64 → GAP → dense 10). The user's ``DetectionScore`` callback computes a
detection-style score on 128 validation images at each epoch end, the way detector code often does:

- faulty: ``model.predict_on_batch(image[None])`` per image, then a pure-Python greedy NMS over the
  10 class scores with 40 jittered boxes each (``iou`` in Python) and a per-class precision count;
- fixed: one ``model.predict(val, batch_size=128)`` and the same suppression vectorized with numpy.

Expected diagnosis (faulty): ``eval_bound`` (the callback's epoch-end time, ``evaluation``
part), cause ``host_work`` when the Python NMS dominates it. RESULT ``samples_per_s`` is over
``fit``'s wall time (what the job achieves).
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import json

import keras
import numpy as np


def iou(a, b):
    x1, y1 = max(a[0], b[0]), max(a[1], b[1])
    x2, y2 = min(a[2], b[2]), min(a[3], b[3])
    inter = max(0.0, x2 - x1) * max(0.0, y2 - y1)
    area = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / area if area > 0 else 0.0


def nms_python(boxes, scores, thr=0.5):
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    keep = []
    while order:
        i = order.pop(0)
        keep.append(i)
        order = [j for j in order if iou(boxes[i], boxes[j]) < thr]
    return keep


def nms_numpy(boxes, scores, thr=0.5):
    order = np.argsort(-scores)
    keep = []
    while order.size:
        i = order[0]
        keep.append(i)
        rest = order[1:]
        x1 = np.maximum(boxes[i, 0], boxes[rest, 0])
        y1 = np.maximum(boxes[i, 1], boxes[rest, 1])
        x2 = np.minimum(boxes[i, 2], boxes[rest, 2])
        y2 = np.minimum(boxes[i, 3], boxes[rest, 3])
        inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
        area = lambda b: (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])  # noqa: E731
        iou_ = inter / (area(boxes[i]) + area(boxes[rest]) - inter)
        order = rest[iou_ < thr]
    return keep


class DetectionScore(keras.callbacks.Callback):
    def __init__(self, images, labels, fixed):
        super().__init__()
        self.images, self.labels, self.fixed = images, labels, fixed
        rng = np.random.default_rng(0)
        base = rng.uniform(0, 24, (40, 2))
        self.boxes = np.concatenate([base, base + rng.uniform(4, 8, (40, 2))], axis=1)
        self.scores = []

    def on_epoch_end(self, epoch, logs=None):
        hits = 0
        if self.fixed:
            probs = self.model.predict(self.images, batch_size=len(self.images), verbose=0)
            for p, y in zip(probs, self.labels):
                best = int(np.argmax(p))
                jitter = p[best] * np.linspace(1.0, 0.5, len(self.boxes))
                hits += int(best == y and len(nms_numpy(self.boxes, jitter)) > 0)
        else:
            for img, y in zip(self.images, self.labels):
                p = np.asarray(self.model.predict_on_batch(img[None]))[0]
                best = max(range(len(p)), key=lambda c: p[c])
                for c in range(len(p)):  # every class's boxes, suppressed in Python
                    jitter = [float(p[c]) * (1.0 - 0.5 * k / len(self.boxes)) for k in range(len(self.boxes))]
                    kept = nms_python(self.boxes.tolist(), jitter)
                    if c == best:
                        hits += int(best == y and len(kept) > 0)
        self.scores.append(hits / len(self.labels))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variant", choices=("faulty", "fixed"), default="faulty")
    p.add_argument("--epochs", type=int, default=4)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, 512)
    vx, vy = x[:128], y[:128]
    model = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Conv2D(32, 3, activation="relu"),
                              keras.layers.Conv2D(64, 3, activation="relu"), keras.layers.GlobalAveragePooling2D(),
                              keras.layers.Dense(10)])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    score = DetectionScore(vx, vy, args.variant == "fixed")
    t0 = time.perf_counter()
    model.fit(x, y, batch_size=32, epochs=args.epochs, callbacks=[score], verbose=0)
    wall = time.perf_counter() - t0
    print("RESULT " + json.dumps({"scenario": "keras_eval_callback", "variant": args.variant, "wall_s": round(wall, 3),
                                  "samples_per_s": round(len(x) * args.epochs / wall, 1), "epochs": args.epochs}))


if __name__ == "__main__":
    main()
