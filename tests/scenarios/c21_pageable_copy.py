"""C21: host->device copies from pageable memory (``pin_memory`` off) (cases.md C21).

Stages: the S-CNN fed by a ``DataLoader`` over an in-memory pool of random images (``__getitem__``
returns a pooled sample, so loading costs only the collate), each batch moved with
``.to(device)``:

- faulty: ``pin_memory=False`` and blocking ``x.to(device)`` / ``y.to(device)``: on a GPU the
  driver stages each batch through a pageable bounce buffer, synchronously.
- fixed:  ``pin_memory=True`` and ``.to(device, non_blocking=True)``: the loader's pin thread
  copies the batch into page-locked memory and the copy to the GPU runs asynchronously.

On a CPU-only box ``device`` is ``"cpu"``: nothing is copied to an accelerator (``.to("cpu")`` is
a no-op and PyTorch ignores ``pin_memory`` without one), so there is no pageable copy to report;
whyidle names the configuration instead (``input_pipeline_config``: pin_memory=False with a
blocking ``.to(device)`` in a script that asks for CUDA).
Sizes there: batch 32 of 3x32x32, ``num_workers=0``, 100 steps (~1.2 s).

GPU-box spec: ``--big`` gives cases.md's batches of 128x3x224x224 float32 (~77 MB) with
``num_workers=4`` and the S-CNN in channels_last (the batch is converted on the GPU after the
copy, so the copy itself stays a plain contiguous one), 50 steps. Without ``--big`` a CUDA run
uses the CPU sizes (batch 32 of 3x32x32).

Expected diagnosis on a GPU (faulty): ``pageable_transfers`` with the host time of the copies per
step (from the transfer audit) and an estimate from that share, not a large speed-up claim; the
fixed variant: no pageable copies. Measured H2D host time per step drops severalfold; the
end-to-end gain depends on the copy's share of the step. On a CPU-only box: no transfer finding
(nothing crosses to a device).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from common import SCNN, StepMeter, make_parser, pick_device, seed_everything


class PooledImages(Dataset):
    """``length`` samples served from a pool of ``pool`` pre-generated images (float32, CHW)."""

    def __init__(self, length: int, pool: int, size: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.images = torch.randn(pool, 3, size, size, generator=g)
        self.labels = torch.randint(0, 10, (pool,), generator=g)
        self.length = length

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        j = i % len(self.images)
        return self.images[j], self.labels[j]


def main():
    p = make_parser(__doc__, steps=0, device=True)
    p.set_defaults(steps=None)
    p.add_argument("--big", action="store_true", help="cases.md's GPU-box sizes: batch 128 of 3x224x224, 4 workers")
    p.add_argument("--workers", type=int, default=None, help="DataLoader workers (default 0, 4 with --big)")
    args = p.parse_args()
    device = pick_device(args.device)
    faulty = args.variant == "faulty"
    batch, size = (128, 224) if args.big else (32, 32)
    workers = args.workers if args.workers is not None else (4 if args.big else 0)
    steps = args.steps or (50 if args.big else 100)
    torch.set_num_threads(1)
    seed_everything(args.seed)

    dataset = PooledImages(length=batch * steps, pool=2 * batch, size=size, seed=args.seed)
    loader = DataLoader(dataset, batch_size=batch, shuffle=True, drop_last=True, num_workers=workers,
                        persistent_workers=workers > 0, pin_memory=not faulty)

    model = SCNN()
    if args.big:
        model = model.to(device, memory_format=torch.channels_last)
    else:
        model = model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    meter = StepMeter()
    meter.start()
    step = 0
    while step < steps:
        for x, y in loader:
            meter.got_batch()
            if faulty:
                x = x.to(device)
                y = y.to(device)
            else:
                x = x.to(device, non_blocking=True)
                y = y.to(device, non_blocking=True)
            if args.big:
                x = x.contiguous(memory_format=torch.channels_last)
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            meter.step_done(x.shape[0])
            step += 1
            if step >= steps:
                break
    meter.print_result(scenario="c21_pageable_copy", variant=args.variant, device=device, batch_size=batch,
                       image_size=size, num_workers=workers, pin_memory=not faulty, final_loss=round(loss.item(), 4))


if __name__ == "__main__":
    main()
