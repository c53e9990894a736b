"""A DDP job (gloo, CPU) with one rank the others wait for, or none.

Run under torchrun: ``torchrun --standalone --nproc_per_node 2 ddp_straggler.py [--kind K] [--fixed]``
(or as 2 "nodes": ``--nnodes 2 --node_rank i --rdzv-backend c10d --rdzv-endpoint HOST:PORT``).
Stages: an in-memory synthetic dataset split by ``DistributedSampler``, an MLP in
``DistributedDataParallel``, SGD, batch 16 per rank, one intra-op thread per rank.

- ``--kind loader`` (default): rank 1's samples cost 2 ms each to load (a slow shard: remote
  storage or a costly decode), ``num_workers=0``.
- ``--kind host``: rank 1 runs ~25 ms of Python after each optimizer step (rank-local logging or
  metric code).
- ``--kind forward``: rank 1's forward takes 25 ms more (a slower device; a sleep).
- ``--kind compute``: rank 1's forward runs five more 512×512 matmuls (~23 ms of operator work on
  one thread: a slower device, or more work on that rank).
- ``--kind validation`` (C17): every 10 steps, before the step's forward, rank 0 alone runs a
  validation pass (512 batches under ``no_grad`` and a Python metric) while rank 1 goes on to the next step's all-reduce.
  Fixed: both ranks validate half of the data each and all-reduce the metric.
- ``--kind accum`` (C27): gradient accumulation over 4 micro-batches of 16 with a wide MLP
  (4.3 M parameters: a 17 MB gradient all-reduce); faulty: ``backward()`` on every micro-batch
  inside DDP (4 all-reduces per optimizer step); fixed: the first 3 under ``model.no_sync()``.
- ``--kind metrics`` (C28): every step each rank all-reduces 4 scalar metrics and reads them
  (``.item()``). Fixed: the metrics are summed locally and all-reduced once every 50 steps.
  Balanced either way (no straggler).
- ``--kind uneven``: one epoch over 2,048 samples under ``model.join()``, each rank slicing its own
  part (``indices[rank::world]``), rank 1's cut to 80 % (a shard that ends early). Fixed: a
  ``DistributedSampler`` with ``drop_last=True`` (the same number of batches on every rank).
- faulty: as above; fixed (``--fixed``): the ranks do the same work.
- ``--slow-after S`` (loader, host): rank 1 turns slow S seconds after the start, a straggler
  that appears mid-run; ``--seconds S``: run that long instead of ``--steps`` (checked every 50 steps).
- ``--profile DIR``: each rank writes a ``torch.profiler`` trace of its steps after the first 4
  (2 skipped, 2 warm-up) to DIR with ``tensorboard_trace_handler``, for ``whyidle trace DIR``.

Expected diagnosis (faulty): the report describes the straggler with an ``imbalance`` finding:
loader → verdict ``input_bound`` on rank 1; host → ``host_bound`` on rank 1; forward →
``imbalance`` (nothing in rank 1's own phases explains it: a slower device); validation → rank
0 with ``eval_bound``; metrics → no straggler; accum →
``accumulation_all_reduce``. Fixed: no straggler, the report describes rank 0.
The RESULT line is rank 0's; ``job_samples_per_s`` is the sum over ranks of each rank's samples
after its first step over their span (whyidle's definition of the job's samples/s).
"""

import contextlib
import gc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

from common import StepMeter, make_parser, seed_everything


class Shard(Dataset):
    def __init__(self, slow_s: float, slow_from: float = 0.0):
        g = torch.Generator().manual_seed(0)
        self.slow_from = slow_from  # monotonic s from which the shard is slow (--slow-after)
        self.x = torch.randn(8192, 64, generator=g)
        self.y = torch.randint(0, 4, (8192,), generator=g)
        self.slow_s = slow_s

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if self.slow_s and time.monotonic() >= self.slow_from:
            time.sleep(self.slow_s)  # this rank's shard is slow to read
        return self.x[i], self.y[i]


class Net(nn.Module):
    def __init__(self, slow_s: float, width: int = 256, extra_matmuls: int = 0):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 4))
        self.slow_s = slow_s
        self.extra = extra_matmuls
        self.a = torch.randn(512, 512) if extra_matmuls else None  # a plain tensor, not a DDP buffer

    def forward(self, x):
        out = self.body(x)
        if self.slow_s:
            time.sleep(self.slow_s)  # a slower device: its layers take longer
        m = self.a
        for _ in range(self.extra):  # more operator work on this rank
            m = torch.tanh(m @ self.a)
        return out if m is None else out + 0.0 * m.mean()


def rank_local_bookkeeping(n: int = 400_000) -> float:
    """Python work one rank does after each step (its own logging or metric code)."""
    total = 0.0
    for i in range(n):
        total += (i % 7) * 0.5
    return total


def validate(model, data, indices) -> float:
    """Accuracy over ``indices`` of ``data``: 16-sample batches under ``no_grad``, a Python metric."""
    model.eval()
    correct = 0
    with torch.no_grad():
        for start in range(0, len(indices), 16):
            idx = indices[start:start + 16]
            x, y = data.x[idx], data.y[idx]
            pred = model.module(x).argmax(1)
            correct += sum(int(p == t) for p, t in zip(pred.tolist(), y.tolist()))
    model.train()
    return correct / max(1, len(indices))


