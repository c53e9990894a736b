"""DataLoader workers started again every epoch: short epochs, ``spawn`` workers, not persistent.

Stages: a map-style dataset of synthetic 3x32x32 images (one cheap ``torch.randn`` per index), a
``DataLoader(batch_size=32, num_workers=1, multiprocessing_context="spawn")`` over 256 of them (8
batches an epoch), S-CNN + Adam on 1 thread, ``--steps`` optimizer steps (default 96: 12 epochs).
Each new epoch's ``iter(loader)`` starts a fresh ``spawn`` worker, which imports torch and this
script again before the first batch (1.5-5 s on a busy 2-core box), while the epoch itself trains
in about a quarter of a second. Short epochs: a trial of a few seconds sees several restarts.

- faulty: ``persistent_workers`` left at its default (False): the worker is started 12 times.
- fixed:  ``persistent_workers=True`` (whyidle's printed fix for ``epoch_boundary``): started once.

Expected diagnosis (faulty): ``epoch_boundary`` (critical), fix ``persistent_workers=True``;
``whyidle tune`` tries that setting and it wins. Fixed: no ``epoch_boundary``. The RESULT line's
``samples_per_s`` is over the whole loop (the waits for new workers included). Ratios:
tests/scenarios/README.md.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from common import SCNN, StepMeter, make_parser, seed_everything


class Images(Dataset):
    """Synthetic 3x32x32 images made per index (map-style: the spawned workers pickle it)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(3, 32, 32, generator=g), i % 10


def main():
    args = make_parser(__doc__, steps=96).parse_args()
    torch.set_num_threads(1)
    seed_everything(args.seed)
    persistent = args.variant == "fixed"
    train = DataLoader(Images(256), batch_size=32, shuffle=True, num_workers=1, multiprocessing_context="spawn", persistent_workers=persistent)
    model = SCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    meter = StepMeter()
    meter.start()
    step = 0
    while step < args.steps:
        for x, y in train:
            meter.got_batch()
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
            step += 1
            meter.step_done(x.shape[0])
            if step >= args.steps:
                break
    meter.print_result(scenario="respawn_workers", variant=args.variant, persistent_workers=persistent, batch_size=32)


if __name__ == "__main__":
    main()
