"""The PyTorch ImageNet example's input pipeline on a folder of JPEG files (written with PIL at
start-up): ``ImageFolder``-style loading (``Image.open(path).convert("RGB")``), a random resized
crop, a random flip, to a normalised tensor, a small VGG-ish CNN (2 blocks of two 3x3 convs + batch norm) at the default torch threads, the
``-j`` (``--workers``) option of the example (its default 4; ``persistent_workers`` not set, as
there).

- faulty: ``--workers 4`` (the example's default) on this 2-core box.
- fixed: ``--workers 0`` (measured faster here: the 4 workers and the model's 2 intra-op threads
  share 2 cores).
- ``--workers N`` either way; ``--threads N``: ``torch.set_num_threads(N)``.

Expected diagnosis: with 4 workers never "keep the workers"; with 0 workers no first fix that
measures slower (1 worker + ``torch.set_num_threads(1)`` measured 0.74x in the field). Data wait:
whyidle's per step against this script's own meter (``data_s_per_step`` in RESULT). Measured
ratios: README table.
"""

import os
import random
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from common import StepMeter, make_parser, seed_everything

SIZE = 224
CROP = 32


def write_jpegs(folder: str, n: int, seed: int) -> list[str]:
    """``n`` JPEG files (gradients plus noise, quality 90) under ``folder``/class_k/."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32) / SIZE
    paths = []
    for i in range(n):
        a, b, c = rng.uniform(0, 255, 3)
        img = np.stack([a * xx, b * yy, c * (1 - xx) * yy], -1) + rng.normal(0, 12, (SIZE, SIZE, 3))
        d = os.path.join(folder, f"class_{i % 10}")
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, f"{i:05d}.jpg")
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(path, "JPEG", quality=90)
        paths.append(path)
    return paths


class JpegFolder(Dataset):
    """``ImageFolder`` + ``RandomResizedCrop(CROP)`` + ``RandomHorizontalFlip`` + ``Normalize``."""

    def __init__(self, paths):
        self.paths = paths

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        with open(self.paths[i], "rb") as f:
            img = Image.open(f).convert("RGB")
        scale, ratio = random.uniform(0.08, 1.0), random.uniform(3 / 4, 4 / 3)
        w = min(SIZE, int(round((scale * SIZE * SIZE * ratio) ** 0.5)))
        h = min(SIZE, int(round((scale * SIZE * SIZE / ratio) ** 0.5)))
        x0, y0 = random.randint(0, SIZE - w), random.randint(0, SIZE - h)
        img = img.resize((CROP, CROP), Image.BILINEAR, box=(x0, y0, x0 + w, y0 + h))
        if random.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        x = torch.from_numpy(np.asarray(img, dtype=np.float32).transpose(2, 0, 1) / 255.0)
        return (x - 0.45) / 0.225, int(os.path.basename(os.path.dirname(self.paths[i]))[6:])


def block(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                         nn.MaxPool2d(2))


def main():
    p = make_parser(__doc__, steps=60)
    p.add_argument("-j", "--workers", type=int, default=None, help="data loading workers (the example's -j)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads in the training process")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    seed_everything(args.seed)
    workers = args.workers if args.workers is not None else (0 if args.variant == "fixed" else 4)
    with tempfile.TemporaryDirectory() as tmp:
        dataset = JpegFolder(write_jpegs(tmp, 512, args.seed))
        loader = DataLoader(dataset, batch_size=32, shuffle=True, num_workers=workers, pin_memory=False)
        model = nn.Sequential(block(3, 8), block(8, 16), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
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
        meter.print_result(scenario="jpeg_folder", variant=args.variant, workers=workers, threads=torch.get_num_threads(),
                           batch_size=32, data_s_per_step=round(meter.data_s / max(1, meter.steps), 5))


if __name__ == "__main__":
    main()