def main():
    p = make_parser(__doc__, steps=60)
    p.add_argument("--kind", choices=("loader", "host", "forward", "compute", "validation", "metrics", "accum", "uneven"),
                   default="loader")
    p.add_argument("--profile", metavar="DIR", default=None, help="write each rank's profiler trace to DIR")
    p.add_argument("--slow-after", type=float, default=0.0, metavar="S",
                   help="loader and host kinds: rank 1 turns slow only S seconds after the start (a straggler "
                        "that appears mid-run)")
    p.add_argument("--seconds", type=float, default=None, help="stop after this many seconds instead of --steps")
    args = p.parse_args()
    slow_from = time.monotonic() + args.slow_after
    end_at = None if args.seconds is None else time.monotonic() + args.seconds
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    seed_everything(args.seed)
    faulty = args.variant == "faulty"
    late = rank == 1 and faulty
    data = Shard(0.002 if late and args.kind == "loader" else 0.0, slow_from)
    loader = DataLoader(data, batch_size=16, sampler=DistributedSampler(data, seed=args.seed), drop_last=True)
    if args.kind == "uneven":  # one epoch; each rank its own slice, rank 1's shorter when faulty
        part = Subset(data, range(2048))
        mine = list(range(rank, 2048, world))[:int(1024 * 0.8) if late else None]
        loader = (DataLoader(Subset(data, mine), batch_size=16, shuffle=True) if faulty else
                  DataLoader(part, batch_size=16, sampler=DistributedSampler(part, seed=args.seed, drop_last=True)))
    model = DistributedDataParallel(Net(0.025 if late and args.kind == "forward" else 0.0,
                                        2048 if args.kind == "accum" else 256,
                                        5 if late and args.kind == "compute" else 0))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    val_idx = list(range(8192))  # 512 batches of 16
    sums = torch.zeros(4)
    meter = StepMeter()
    meter.start()
    step = 0
    prof = (torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                   schedule=torch.profiler.schedule(wait=2, warmup=2, active=max(1, args.steps - 4), repeat=1),
                                   on_trace_ready=torch.profiler.tensorboard_trace_handler(args.profile))
            if args.profile else contextlib.nullcontext())
    prof.__enter__()
    join = model.join() if args.kind == "uneven" else contextlib.nullcontext()
    join.__enter__()
    if end_at is not None:
        args.steps = 10**9
    while step < args.steps:
        for x, y in loader:
            meter.got_batch()
            if args.kind == "validation" and step and step % 10 == 0:
                if faulty and rank == 0:  # rank 0 alone; the others go on and wait in the all-reduce
                    validate(model, data, val_idx)
                elif not faulty:  # each rank its half, one all-reduce of the metric
                    acc = torch.tensor([validate(model, data, val_idx[rank::world])])
                    dist.all_reduce(acc)
            if args.kind == "accum":  # 4 micro-batches of 4 samples per optimizer step
                for k, (xm, ym) in enumerate(zip(x.chunk(4), y.chunk(4))):
                    sync = faulty or k == 3  # fixed: reduce only with the last micro-batch
                    with (contextlib.nullcontext() if sync else model.no_sync()):
                        out = model(xm)
                        loss = F.cross_entropy(out, ym) / 4
                        loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            else:
                out = model(x)
                loss = F.cross_entropy(out, y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
            step += 1
            if args.kind == "host" and late and time.monotonic() >= slow_from:
                rank_local_bookkeeping()
            if args.kind == "metrics":
                metrics = torch.stack([loss.detach(), out.detach().abs().mean(), out.detach().std(),
                                       (out.argmax(1) == y).float().mean()])
                if faulty:  # every step: 4 collectives and 4 host reads
                    values = []
                    for m in metrics:
                        m = m.clone()
                        dist.all_reduce(m)
                        values.append(m.item() / world)
                else:
                    sums += metrics
                    if step % 50 == 0:
                        dist.all_reduce(sums)
                        sums.zero_()
            meter.step_done(x.shape[0])
            if args.profile:
                prof.step()
            if end_at is not None and step % 50 == 0:  # --seconds: the ranks stop together (rank 0's clock)
                stop = torch.tensor([float(time.monotonic() >= end_at)])
                dist.broadcast(stop, 0)
                if stop.item():
                    args.steps = step
            if step >= args.steps:
                break
        if args.kind == "uneven":
            break  # one epoch: the ranks' shards end where they end
    join.__exit__(None, None, None)
    prof.__exit__(None, None, None)
    res = meter.result()
    first = meter.step_times[0] if meter.step_times else 0.0
    own = (res["samples"] - x.shape[0]) / (res["wall_s"] - first) if res["wall_s"] > first else 0.0
    total = torch.tensor([own], dtype=torch.float64)
    dist.all_reduce(total)  # after the loop: the job's samples/s as whyidle defines it
    if rank == 0:
        meter.print_result(scenario="ddp_straggler", variant=args.variant, kind=args.kind, world_size=world,
                           job_samples_per_s=round(float(total), 2))
    # DDP's reducer outliving destroy_process_group makes PyTorch 2.13 abort at interpreter exit
    # now and then ("terminate called without an active exception"; 1-2 runs in 15 without whyidle)
    del model, optimizer
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
