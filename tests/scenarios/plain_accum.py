"""Plain PyTorch gradient accumulation with ``loss.item()`` on every micro-batch.

Stages: the S-CNN (3x32x32 -> 10) on 2,048 synthetic images (class-dependent colour means +
noise) from an in-memory ``TensorDataset``, micro-batches of 8, gradient accumulation over 4
micro-batches (effective batch 32), SGD + momentum, gradient clipping before each step, the loss
divided by 4 before ``backward()``. A status line is printed every 20 optimizer steps. 60
optimizer steps (240 micro-batches).

- faulty: ``running_loss += loss.item()`` after every micro-batch's ``backward()`` (1 host read
  per micro-batch = 4 per optimizer step), the classic loop from tutorials.
- fixed:  ``running_loss += loss.detach()`` (a device tensor); one ``.item()`` when the line is
  printed, every 20 optimizer steps.

On the CPU a read costs only its own small host work, so the timing difference is small (within
noise); on a GPU each read drains the queue, 4 times per optimizer step. The check (cases.md C09
shape) is that whyidle counts ~1 read per micro-batch (~4 per optimizer step) at the
``loss.item()`` line in the faulty variant and ~none in the fixed one. RESULT adds
``micro_steps_per_step`` (4), ``reads`` (the script's own count of ``.item()`` calls in the loop),
``reads_per_micro_step`` and ``reads_per_step``.

Timing: ``time.perf_counter`` per optimizer step (``fw_meter.SteadyMeter``: ``batch_start`` when a
micro-batch arrives, ``micro_done`` after a micro-batch without a step, ``batch_end`` after the
step); the first 5 steps are left out of the rates.

Expected diagnosis: faulty ``sync_bound`` info-level on the CPU (reads per micro-batch ~1, site:
the ``running_loss += loss.item()`` line); fix "accumulate on the device, read every N steps".
Fixed: no ``sync_bound``. Otherwise ``device_bound`` (compute-bound) in both.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import SCNN, make_parser, seed_everything
from fw_meter import SteadyMeter

MICRO_BATCH = 8
ACCUM = 4
PRINT_EVERY = 20


def make_images(n, seed):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 10, (n,), generator=g)
    centers = torch.randn(10, 3, 1, 1, generator=g)
    return centers[y] + torch.randn(n, 3, 32, 32, generator=g), y


def main():
    p = make_parser(__doc__, steps=60)
    args = p.parse_args()
    torch.set_num_threads(1)
    seed_everything(args.seed)

    x, y = make_images(2048, args.seed)
    loader = DataLoader(TensorDataset(x, y), batch_size=MICRO_BATCH, shuffle=True, drop_last=True)
    model = SCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    faulty = args.variant == "faulty"

    running_loss = 0.0 if faulty else torch.zeros(())
    reads = micro = step = 0
    meter = SteadyMeter(warmup=5)
    model.train()
    meter.start()
    optimizer.zero_grad(set_to_none=True)
    while step < args.steps:
        for xb, yb in loader:
            meter.batch_start()
            loss = F.cross_entropy(model(xb), yb) / ACCUM
            loss.backward()
            micro += 1
            if faulty:
                running_loss += loss.item()
                reads += 1
            else:
                running_loss += loss.detach()
            if micro % ACCUM != 0:
                meter.micro_done()
                continue
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=5.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if step % PRINT_EVERY == 0:
                if faulty:
                    value = running_loss / PRINT_EVERY
                    running_loss = 0.0
                else:
                    value = running_loss.item() / PRINT_EVERY
                    reads += 1
                    running_loss.zero_()
                print(f"step {step:4d}  loss {value:.4f}", flush=True)
            meter.batch_end(MICRO_BATCH * ACCUM)
            if step >= args.steps:
                break

    meter.print_result(
        scenario="plain_accum",
        variant=args.variant,
        micro_batch=MICRO_BATCH,
        micro_steps=micro,
        micro_steps_per_step=round(micro / step, 3),
        reads=reads,
        reads_per_micro_step=round(reads / micro, 4),
        reads_per_step=round(reads / step, 3),
    )


if __name__ == "__main__":
    main()
