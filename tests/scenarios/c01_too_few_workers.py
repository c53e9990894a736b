"""C01: too few DataLoader workers for a fast accelerator (cases.md C01).

Stages: a map-style dataset of 3,000 synthetic 3x32x32 uint8 images. Each sample costs a
little numpy work (normalise, reflect-pad + random crop, random flip: ~0.2 ms on the 2-core dev
box) plus a ``time.sleep`` standing for the file read latency (off-CPU, so extra workers overlap
it even on 2 cores). The latency is calibrated at start-up: 0.1 x T_c per sample (T_c = median
of 5 warm-up S-CNN steps), i.e. 3-6 ms per sample where T_c is 30-60 ms as in the spec, ~1 ms
on the dev box (T_c ~10 ms). A batch of 32 then costs ~3.7 T_c to fetch against T_c to train.
S-CNN, batch 32, SGD, 80 steps.

- faulty: ``num_workers=1, prefetch_factor=2`` (``--faulty-workers 0`` for the in-process
  loader instead): the single worker cannot keep up; the main process blocks in
  ``next(dataloader)`` for ~70 % of each step while the worker mostly sleeps.
- fixed:  ``num_workers=4, prefetch_factor=4, persistent_workers=True``: step ~ T_c
  (``--workers N``: N workers instead, e.g. the count whyidle suggests under a CPU limit).

Expected diagnosis (faulty): ``input_bound``, cause ``too_few_workers`` (with
``--faulty-workers 0``: ``loader_in_main_process``). Signature: data wait >= 60 % of the step;
per-sample fetch time x batch / workers > compute time; workers mostly sleeping, not
CPU-saturated. Fix: raise ``num_workers`` (needed ~ ceil(fetch_time_per_batch / step_time) = 4),
raise ``prefetch_factor``, persistent workers.

Expected faulty -> fixed throughput ratio: ~3x; assert >= 2x.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from common import SCNN, StepMeter, make_parser, measure_tc, seed_everything

MEAN = np.array([0.49, 0.48, 0.45], np.float32).reshape(3, 1, 1)
STD = np.array([0.25, 0.24, 0.26], np.float32).reshape(3, 1, 1)


class SyntheticImages(Dataset):
    def __init__(self, n, seed, read_latency_s):
        rng = np.random.default_rng(seed)
        self.images = rng.integers(0, 256, size=(n, 3, 32, 32), dtype=np.uint8)
        self.labels = rng.integers(0, 10, size=n).astype(np.int64)
        self.read_latency_s = read_latency_s
        self.rng = np.random.default_rng(seed + 1)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, idx):
        time.sleep(self.read_latency_s)  # reading the sample from storage
        img = self.images[idx].astype(np.float32) / 255.0
        img = (img - MEAN) / STD
        img = np.pad(img, ((0, 0), (4, 4), (4, 4)), mode="reflect")
        i, j = self.rng.integers(0, 9, size=2)
        img = img[:, i : i + 32, j : j + 32]
        if self.rng.random() < 0.5:
            img = img[:, :, ::-1]
        return torch.from_numpy(np.ascontiguousarray(img)), int(self.labels[idx])


def worker_init_fn(worker_id):
    info = torch.utils.data.get_worker_info()
    info.dataset.rng = np.random.default_rng(info.seed % 2**32)


def main():
    p = make_parser(__doc__, steps=80, tc=True)
    p.add_argument("--faulty-workers", type=int, choices=(0, 1), default=1)
    p.add_argument("--workers", type=int, default=4, help="num_workers of the fixed variant (default 4)")
    args = p.parse_args()
    torch.set_num_threads(1)
    seed_everything(args.seed)

    model = SCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    tc = args.tc or measure_tc(
        model, (torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))), F.cross_entropy, optimizer
    )
    dataset = SyntheticImages(3000, args.seed, read_latency_s=0.1 * tc)

    if args.variant == "faulty":
        if args.faulty_workers == 0:
            loader = DataLoader(dataset, batch_size=32, shuffle=True, drop_last=True, num_workers=0)
        else:
            loader = DataLoader(
                dataset,
                batch_size=32,
                shuffle=True,
                drop_last=True,
                num_workers=1,
                prefetch_factor=2,
                worker_init_fn=worker_init_fn,
            )
    else:
        loader = DataLoader(
            dataset,
            batch_size=32,
            shuffle=True,
            drop_last=True,
            num_workers=args.workers,
            prefetch_factor=4,
            persistent_workers=True,
            worker_init_fn=worker_init_fn,
        )

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
    meter.print_result(
        scenario="c01_too_few_workers",
        variant=args.variant,
        num_workers=loader.num_workers,
        tc_s=round(tc, 5),
        read_latency_s=round(dataset.read_latency_s, 5),
        batch_size=32,
    )


if __name__ == "__main__":
    main()
