"""Accelerate: host reads on every micro-batch of a gradient-accumulation loop (cases.md C09 shape).

Stages: the S-MLP (512 -> 1024 -> 1024 -> 10) on 4,096 synthetic feature vectors (class centres
+ heavy noise), micro-batches of 16 from an in-memory ``TensorDataset``, ``Accelerator(
gradient_accumulation_steps=4)`` (CPU here), AdamW + a linear-decay ``LambdaLR``, all four
``accelerator.prepare``d. The loop is the Accelerate idiom: ``with accelerator.accumulate(model):``
forward, ``accelerator.backward(loss)``, ``optimizer.step()``, ``scheduler.step()``,
``optimizer.zero_grad()``; an optimizer step happens on every 4th micro-batch
(``accelerator.sync_gradients``). 100 optimizer steps (400 micro-batches).

- faulty: on every micro-batch, ``loss.item()`` and ``(logits.argmax(1) == y).float().mean().item()``
  (2 host reads per micro-batch = 8 per optimizer step) are appended to Python lists, and an
  f-string status line is formatted from them (kept in a list, printed every 50 steps).
- fixed:  the loss sum and the correct-prediction count accumulate in device tensors
  (``loss.detach()``, ``(pred == y).sum()``); they are read (2 reads) and the line formatted every
  50 optimizer steps.

On the CPU nothing is asynchronous, so a read costs only its own small host work: the timing
difference is small (a few %; cases.md C09: "almost no timing change" on CPU). The check is that
whyidle counts the reads **per micro-batch** (~2 per micro-batch, ~8 per optimizer step, at the
two call sites) in the faulty variant and ~none in the fixed one. RESULT adds
``micro_steps_per_step`` (4), ``reads`` (the script's own count of ``.item()`` calls in the loop)
and ``reads_per_micro_step`` / ``reads_per_step``.

Timing: ``time.perf_counter`` around the loop, per optimizer step (``fw_meter.SteadyMeter``:
``batch_start`` when a micro-batch arrives, ``micro_done`` after a micro-batch without a step,
``batch_end`` after the step); the first 5 steps are left out of the rates.

Expected diagnosis: faulty ``sync_bound`` info-level on the CPU (on a GPU: ~8 syncs per optimizer
step), with ``reads_per_micro_step`` ~2; the framework is Accelerate; the fix "accumulate on the
device, read every N steps". Fixed: no ``sync_bound``.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset

from common import SMLP, make_parser
from fw_meter import SteadyMeter

MICRO_BATCH = 16
ACCUM = 4
LOG_EVERY = 50


def make_features(n, seed, classes=10, features=512):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(classes, features, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    return centers[y] + 6.0 * torch.randn(n, features, generator=g), y


def main():
    p = make_parser(__doc__, steps=100)
    args = p.parse_args()
    torch.set_num_threads(1)
    set_seed(args.seed)

    accelerator = Accelerator(gradient_accumulation_steps=ACCUM, cpu=True)
    x, y = make_features(4096, args.seed)
    loader = DataLoader(TensorDataset(x, y), batch_size=MICRO_BATCH, shuffle=True, drop_last=True)
    model = SMLP(512, 10)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    total = args.steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: max(0.0, 1.0 - s / total))
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

    faulty = args.variant == "faulty"
    losses, accs, status_lines = [], [], []  # faulty: per micro-batch host values
    loss_sum = torch.zeros((), device=accelerator.device)  # fixed: device accumulators
    correct = torch.zeros((), dtype=torch.long, device=accelerator.device)
    seen = 0
    reads = 0
    micro = 0
    step = 0

    meter = SteadyMeter(warmup=5)
    model.train()
    meter.start()
    while step < args.steps:
        for xb, yb in loader:
            meter.batch_start()
            with accelerator.accumulate(model):
                logits = model(xb)
                loss = F.cross_entropy(logits, yb)
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            micro += 1
            if faulty:
                losses.append(loss.item())
                accs.append((logits.argmax(dim=1) == yb).float().mean().item())
                reads += 2
                status_lines.append(
                    f"micro {micro:5d} loss {losses[-1]:.4f} acc {accs[-1]:.3f} lr {scheduler.get_last_lr()[0]:.2e}"
                )
            else:
                loss_sum += loss.detach()
                correct += (logits.argmax(dim=1) == yb).sum()
                seen += len(yb)
            if not accelerator.sync_gradients:
                meter.micro_done()
                continue
            step += 1
            if step % LOG_EVERY == 0:
                if faulty:
                    print(f"step {step:4d} " + status_lines[-1], flush=True)
                else:
                    mean_loss = loss_sum.item() / (LOG_EVERY * ACCUM)
                    acc = correct.item() / seen
                    reads += 2
                    print(f"step {step:4d} micro {micro:5d} loss {mean_loss:.4f} acc {acc:.3f} "
                          f"lr {scheduler.get_last_lr()[0]:.2e} (mean of {LOG_EVERY} steps)", flush=True)
                    loss_sum.zero_()
                    correct.zero_()
                    seen = 0
            meter.batch_end(MICRO_BATCH * ACCUM)
            if step >= args.steps:
                break

    meter.print_result(
        scenario="accelerate_accum",
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
