"""Batch size 1: per-step overhead dominates, the device does tiny amounts of work per step.

Stages: the S-CNN trained on in-memory data (``TensorDataset`` of pre-generated float images,
``num_workers=0``) with an ordinary loop: ``zero_grad``, forward, cross-entropy, backward,
``clip_grad_norm_``, SGD with momentum and weight decay, a cosine LR scheduler step. With
``batch_size=1`` each step does one sample's worth of compute, and the fixed per-step costs
(DataLoader fetch + collate, ~40 op dispatches in forward/backward, the optimizer and clipping
over every parameter, the scheduler) are paid per sample.

- faulty: ``batch_size=1``  (default 4000 steps = 4,000 samples)
- fixed:  ``batch_size=64`` (default 150 steps = 9,600 samples)

Compare samples/s (the steps differ; the per-sample rate is the measure).

Expected diagnosis (faulty): ``small_batch`` (batch size 1 read from the DataLoader; per-step
time almost independent of the batch; op count per sample high; the device idles between tiny
kernels on a GPU). Fix: raise the batch size (with LR scaling) or accumulate.

Expected faulty -> fixed samples/s ratio: ~2.5-3x on CPU with 1 thread (on a GPU it would be far
larger, since there per-sample compute is nearly free); assert >= 1.8x.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import SCNN, StepMeter, make_parser, seed_everything


def main():
    p = make_parser(__doc__, steps=0)
    p.set_defaults(steps=None)
    p.add_argument("--batch", type=int, default=None, help="batch size (default: 1 faulty, 64 fixed)")
    args = p.parse_args()
    batch_size = args.batch or (1 if args.variant == "faulty" else 64)
    steps = args.steps or (4000 if batch_size == 1 else max(150, 9600 // batch_size))
    torch.set_num_threads(1)
    seed_everything(args.seed)

    g = torch.Generator().manual_seed(args.seed)
    images = torch.randn(4096, 3, 32, 32, generator=g)
    labels = torch.randint(0, 10, (4096,), generator=g)
    loader = DataLoader(TensorDataset(images, labels), batch_size=batch_size, shuffle=True, drop_last=True)

    model = SCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * batch_size / 64, momentum=0.9, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)

    meter = StepMeter()
    meter.start()
    step = 0
    while step < steps:
        for x, y in loader:
            meter.got_batch()
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=5.0)
            optimizer.step()
            scheduler.step()
            meter.step_done(x.shape[0])
            step += 1
            if step >= steps:
                break
    meter.print_result(scenario="batch1", variant=args.variant, batch_size=batch_size)


if __name__ == "__main__":
    main()
