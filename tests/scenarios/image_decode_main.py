"""A beginner's image pipeline: JPEG files decoded and resized with PIL in ``__getitem__``,
``num_workers=0``, a small CNN, default torch threads (as users write it).

Stages per sample: ``Image.open`` of a 384x384 JPEG held in memory, ``convert("RGB")``,
``resize((64, 64))``, to a normalised float tensor: ~5 ms of CPU per sample on the 2-core dev
box, ~150 ms per batch of 32, against a ~6 ms compute step: the data wait is ~95 % of the step.

- faulty: ``DataLoader(num_workers=0)``.
- ``--workers N``: the same pipeline in N worker processes (``persistent_workers=True``).
- ``--draft``: decode at reduced size (``Image.draft("RGB", (128, 128))``: libjpeg's DCT scaling
  decodes 1/2, 1/4 or 1/8 of the pixels) before the resize; combine with ``--workers``.
- ``--threads N``: ``torch.set_num_threads(N)`` in the training process (its intra-op threads
  then leave cores to the workers).
- fixed: ``--workers 2``.

Expected diagnosis (faulty): ``input_bound`` (verdict), cause ``loader_in_main_process``, hot
spot in ``__getitem__``; the first fix option is the one that measures fastest here. Measured
ratios (2 cores): see README's scenario table and the issue-13 note.
"""

import io
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from common import SCNN, StepMeter, make_parser, seed_everything

SIZE = 384


def make_jpegs(n: int, seed: int) -> list[bytes]:
    """``n`` distinct JPEGs (smooth gradients plus noise, quality 90) held as bytes."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32) / SIZE
    out = []
    for i in range(n):
        a, b, c = rng.uniform(0, 255, 3)
        img = np.stack([a * xx, b * yy, c * (1 - xx) * yy], -1) + rng.normal(0, 12, (SIZE, SIZE, 3))
        buf = io.BytesIO()
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
        out.append(buf.getvalue())
    return out


class JpegFolder(Dataset):
    def __init__(self, blobs, draft=False):
        self.blobs, self.draft = blobs, draft

    def __len__(self):
        return len(self.blobs) * 8

    def __getitem__(self, idx):
        img = Image.open(io.BytesIO(self.blobs[idx % len(self.blobs)]))
        if self.draft:
            img.draft("RGB", (128, 128))
        img = img.convert("RGB").resize((32, 32))
        x = torch.from_numpy(np.asarray(img, dtype=np.float32).transpose(2, 0, 1) / 255.0)
        return (x - 0.5) / 0.25, idx % 10


def main():
    p = make_parser(__doc__, steps=60)
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--draft", action="store_true")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads in the training process")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    seed_everything(args.seed)
    workers = args.workers if args.workers is not None else (2 if args.variant == "fixed" else 0)
    dataset = JpegFolder(make_jpegs(64, args.seed), draft=args.draft)
    loader = DataLoader(dataset, batch_size=32, shuffle=True, drop_last=True, num_workers=workers,
                        persistent_workers=workers > 0)
    model = SCNN()
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
    meter.print_result(scenario="image_decode_main", variant=args.variant, workers=workers, draft=args.draft,
                       batch_size=32)


if __name__ == "__main__":
    main()
