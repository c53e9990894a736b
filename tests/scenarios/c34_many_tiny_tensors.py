"""C34: many tiny per-sample tensors crossing the DataLoader worker boundary (cases.md C34).

Stages: 4,000 detection-style samples in memory, each a 3x32x32 uint8 image and a ``targets`` dict
of 7 small tensors (boxes 5x4 float, labels 5, area 5, iscrowd 5, image id 1, original size 2,
size 2); ``DataLoader(num_workers=2, batch_size=64)``; S-CNN on the image only (the targets ride
along, as a detector's would to its loss), ``torch.set_num_threads(1)``, 80 steps.

- faulty: the collate stacks the images and keeps each sample's target tensors in a list, as
  detection code does: 64 x 7 + 1 = 449 tensors per batch. Each tensor a worker returns is moved
  to its own shared-memory segment and crosses to the main process as a file descriptor, which the
  main process rebuilds one by one while the model waits.
- fixed:  the collate concatenates each target field across the batch, with an offsets tensor
  (9 tensors per batch, the same bytes).

Expected diagnosis (faulty): ``input_bound`` cause ``many_tensors``: the workers are not busy, the
batch holds hundreds of tensors of a few KB in all, and the main process's data wait is spent
receiving them (``rebuild_storage_fd``, ``recvmsg``). Fix: pack per-sample tensors in the collate.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from common import SCNN, StepMeter, make_parser, seed_everything

SAMPLES = 4000
FIELDS = ("boxes", "labels", "area", "iscrowd", "image_id", "orig_size", "size")


class Detections(Dataset):
    def __init__(self, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.images = torch.randint(0, 256, (SAMPLES, 3, 32, 32), dtype=torch.uint8, generator=g)
        self.classes = torch.randint(0, 10, (SAMPLES,), generator=g)

    def __len__(self):
        return SAMPLES

    def __getitem__(self, i):
        boxes = torch.rand(5, 4)
        target = {"boxes": boxes, "labels": torch.randint(0, 10, (5,)), "area": boxes[:, 2] * boxes[:, 3],
                  "iscrowd": torch.zeros(5, dtype=torch.int64), "image_id": torch.tensor([i]),
                  "orig_size": torch.tensor([32, 32]), "size": torch.tensor([32, 32])}
        return self.images[i], self.classes[i], target


def collate_lists(samples):
    """Faulty: images stacked, every sample's target tensors kept as they are."""
    return (torch.stack([s[0] for s in samples]), torch.stack([s[1] for s in samples]), [s[2] for s in samples])


def collate_packed(samples):
    """Fixed: each target field concatenated across the batch, with per-sample offsets."""
    targets = [s[2] for s in samples]
    offsets = torch.tensor([0] + [len(t["boxes"]) for t in targets]).cumsum(0)
    packed = {k: torch.cat([t[k] for t in targets]) for k in FIELDS}
    packed["offsets"] = offsets
    return torch.stack([s[0] for s in samples]), torch.stack([s[1] for s in samples]), packed


def main():
    args = make_parser(__doc__, steps=80).parse_args()
    seed_everything(args.seed)
    torch.set_num_threads(1)
    fixed = args.variant == "fixed"
    loader = DataLoader(Detections(args.seed), batch_size=64, shuffle=True, num_workers=2,
                        collate_fn=collate_packed if fixed else collate_lists, persistent_workers=True)
    model = SCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    meter = StepMeter()
    meter.start()
    step = 0
    while step < args.steps:
        for images, labels, _targets in loader:
            meter.got_batch()
            x = images.float().div_(255)
            loss = F.cross_entropy(model(x), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            meter.step_done(len(labels))
            if step >= args.steps:
                break
    meter.print_result(scenario="c34_many_tiny_tensors", variant=args.variant)


if __name__ == "__main__":
    main()
