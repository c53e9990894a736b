"""Samples handed over as Python lists: four workers build the batches, but the training process
unpickles ~100k Python floats per batch and converts them with ``torch.tensor`` in the loop.

Stages: 4,096 images (3x32x32 uint8) in memory. The dataset was written to be "framework
agnostic": ``__getitem__`` normalises the image with NumPy and returns it as nested Python lists
(``arr.tolist()``, 3,072 floats), and ``collate_records`` keeps the batch as a dict of lists. The
worker pickles those lists into the result queue; the training process unpickles them inside
``next(loader)`` (~6-8 ms per batch of 32 here) and then builds the tensor with
``torch.tensor(batch["image"])`` in the loop (~15 ms). S-CNN, batch 32, SGD,
``torch.set_num_threads(1)``, ``DataLoader(num_workers=4, persistent_workers=True)``. All costs
are fixed CPU work (no sleeps).

- faulty: lists from ``__getitem__``, ``collate_fn=collate_records`` (dict of lists),
  ``torch.tensor(...)`` in the loop.
- fixed:  ``__getitem__`` returns a float32 tensor (``torch.from_numpy``) and the label, default
  collate: the worker stacks the batch into one tensor in shared memory and the training
  process receives a handle (no per-element unpickling, no conversion).

Expected diagnosis (faulty): the extra time is the training process's CPU, in two parts: the
data wait (~22 %) with ``data_cpu_share`` ~0.9 (receiving the batch: unpickling the lists, not
waiting for workers: ``input_bound`` / ``main_process_receive``) and the ``torch.tensor``
conversion in the step (~15 ms: ``host_bound`` / ``batch_conversion``); the workers are mostly
idle. Fix: return tensors / NumPy arrays from ``__getitem__`` and use the default collate. More
workers would not help.

Measured plainly on the 2-core dev box (3 alternated repeats, medians): faulty 763 samples/s
(data wait 0.22, ``data_cpu_share`` 0.91; step p50 35 ms), fixed 1535 (0.09; 20.5 ms): 2.0x
[2.01-2.06].
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from common import SCNN, StepMeter, make_parser, seed_everything

N_SAMPLES = 4096
BATCH = 32


class Images(Dataset):
    def __init__(self, seed, as_lists):
        rng = np.random.default_rng(seed)
        self.images = rng.integers(0, 256, size=(N_SAMPLES, 3, 32, 32), dtype=np.uint8)
        self.labels = rng.integers(0, 10, size=N_SAMPLES).tolist()
        self.as_lists = as_lists

    def __len__(self):
        return N_SAMPLES

    def __getitem__(self, i):
        img = (self.images[i].astype(np.float32) / 255.0 - 0.5) / 0.25
        if self.as_lists:
            return {"image": img.tolist(), "label": self.labels[i]}
        return {"image": torch.from_numpy(img), "label": self.labels[i]}


def collate_records(batch):
    """Keep the batch as plain Python: a dict of lists."""
    return {"image": [s["image"] for s in batch], "label": [s["label"] for s in batch]}


def main():
    p = make_parser(__doc__, steps=180)
    args = p.parse_args()
    torch.set_num_threads(1)
    seed_everything(args.seed)

    faulty = args.variant == "faulty"
    dataset = Images(args.seed, as_lists=faulty)
    loader = DataLoader(dataset, batch_size=BATCH, shuffle=True, drop_last=True, num_workers=4,
                        persistent_workers=True, collate_fn=collate_records if faulty else None)
    model = SCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    meter = StepMeter()
    meter.start()
    step = 0
    while step < args.steps:
        for batch in loader:
            meter.got_batch()
            x, y = batch["image"], batch["label"]
            if faulty:
                x, y = torch.tensor(x), torch.tensor(y)
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            meter.step_done(x.shape[0])
            step += 1
            if step >= args.steps:
                break
    meter.print_result(scenario="lists_unpickle", variant=args.variant, batch_size=BATCH, num_workers=4)


if __name__ == "__main__":
    main()
