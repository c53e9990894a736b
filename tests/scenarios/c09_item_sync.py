"""C09: ``.item()`` and ``.cpu().numpy()`` in the hot loop: host-device syncs every step (cases.md C09).

Stages: the S-CNN trained on in-memory data that lives on the training device (random images
and labels created there; each epoch a ``randperm`` on the device picks the batches, so the
batches never cross PCIe and the only host<->device traffic is the reads below). After
``loss.backward()`` the loop reads values for its progress line:

- faulty: every step ``loss.item()``, ``acc.item()`` and a per-batch logits summary
  ``logits.detach().mean(0).cpu().numpy()``: three host reads per step, each a sync on a GPU
  (``.numpy()`` of the CPU copy is no second sync: one per line).
- fixed:  the running loss, accuracy and logits summary are accumulated in device tensors
  (``running += loss.detach()``) and read every 25 steps.

``--read-at step`` moves the reads after ``optimizer.step()`` (where most loops log; same count
per step). On a CPU-only box the reads cost nothing extra (no queue to drain): the case is that a
tool counts ~3 reads per step and names the three lines. On a GPU each read drains the queue and
the host work after it runs with the GPU idle.

Sizes: on the CPU batch 32 of 3x32x32, 100 steps (~1-2 s). On CUDA (default when available) batch
256 of 3x128x128 (``--batch``/``--size`` override), 200 steps.

Expected diagnosis (faulty): ``sync_bound`` (info on a CPU-only run: host reads, ~3 per step;
on a GPU measured syncs, ~3 per step, and the idle they expose). Fixed: no per-step reads
(3 reads every 25 steps: 0.12 per step). Expected faulty -> fixed throughput: ~1.0x on the CPU;
a few to tens of percent on a GPU.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.nn.functional as F

from common import SCNN, StepMeter, make_parser, pick_device, seed_everything

READ_EVERY_FIXED = 25


def main():
    p = make_parser(__doc__, steps=0, device=True)
    p.set_defaults(steps=None)
    p.add_argument("--read-at", choices=("backward", "step"), default="backward",
                   help="read the values right after backward (default) or after optimizer.step()")
    p.add_argument("--batch", type=int, default=None, help="batch size (default 32 on cpu, 256 on cuda)")
    p.add_argument("--size", type=int, default=None, help="image side (default 32 on cpu, 128 on cuda)")
    args = p.parse_args()
    device = pick_device(args.device)
    on_gpu = device == "cuda"
    batch = args.batch or (256 if on_gpu else 32)
    size = args.size or (128 if on_gpu else 32)
    steps = args.steps or (200 if on_gpu else 100)
    faulty = args.variant == "faulty"
    torch.set_num_threads(1)
    seed_everything(args.seed)

    n = batch * 8
    g = torch.Generator(device=device).manual_seed(args.seed)
    images = torch.randn(n, 3, size, size, generator=g, device=device)
    labels = torch.randint(0, 10, (n,), generator=g, device=device)

    model = SCNN().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    history = []  # what the progress line shows
    run_loss = torch.zeros((), device=device)
    run_acc = torch.zeros((), device=device)
    run_logits = torch.zeros(10, device=device)

    def read_every_step(loss, acc, logits):
        loss_v = loss.item()
        acc_v = acc.item()
        summary = logits.detach().mean(0).cpu().numpy()
        history.append(f"loss {loss_v:.4f} acc {acc_v:.3f} top {int(summary.argmax())}")

    def accumulate(step, loss, acc, logits):
        run_loss.add_(loss.detach())
        run_acc.add_(acc)
        run_logits.add_(logits.detach().mean(0))
        if (step + 1) % READ_EVERY_FIXED == 0:
            k = READ_EVERY_FIXED
            summary = (run_logits / k).cpu().numpy()
            history.append(f"loss {run_loss.item() / k:.4f} acc {run_acc.item() / k:.3f} top {int(summary.argmax())}")
            run_loss.zero_()
            run_acc.zero_()
            run_logits.zero_()

    def log(step, loss, acc, logits):
        if faulty:
            read_every_step(loss, acc, logits)
        else:
            accumulate(step, loss, acc, logits)

    meter = StepMeter()
    meter.start()
    step = 0
    while step < steps:
        perm = torch.randperm(n, generator=g, device=device)
        for i in range(0, n - batch + 1, batch):
            idx = perm[i:i + batch]
            x, y = images[idx], labels[idx]
            meter.got_batch()
            optimizer.zero_grad(set_to_none=True)
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            loss.backward()
            acc = (logits.detach().argmax(1) == y).float().mean()
            if args.read_at == "backward":
                log(step, loss, acc, logits)
            optimizer.step()
            if args.read_at == "step":
                log(step, loss, acc, logits)
            meter.step_done(batch)
            step += 1
            if step >= steps:
                break
    meter.print_result(scenario="c09_item_sync", variant=args.variant, device=device, read_at=args.read_at,
                       batch_size=batch, image_size=size, reads_per_step=3 if faulty else 3 / READ_EVERY_FIXED,
                       last=history[-1] if history else None)


if __name__ == "__main__":
    main()
