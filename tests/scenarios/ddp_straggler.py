"""A DDP job (gloo, CPU) whose rank 1 is the straggler: the other ranks wait for it in the gradient
all-reduce at the end of their backward.

Run under torchrun: ``torchrun --standalone --nproc_per_node 2 ddp_straggler.py [--kind K] [--fixed]``.
Stages: an in-memory synthetic dataset split by ``DistributedSampler``, an MLP in
``DistributedDataParallel``, SGD, batch 16 per rank, one intra-op thread per rank.

- ``--kind loader`` (default): rank 1's samples cost 2 ms each to load (a slow shard: remote
  storage or a costly decode), ``num_workers=0``.
- ``--kind forward``: rank 1's forward takes 25 ms more (a slower device).
- faulty: as above; fixed (``--fixed``): rank 1 as fast as rank 0.

Expected diagnosis (faulty): the report describes rank 1 with a ``straggler`` and an ``imbalance``
finding; loader: verdict ``input_bound`` on rank 1 (imbalance info); forward: verdict
``imbalance``. Fixed: no straggler, the report describes rank 0.
The RESULT line is rank 0's, with ``samples_per_s`` the job's (rank 0's × world size: DDP
steps in lockstep).
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from common import StepMeter, make_parser, seed_everything


class Shard(Dataset):
    def __init__(self, slow_s: float):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(8192, 64, generator=g)
        self.y = torch.randint(0, 4, (8192,), generator=g)
        self.slow_s = slow_s

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if self.slow_s:
            time.sleep(self.slow_s)  # this rank's shard is slow to read
        return self.x[i], self.y[i]


class Net(nn.Module):
    def __init__(self, slow_s: float):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 4))
        self.slow_s = slow_s

    def forward(self, x):
        out = self.body(x)
        if self.slow_s:
            time.sleep(self.slow_s)  # a slower device: its layers take longer
        return out


def main():
    p = make_parser(__doc__, steps=60)
    p.add_argument("--kind", choices=("loader", "forward"), default="loader")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    seed_everything(args.seed)
    late = rank == 1 and args.variant == "faulty"
    data = Shard(0.002 if late and args.kind == "loader" else 0.0)
    loader = DataLoader(data, batch_size=16, sampler=DistributedSampler(data, seed=args.seed), drop_last=True)
    model = DistributedDataParallel(Net(0.025 if late and args.kind == "forward" else 0.0))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    meter = StepMeter()
    meter.start()
    step = 0
    while step < args.steps:
        for x, y in loader:
            meter.got_batch()
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            meter.step_done(x.shape[0] * world)
            step += 1
            if step >= args.steps:
                break
    if rank == 0:
        meter.print_result(scenario="ddp_straggler", variant=args.variant, kind=args.kind, world_size=world)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
