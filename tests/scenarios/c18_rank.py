"""One rank of the C18 scenario (started twice by c18_thread_oversubscription.py, its launcher).

Trains the S-MLP (512 -> 1024 -> 1024 -> 10, batch 256, SGD) from a ``DataLoader(num_workers=2)``
whose ``forkserver`` workers build each sample from 8 synthetic 256-dim frames, after meeting the
other rank at a file barrier; prints its own ``RANK{n} RESULT {...}`` line. ``--variant faulty``:
8 intra-op threads in the rank and in each loader worker; ``fixed``: 1. The launcher's docstring
holds the scenario.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import functools
import multiprocessing as mp
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from common import SMLP, StepMeter, make_parser, seed_everything

FRAMES, DIM = 8, 256
WORLD = 2


class FrameFeatures(Dataset):
    """Each sample: 16 frames x 256 raw values (generated from the index) -> 512 features."""

    def __init__(self, length, seed):
        self.length, self.seed = length, seed
        self.proj = torch.randn(DIM, DIM, generator=torch.Generator().manual_seed(seed)) / DIM**0.5

    def __len__(self):
        return self.length

    def __getitem__(self, idx):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + idx)
        frames = torch.randn(FRAMES, DIM, generator=g)
        h = torch.tanh(frames @ self.proj)  # the 256x256 matmul-based feature transform
        feats = torch.cat([h.mean(0), h.amax(0)])
        return feats, idx % 10


def worker_init_fn(worker_id, threads):
    torch.set_num_threads(threads)


def wait_for_peers(barrier_dir, rank, world, timeout=300.0):
    open(os.path.join(barrier_dir, f"ready.{rank}"), "w").close()
    deadline = time.monotonic() + timeout
    while sum(os.path.exists(os.path.join(barrier_dir, f"ready.{r}")) for r in range(world)) < world:
        if time.monotonic() > deadline:
            raise TimeoutError("peers did not reach the barrier")
        time.sleep(0.005)


def run_rank(args):
    threads = 8 if args.variant == "faulty" else 1
    torch.set_num_threads(threads)
    seed_everything(args.seed + args.rank)

    dataset = FrameFeatures(length=256 * max(args.steps, 1), seed=args.seed + 17 * args.rank)
    # forkserver, not fork: a forked worker that runs GNU OpenMP with more than one thread after
    # its parent already had an OpenMP thread pool deadlocks (libgomp is not fork-safe).
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch"])
    loader = DataLoader(
        dataset,
        batch_size=256,
        shuffle=True,
        drop_last=True,
        num_workers=2,
        worker_init_fn=functools.partial(worker_init_fn, threads=threads),
        multiprocessing_context=ctx,
    )
    model = SMLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    batches = iter(loader)  # starts the loader workers (the dataset is one epoch of args.steps batches)
    wait_for_peers(args.barrier_dir, args.rank, WORLD)
    meter = StepMeter()
    meter.start()
    for step, (x, y) in enumerate(batches, start=1):
        meter.got_batch()
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        meter.step_done(x.shape[0])
        if step >= args.steps:
            break
    meter.print_result(
        prefix=f"RANK{args.rank} ",
        scenario="c18_thread_oversubscription",
        variant=args.variant,
        rank=args.rank,
        threads=threads,
        batch_size=256,
    )
    del batches  # shut the loader workers down (and let them be reaped) before exiting
    return 0


def main():
    p = make_parser(__doc__, steps=60)
    p.add_argument("--rank", type=int, required=True, help="this rank")
    p.add_argument("--barrier-dir", required=True, help="directory of the start barrier")
    return run_rank(p.parse_args())


if __name__ == "__main__":
    sys.exit(main())
