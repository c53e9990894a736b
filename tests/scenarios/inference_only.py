"""Evaluation / inference only: no backward, no optimizer, a slow in-process DataLoader (input-bound inference).

The shape of a typical ``evaluate.py`` / ``predict.py``: a CNN classifier (3 conv blocks with
batch norm, global pool, dropout, linear to 10 classes) put in ``model.eval()`` and run under
``torch.inference_mode()`` (``--no-grad``: ``torch.no_grad()`` instead) over a DataLoader of a
synthetic "test set" (3x32x32 uint8 images + labels, seeded). Each batch's predictions are kept
(``torch.cat`` at the end) and the correct count is accumulated in a tensor; the accuracy,
the per-class prediction counts and the first predictions are printed at the end. One pass over
``--steps`` x 64 samples (default 100 batches of 64), ``torch.set_num_threads(1)``.

Each sample costs a ``time.sleep`` standing for the read latency (off-CPU) plus a little numpy
(normalise). The latency is calibrated at start-up as in C01: a batch's sleeps add up to T_c,
T_c = median of 5 forward passes on an in-memory batch after 3 warm-up ones (``--tc`` skips the
calibration); on the 2-core dev box T_c ~19 ms, so ~0.3 ms per sample (with the sleeps'
overshoot, the numpy and the collate a batch takes ~1.3 T_c to load).

- faulty: ``num_workers=0``: the main process sleeps through every read; each batch costs its
  loading + T_c of forward (data wait ~0.55, ~50 ms per batch).
- fixed: ``num_workers=2``: two workers read (sleep) side by side while the model runs: ~T_c per
  batch; a data wait of ~0.12-0.15 is left (receiving each batch from the workers, and the
  workers' CPU work sharing the second core), not the loading itself.
- ``--no-loader`` (either variant): no Dataset and no DataLoader: the test set is one big
  float tensor made up front, sliced ``x[i:i + 64]`` in the loop (no read latency); data wait ~0.

Expected diagnosis: faulty ``input_bound`` / ``loader_in_main_process`` (the main thread sleeps
in the dataset's ``__getitem__``: storage-like, ``data_cpu_share`` low); fixed and ``--no-loader``
``device_bound`` (the forward holds the step). Whatever counts steps has to count forward calls:
there is no ``backward()`` and no ``optimizer.step()`` in the process, and the 8 calibration
forwards before the loop are not steps (``--tc`` skips them).

RESULT: the usual keys (``steps`` = ``forward_calls`` = batches, ``samples_per_s``, ``wall_s``,
``data_wait_share`` = time blocked in ``next(loader)`` (iterator creation included; with
``--no-loader`` the slicing) / loop time), plus ``accuracy``, ``tc_s``, ``read_latency_s``.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import statistics
import time

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

from common import StepMeter, make_parser, seed_everything

BATCH = 64
MEAN = np.array([0.49, 0.48, 0.45], np.float32).reshape(3, 1, 1)
STD = np.array([0.25, 0.24, 0.26], np.float32).reshape(3, 1, 1)


class Classifier(nn.Module):
    def __init__(self, width=16, num_classes=10):
        super().__init__()

        def block(cin, cout):
            return [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]

        self.features = nn.Sequential(
            *block(3, width), nn.MaxPool2d(2),
            *block(width, 2 * width), nn.MaxPool2d(2),
            *block(2 * width, 4 * width), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )
        self.classifier = nn.Sequential(nn.Dropout(0.3), nn.Linear(4 * width, num_classes))

    def forward(self, x):
        return self.classifier(self.features(x))


def make_test_set(n, seed):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, 3, 32, 32), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n).astype(np.int64)
    return images, labels


class TestImages(Dataset):
    def __init__(self, images, labels, read_latency_s):
        self.images, self.labels = images, labels
        self.read_latency_s = read_latency_s

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, idx):
        time.sleep(self.read_latency_s)  # reading the sample from storage
        img = (self.images[idx].astype(np.float32) / 255.0 - MEAN) / STD
        return torch.from_numpy(img), int(self.labels[idx])


def measure_forward_tc(model, x, n=5, warmup=3):
    times = []
    with torch.inference_mode():
        for _ in range(warmup):
            model(x)
        for _ in range(n):
            t0 = time.perf_counter()
            model(x)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    p = make_parser(__doc__, steps=100, tc=True)
    p.add_argument("--no-loader", action="store_true", help="slice one in-memory tensor instead of a DataLoader")
    p.add_argument("--no-grad", action="store_true", help="torch.no_grad() instead of torch.inference_mode()")
    args = p.parse_args()
    torch.set_num_threads(1)
    seed_everything(args.seed)

    model = Classifier()
    model.eval()
    tc = args.tc or measure_forward_tc(model, torch.randn(BATCH, 3, 32, 32))
    n = args.steps * BATCH
    images, labels = make_test_set(n, args.seed)
    read_latency_s = 1.0 * tc / BATCH

    if args.no_loader:
        # the whole test set normalised up front, as one tensor
        x_all = torch.from_numpy((images.astype(np.float32) / 255.0 - MEAN) / STD)
        y_all = torch.from_numpy(labels)
        loader, num_workers, read_latency_s = None, 0, 0.0

        def batches():
            for i in range(0, n, BATCH):
                yield x_all[i : i + BATCH], y_all[i : i + BATCH]
    else:
        num_workers = 0 if args.variant == "faulty" else 2
        loader = DataLoader(TestImages(images, labels, read_latency_s), batch_size=BATCH, shuffle=False,
                            num_workers=num_workers)

    grad_ctx = torch.no_grad if args.no_grad else torch.inference_mode
    correct = torch.zeros((), dtype=torch.int64)
    predictions = []
    forward_calls = 0
    meter = StepMeter()
    meter.start()
    with grad_ctx():
        for x, y in (batches() if loader is None else loader):
            meter.got_batch()
            logits = model(x)
            forward_calls += 1
            pred = logits.argmax(dim=1)
            correct += (pred == y).sum()
            predictions.append(pred)
            meter.step_done(x.shape[0])

    predictions = torch.cat(predictions)
    accuracy = correct.item() / len(predictions)
    counts = torch.bincount(predictions, minlength=10).tolist()
    print(f"accuracy {accuracy:.4f} on {len(predictions)} samples; predictions per class {counts}")
    print("first predictions:", predictions[:16].tolist(), flush=True)
    meter.print_result(
        scenario="inference_only",
        variant=args.variant,
        loader="none" if loader is None else "DataLoader",
        num_workers=num_workers,
        forward_calls=forward_calls,
        grad_mode="no_grad" if args.no_grad else "inference_mode",
        accuracy=round(accuracy, 4),
        batch_size=BATCH,
        tc_s=round(tc, 5),
        read_latency_s=round(read_latency_s, 6),
    )


if __name__ == "__main__":
    main()
