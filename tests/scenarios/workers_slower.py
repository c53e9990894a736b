"""Adding DataLoader workers makes this job slower: the in-process loader (``num_workers=0``, as
written) is already the fastest setting on a 2-core box, although it waits for data.

Stages: 4,096 frames held in memory as one uint8 tensor (3x96x96, ~27 KB each); ``__getitem__``
only converts one frame to float in [0, 1) and returns a dict of 4 tensors (image, label,
per-sample loss weight, index): tiny per-sample work, but a large batch in bytes (64 x 3x96x96
float32 = 7.1 MB). The collate stacks each field. A light CNN (a 4x4 stride-4 patch conv first, so
the compute stays ~20 ms per step at batch 64) with default torch threads (2 here), weighted
cross-entropy, SGD with momentum, batch 64, 400 steps (~8-11 s of loop).

- faulty (as written): ``num_workers=0``. The main process spends ~20-30 % of each step in
  ``next(loader)`` doing the conversion and the collate itself (``data_cpu_share`` ~1), so a
  diagnosis may be tempted to recommend worker processes.
- ``--variant workers``: the tempting "fix", ``num_workers=2, persistent_workers=True``.
- ``--workers N`` overrides the worker count of either variant; ``--persistent-workers`` keeps them
  across epochs (an epoch is 64 steps, so non-persistent workers restart 6 times in 400 steps);
  ``--batch-size`` (default 64; the learning rate scales with it); ``--pin-memory`` (a no-op on a
  box without an accelerator: PyTorch warns and does not pin); ``--threads N``
  (``torch.set_num_threads``).

Why workers lose here: with workers each 7 MB batch is built in a fresh shared-memory segment by a
worker (page faults in the worker), handed over as file descriptors and faulted in again by the
training process when the first layer reads it, and the workers' CPU time competes with the
training process's two intra-op threads for the two cores; the work they take off the main
process (the conversion and the stack) is smaller than what they add. Measured with
``getrusage`` over 200 steps (set-up subtracted): ``--workers 0``: ~83 k minor page faults in the
training process (~410 per step: the allocator reuses the batch's memory), 200 involuntary
context switches; ``--workers 2 --persistent-workers``: ~390 k in the training process (~1,950
per step, about one per 4 KB page of the batch) plus ~550 k in the workers (1.8 s user + 3.0 s system
CPU time, mostly kernel), system time of the training process 0.9 -> 3.0 s, 7,200 involuntary
context switches; the step p50 went from 22 to 51 ms while the data wait fell from 0.30 to 0.12
(the compute itself slowed). There is no fault to fix:
the expected answer of a what-if tuner is "keep ``num_workers=0``" (a diagnosis may still report
the ~25 % data wait, but must not promise a speed-up from workers).

Measured by hand on the shared 2-core dev box (AMD EPYC, 2 vCPUs, nothing else of ours running;
the vCPUs' speed swings, so single runs spread up to 3x), plain ``python``, default 400 steps,
5 runs each (the last four lines 2), interleaved; median samples/s from RESULT, ratio to the
as-written setting:

    setting                                   samples/s [runs]           step p50  data wait  ratio
    --workers 0 (faulty, as written)          2843 [2338-3258]           21.6 ms   0.28       1.00x
    --workers 1                               1226 [622-1327]            48 ms     0.12       0.43x
    --workers 2                                839 [414-1183]            53 ms     0.11       0.30x
    --workers 4                               1189 [197-1245]            49 ms     0.15       0.42x
    --workers 2 --persistent-workers          1175 [660-1696]            53 ms     0.11       0.41x
    --workers 2 --persistent-workers
                --threads 1                   1348 [1132-1583]           46 ms     0.12       0.47x
    --workers 2 --pin-memory                  1215 [752-1503]            42 ms     0.14       0.43x
    --workers 0 --pin-memory (a no-op here)   2267 [907-2484]            22 ms     0.24       0.80x (noise)
    --workers 0 --threads 1                   2120 [1703-2404]           31 ms     0.20       0.75x
    --variant workers (2, persistent)         1242 [1144-1341]           51 ms     0.11       0.44x
    --workers 0 --batch-size 32               2388 [2387-2388]           13 ms     0.25       0.84x
    --workers 0 --batch-size 128              2974 [2819-3130]           43 ms     0.29       1.05x (noise)

Every worker setting was slower than ``--workers 0`` in every interleaved repeat (1.9-2.8x slower
in the two repeats where the box was steady). Loop ~9-11 s at ``--workers 0`` (process ~13-19 s including ~4 s of
imports and set-up), ~20-25 s with workers.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from common import StepMeter, make_parser, seed_everything

SAMPLES = 4096
SIZE = 96


class Frames(Dataset):
    """In-memory uint8 frames; ``__getitem__`` only converts one to float and adds a few fields."""

    def __init__(self, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.frames = torch.randint(0, 256, (SAMPLES, 3, SIZE, SIZE), dtype=torch.uint8, generator=g)
        self.labels = torch.randint(0, 10, (SAMPLES,), generator=g)

    def __len__(self):
        return SAMPLES

    def __getitem__(self, i):
        image = self.frames[i].float().div_(255.0)
        return {"image": image, "label": self.labels[i], "weight": torch.ones(()), "index": torch.tensor(i)}


class Net(nn.Module):
    """Patch conv 4x4/4 (3 -> 8), conv 8 -> 16, max-pool, conv 16 -> 16, global average pool, linear."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 4, stride=4),
            nn.ReLU(inplace=True),
            nn.Conv2d(8, 16, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 16, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.head = nn.Linear(16, num_classes)

    def forward(self, x):
        return self.head(self.features(x))


def main():
    p = make_parser(__doc__, steps=400, variants=False)
    p.add_argument("--variant", choices=("faulty", "workers"), default="faulty",
                   help="faulty: num_workers=0 as written (the fastest here); "
                        "workers: the tempting fix, 2 persistent workers (slower here)")
    p.add_argument("--workers", type=int, default=None, help="num_workers (overrides the variant's)")
    p.add_argument("--persistent-workers", action="store_true")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--pin-memory", action="store_true")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads in the training process")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    seed_everything(args.seed)

    workers = args.workers if args.workers is not None else (2 if args.variant == "workers" else 0)
    persistent = workers > 0 and (args.persistent_workers or args.variant == "workers")
    dataset = Frames(args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=True, num_workers=workers,
                        pin_memory=args.pin_memory, persistent_workers=persistent)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * args.batch_size / 64, momentum=0.9)

    meter = StepMeter()
    meter.start()
    step = 0
    while step < args.steps:
        for batch in loader:
            meter.got_batch()
            x, y, w = batch["image"], batch["label"], batch["weight"]
            optimizer.zero_grad(set_to_none=True)
            loss = (F.cross_entropy(model(x), y, reduction="none") * w).mean()
            loss.backward()
            optimizer.step()
            meter.step_done(x.shape[0])
            step += 1
            if step >= args.steps:
                break
    meter.print_result(scenario="workers_slower", variant=args.variant, workers=workers,
                       persistent_workers=persistent, batch_size=args.batch_size, pin_memory=args.pin_memory,
                       threads=torch.get_num_threads())


if __name__ == "__main__":
    main()
