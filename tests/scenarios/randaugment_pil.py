"""A RandAugment-like per-sample augmentation with PIL in ``__getitem__`` (as timm/torchvision build
it), ``num_workers=0``, the S-CNN on 32x32 inputs (64x64 images
augmented, then resized).

The images are decoded once at start-up (in-memory PIL images, like CIFAR's arrays), so the loading
time is the augmentation: per sample a random flip, then 2 ops drawn from 9 PIL ops
(``ImageOps.autocontrast/equalize/posterize/solarize``, ``ImageEnhance.Color/Contrast/Brightness/
Sharpness``, ``Image.rotate``) at magnitude 9 of 10, then the tensor conversion and normalisation.

- faulty: the augmentation per sample with PIL in ``__getitem__``.
- fixed: ``__getitem__`` only indexes a uint8 tensor of the images; the same kinds of ops run on
  the whole batch as tensor ops in the training loop (a per-sample op and magnitude drawn for each
  image: flips, brightness / contrast / colour blends, solarize, posterize as masks over the
  batch), what GPU-side batch augmentation (DALI, Kornia) does.

Expected diagnosis (faulty): ``input_bound`` / ``loader_in_main_process`` with the hot lines in the
augmentation and their measured share of the loading time. Measured ratio: README table.
"""

import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageEnhance, ImageOps
from torch.utils.data import DataLoader, Dataset

from common import SCNN, StepMeter, make_parser, seed_everything

SIZE = 64
MAG = 0.9


def make_images(n: int, seed: int) -> np.ndarray:
    """``n`` smooth-gradient-plus-noise RGB images, uint8 (n, SIZE, SIZE, 3)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32) / SIZE
    a = rng.uniform(0, 255, (n, 3, 1, 1)).astype(np.float32)
    img = np.stack([xx, yy, (1 - xx) * yy])[None] * a + rng.normal(0, 12, (n, 3, SIZE, SIZE))
    return np.clip(img, 0, 255).astype(np.uint8).transpose(0, 2, 3, 1).copy()


OPS = [
    lambda im: ImageOps.autocontrast(im),
    lambda im: ImageOps.equalize(im),
    lambda im: ImageOps.posterize(im, 4),
    lambda im: ImageOps.solarize(im, 256 - int(256 * MAG)),
    lambda im: ImageEnhance.Color(im).enhance(1 + MAG * random.choice((-0.9, 0.9))),
    lambda im: ImageEnhance.Contrast(im).enhance(1 + MAG * random.choice((-0.9, 0.9))),
    lambda im: ImageEnhance.Brightness(im).enhance(1 + MAG * random.choice((-0.9, 0.9))),
    lambda im: ImageEnhance.Sharpness(im).enhance(1 + MAG * random.choice((-0.9, 0.9))),
    lambda im: im.rotate(30 * MAG * random.choice((-1, 1))),
]


def rand_augment(img: Image.Image) -> Image.Image:
    """A random flip, then 2 random ops of :data:`OPS` (RandAugment n=2, m=9)."""
    if random.random() < 0.5:
        img = ImageOps.mirror(img)
    for op in random.choices(OPS, k=2):
        img = op(img)
    return img


class Augmented(Dataset):
    """PIL augmentation per sample (faulty)."""

    def __init__(self, images):
        self.images = [Image.fromarray(a) for a in images]

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        img = rand_augment(self.images[i]).resize((32, 32))
        x = torch.from_numpy(np.asarray(img, dtype=np.float32).transpose(2, 0, 1) / 255.0)
        return (x - 0.5) / 0.25, i % 10


class Raw(Dataset):
    """uint8 images indexed as they are (fixed: augmented per batch)."""

    def __init__(self, images):
        self.x = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], i % 10


def batch_augment(x: torch.Tensor) -> torch.Tensor:
    """The same kinds of ops on a uint8 batch (N, 3, H, W) as tensor ops, one op and sign per
    image: each op runs once on the images that drew it."""
    n = x.shape[0]
    x = F.avg_pool2d(x.float(), 2)                                               # to 32x32, as the resize
    flip = torch.rand(n) < 0.5
    x[flip] = x[flip].flip(-1)
    for _ in range(2):
        op = torch.randint(0, 5, (n,))
        sign = torch.where(torch.rand(n, 1, 1, 1) < 0.5, -0.9, 0.9) * MAG
        for k in range(5):
            i = (op == k).nonzero().squeeze(1)
            if len(i) == 0:
                continue
            v, s = x[i], sign[i]
            if k == 0:
                v = v * (1 + s)                                                  # brightness
            elif k == 1:
                m = v.mean((1, 2, 3), keepdim=True)
                v = m + (v - m) * (1 + s)                                        # contrast
            elif k == 2:
                g = v.mean(1, keepdim=True)
                v = g + (v - g) * (1 + s)                                        # colour
            elif k == 3:
                v = torch.where(v >= 256 * (1 - MAG), 255 - v, v)                # solarize
            else:
                v = torch.floor(v / 16) * 16                                     # posterize 4 bits
            x[i] = v.clamp(0, 255)
    return (x / 255.0 - 0.5) / 0.25


def main():
    p = make_parser(__doc__, steps=60)
    p.add_argument("--workers", type=int, default=0, help="DataLoader num_workers (either variant)")
    args = p.parse_args()
    torch.set_num_threads(1)
    seed_everything(args.seed)
    images = make_images(2048, args.seed)
    fixed = args.variant == "fixed"
    dataset = Raw(images) if fixed else Augmented(images)
    loader = DataLoader(dataset, batch_size=32, shuffle=True, drop_last=True, num_workers=args.workers,
                        persistent_workers=args.workers > 0)
    model = SCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    meter = StepMeter()
    meter.start()
    step = 0
    while step < args.steps:
        for x, y in loader:
            meter.got_batch()
            if fixed:
                x = batch_augment(x)
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            meter.step_done(x.shape[0])
            step += 1
            if step >= args.steps:
                break
    meter.print_result(scenario="randaugment_pil", variant=args.variant, batch_size=32, workers=args.workers)


if __name__ == "__main__":
    main()
