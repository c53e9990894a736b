"""CPU-heavy per-sample preprocessing run inside the main process (``num_workers=0``).

Stages: a map-style ``Dataset`` whose ``__getitem__`` "decodes" a JPEG-like sample (dequantise
8x8 DCT blocks, inverse DCT with numpy, YCbCr -> RGB, 64x64 -> 32x32 downscale) and augments it
(reflect-pad + random crop, flip, brightness/contrast jitter, noise, normalise): about 1.5 ms of
pure CPU per sample on the 2-core dev box, ~50 ms per batch of 32, against a compute step (T_c)
of ~10 ms for the S-CNN. All of it is numpy work on the CPU; nothing sleeps.

- faulty: ``DataLoader(num_workers=0)``: the main process decodes every batch itself, so the
  model waits; data wait is ~80 % of the step.
- fixed:  ``DataLoader(num_workers=2, persistent_workers=True)``: two worker processes decode
  while the main process trains.

Expected diagnosis (faulty): ``input_bound``, cause ``loader_in_main_process``; the hot spot of the
data phase is the dataset's ``decode``/``augment`` (cause ``cpu_preprocessing``). The loader is
CPU-busy (not sleeping). Fix: ``num_workers`` > 0 (toward the core count), persistent workers.
Fixed: still partly input-bound on 2 cores (the decode work is CPU work and there are only 2
cores; workers CPU-saturated), but about 2x faster.

Expected faulty -> fixed throughput ratio: ~1.7-1.9x; assert >= 1.4x. The ceiling on 2 cores is
2x (all the work is CPU work: fixed can at best spread it over both cores).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from common import SCNN, StepMeter, make_parser, measure_tc, seed_everything

MEAN = np.array([0.49, 0.48, 0.45], np.float32).reshape(3, 1, 1)
STD = np.array([0.25, 0.24, 0.26], np.float32).reshape(3, 1, 1)
SRC = 64  # stored resolution; decoded then downscaled to 32x32


def dct_matrix(n=8):
    k = np.arange(n)[:, None]
    i = np.arange(n)[None, :]
    m = np.cos(np.pi * (2 * i + 1) * k / (2 * n)) * np.sqrt(2.0 / n)
    m[0] /= np.sqrt(2.0)
    return m.astype(np.float32)


IDCT = dct_matrix()
QUANT = (1 + np.add.outer(np.arange(8), np.arange(8))).astype(np.float32) * 2.0


def decode(coef):
    """JPEG-like decode of one sample: int8 DCT coefficients (3 x 64 x 64) -> float RGB 3x32x32."""
    nb = SRC // 8
    blocks = coef.reshape(3, nb, nb, 8, 8).astype(np.float32) * QUANT  # dequantise
    pix = np.einsum("ui,cabuv,vj->cabij", IDCT, blocks, IDCT)  # inverse DCT per 8x8 block
    img = pix.transpose(0, 1, 3, 2, 4).reshape(3, SRC, SRC) + 128.0
    y, cb, cr = img[0], img[1] - 128.0, img[2] - 128.0  # YCbCr -> RGB
    rgb = np.stack([y + 1.402 * cr, y - 0.344136 * cb - 0.714136 * cr, y + 1.772 * cb])
    rgb = np.clip(rgb, 0.0, 255.0) * (1.0 / 255.0)
    f = SRC // 32
    return rgb.reshape(3, 32, f, 32, f).mean(axis=(2, 4))


def augment(img, rng):
    p = np.pad(img, ((0, 0), (4, 4), (4, 4)), mode="reflect")
    i, j = rng.integers(0, 9, 2)
    img = p[:, i : i + 32, j : j + 32]
    if rng.random() < 0.5:
        img = img[:, :, ::-1]
    brightness, contrast = rng.uniform(0.8, 1.2, 2)
    m = img.mean()
    img = np.clip((img - m) * contrast + m * brightness, 0.0, 1.0)
    img = img + rng.normal(0.0, 0.02, img.shape).astype(np.float32)
    return np.ascontiguousarray((img - MEAN) / STD, dtype=np.float32)


class EncodedImages(Dataset):
    """Synthetic "encoded" images: int8 DCT coefficients, decoded and augmented per sample."""

    def __init__(self, n, seed):
        rng = np.random.default_rng(seed)
        self.coefs = rng.integers(-12, 12, size=(n, 3 * SRC * SRC), dtype=np.int8)
        self.labels = rng.integers(0, 10, size=n).astype(np.int64)
        self.seed = seed
        self.epoch_draws = 0

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, idx):
        rng = np.random.default_rng((self.seed, idx, self.epoch_draws))
        self.epoch_draws += 1
        img = augment(decode(self.coefs[idx]), rng)
        return torch.from_numpy(img), int(self.labels[idx])


def main():
    args = make_parser(__doc__, steps=100).parse_args()
    torch.set_num_threads(1)
    seed_everything(args.seed)

    dataset = EncodedImages(2048, args.seed)
    if args.variant == "faulty":
        loader = DataLoader(dataset, batch_size=32, shuffle=True, drop_last=True, num_workers=0)
    else:
        loader = DataLoader(
            dataset, batch_size=32, shuffle=True, drop_last=True, num_workers=2, persistent_workers=True
        )

    model = SCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    tc = measure_tc(model, (torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))), F.cross_entropy, optimizer)

    meter = StepMeter()
    meter.start()
    step = 0
    while step < args.steps:
        for x, y in loader:
            meter.got_batch()
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            meter.step_done(x.shape[0])
            step += 1
            if step >= args.steps:
                break
    meter.print_result(scenario="main_loader_cpu", variant=args.variant, tc_s=round(tc, 5), batch_size=32)


if __name__ == "__main__":
    main()
