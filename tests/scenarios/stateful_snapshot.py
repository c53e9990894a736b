"""torchdata's ``StatefulDataLoader`` snapshotting a sizeable dataset state on every step
(``snapshot_every_n_steps=1``, its default) although the job checkpoints every 50 steps.

Stages: 16,384 images (3x32x32 uint8) in memory. The dataset is resumable the way torchdata's
docs describe (``state_dict()`` / ``load_state_dict()``): it keeps per-sample statistics, how
many times each image has been served (``self.served``, a dict of 16,384 ids -> count, one copy
per worker), so that a restarted job restores its coverage exactly. With a snapshot on every
step each worker calls ``state_dict()`` after each batch and torchdata diffs it against the
previous one key by key (``_IncrementalWorkerState.generate_delta``, a Python loop over every
flattened key); the training process applies the deltas and rebuilds every worker's nested state
(``_unflatten``, again per key, all 4 workers) on each ``next(loader)``. The loop saves a
checkpoint (model, optimizer and ``loader.state_dict()`` into an in-memory buffer) every 50
steps. S-CNN, batch 32, SGD, ``torch.set_num_threads(1)``, ``StatefulDataLoader(num_workers=4,
persistent_workers=True)``. All costs are fixed CPU work. Needs ``torchdata`` (0.11 installs beside
torch 2.13 without touching it).

- faulty: ``snapshot_every_n_steps=1`` (the default, written out): ~25-30 ms of torchdata
  bookkeeping in the training process per step (~6 ms per worker's state), inside
  ``next(loader)``, about 1.5x the model's step, plus ~15 ms of diffing per batch in the workers.
- fixed:  ``snapshot_every_n_steps=50`` = the checkpoint interval, as torchdata's docs advise
  for large states: the workers send their state only for the batches before a snapshot; the
  checkpoints hold the same information (the last snapshot + the steps since it).

Expected diagnosis (faulty): ``input_bound`` with the training process on the CPU while it
waits (``data_cpu_share`` ~1; the workers are not behind), the time in torchdata's
``stateful_dataloader`` (``_take_snapshot`` / ``_unflatten`` / ``apply_delta``); fix
``snapshot_every_n_steps`` = the checkpoint interval (or a smaller dataset state).

Measured plainly on the 2-core dev box (3 alternated repeats, medians): faulty 653 samples/s
(data wait 0.63, ``data_cpu_share`` 0.95; step p50 46.5 ms), fixed 1483 (0.16; 19.2 ms): 2.3x
[2.13-2.27].
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import io

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset
from torchdata.stateful_dataloader import StatefulDataLoader

from common import SCNN, StepMeter, make_parser, seed_everything

N_SAMPLES = 16384
BATCH = 32
CHECKPOINT_EVERY = 50


class ResumableImages(Dataset):
    """In-memory images that count how often each one was served (restored on resume)."""

    def __init__(self, seed):
        rng = np.random.default_rng(seed)
        self.images = torch.from_numpy(rng.integers(0, 256, size=(N_SAMPLES, 3, 32, 32), dtype=np.uint8))
        self.labels = torch.from_numpy(rng.integers(0, 10, size=N_SAMPLES))
        self.served = {f"img-{i:05d}": 0 for i in range(N_SAMPLES)}

    def __len__(self):
        return N_SAMPLES

    def __getitem__(self, i):
        self.served[f"img-{i:05d}"] += 1
        x = self.images[i].float().div_(255.0).sub_(0.5).div_(0.25)
        return x, self.labels[i]

    def state_dict(self):
        return {"served": dict(self.served)}

    def load_state_dict(self, state):
        self.served = dict(state["served"])


def main():
    p = make_parser(__doc__, steps=200)
    args = p.parse_args()
    torch.set_num_threads(1)
    seed_everything(args.seed)

    snapshot_every = 1 if args.variant == "faulty" else CHECKPOINT_EVERY
    loader = StatefulDataLoader(ResumableImages(args.seed), batch_size=BATCH, shuffle=True, drop_last=True,
                                num_workers=4, persistent_workers=True, snapshot_every_n_steps=snapshot_every)
    model = SCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    meter = StepMeter()
    meter.start()
    step = 0
    checkpoint_bytes = 0
    while step < args.steps:
        for x, y in loader:
            meter.got_batch()
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            step += 1
            if step % CHECKPOINT_EVERY == 0:
                buf = io.BytesIO()
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "loader": loader.state_dict(), "step": step}, buf)
                checkpoint_bytes = buf.tell()
            meter.step_done(x.shape[0])
            if step >= args.steps:
                break
    meter.print_result(scenario="stateful_snapshot", variant=args.variant, batch_size=BATCH, num_workers=4,
                       snapshot_every_n_steps=snapshot_every, checkpoint_every=CHECKPOINT_EVERY,
                       checkpoint_bytes=checkpoint_bytes)


if __name__ == "__main__":
    main()
