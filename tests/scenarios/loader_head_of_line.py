"""Head-of-line blocking in a multi-worker DataLoader: one worker's rare storage stalls hold up
the whole in-order stream while the other workers' batches sit ready.

Stages: 4,096 images (3x32x32 uint8) behind a simulated remote object store. Each DataLoader
worker opens its own connection in ``worker_init_fn``, round-robin over three storage replicas;
worker 0 lands on replica "a", which misses its cache for a fixed 0.8 % of the keys (32 of
4,096, by a hash of the key): such a read stalls for 30 x T_c (a remote read that hangs). Every other read costs 1/32 T_c (sleep, off
CPU) plus a cheap decode, so a worker fetches a batch of 32 in ~1 T_c and the four workers
together could deliver ~4 batches per step: their mean throughput is ample. T_c = the S-CNN's
compute step at batch 32, calibrated at start-up (``--tc`` skips it). S-CNN, batch 32, shuffle.

- faulty: ``DataLoader(num_workers=4)`` with the default ``prefetch_factor=2`` and
  ``in_order=True``: batch k comes from worker k % 4 and must be returned in order, so each stall
  in worker 0 (~1 in 5 of its batches has a cold key) stops the loop although workers 1-3 have
  their batches ready. Data wait ~67 % of the loop, the training process sleeps while it waits
  (``data_cpu_share`` ~0.03).
- fixed: ``DataLoader(..., in_order=False)`` (PyTorch >= 2.6): the loop takes whichever batch is
  ready; the stalled worker only delays its own batches.
- ``--variant prefetch``: ``prefetch_factor=8``, still in order: a deeper queue helps little
  (~1.15x): worker 0's mean time per batch (~1 T_c + 0.25 x 30 T_c) is above the ~4 T_c that
  the loop gives it (every 4th batch), so it falls behind whatever the depth.

Expected diagnosis (faulty): ``input_bound`` with the workers mostly idle (waiting for
the loop to take their batches) while the loop waits on one worker: head-of-line blocking of an
in-order loader, a straggling worker (worker 0, ``replica a``); fix ``in_order=False`` (or a
timeout/retry around the slow reads), not more workers or a deeper prefetch.

Measured plainly on the 2-core dev box (3 alternated repeats, medians): faulty 466 samples/s (data
wait 0.72), fixed 1386 (0.15): 3.1x [2.3-3.3]; ``--variant prefetch`` 531 (0.71): 1.08x.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import time
import zlib

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, get_worker_info

from common import SCNN, StepMeter, make_parser, measure_tc, seed_everything

N_SAMPLES = 4096
BATCH = 32
REPLICAS = ["a", "b", "c"]


class RemoteStore:
    """A connection to one replica of an object store (simulated: the bytes are in memory)."""

    def __init__(self, blobs, replica, read_s, stall_s):
        self.blobs, self.replica = blobs, replica
        self.read_s, self.stall_s = read_s, stall_s

    def get(self, key):
        time.sleep(self.read_s)
        # replica "a" misses its cache for about 1 % of the keys (always the same ones)
        if self.replica == "a" and zlib.crc32(key.encode()) % 100 == 0:
            time.sleep(self.stall_s)
        return self.blobs[key]


class RemoteImages(Dataset):
    def __init__(self, blobs, labels, read_s, stall_s):
        self.blobs, self.labels = blobs, labels
        self.read_s, self.stall_s = read_s, stall_s
        self.store = RemoteStore(blobs, "a", read_s, stall_s)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, idx):
        data = self.store.get(f"train/{idx:06d}.raw")
        img = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(3, 32, 32)
        x = img.float().div_(255.0).sub_(0.5).div_(0.25)
        return x, self.labels[idx]


def connect_worker(worker_id):
    """Each worker opens its own connection, spread over the replicas."""
    ds = get_worker_info().dataset
    ds.store = RemoteStore(ds.blobs, REPLICAS[worker_id % len(REPLICAS)], ds.read_s, ds.stall_s)


def main():
    p = make_parser(__doc__, steps=160, tc=True, variants=False)
    p.add_argument("--variant", choices=("faulty", "fixed", "prefetch"), default="faulty",
                   help="faulty: in order, prefetch 2; fixed: in_order=False; prefetch: in order, prefetch 8")
    p.add_argument("--fixed", dest="variant", action="store_const", const="fixed", help="same as --variant fixed")
    args = p.parse_args()
    torch.set_num_threads(1)
    seed_everything(args.seed)

    rng = np.random.default_rng(args.seed)
    images = rng.integers(0, 256, size=(N_SAMPLES, 3, 32, 32), dtype=np.uint8)
    blobs = {f"train/{i:06d}.raw": images[i].tobytes() for i in range(N_SAMPLES)}
    labels = rng.integers(0, 10, size=N_SAMPLES).tolist()

    model = SCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    tc = args.tc or measure_tc(
        model, (torch.randn(BATCH, 3, 32, 32), torch.randint(0, 10, (BATCH,))), F.cross_entropy, optimizer
    )
    read_s, stall_s = tc / BATCH, 30 * tc
    dataset = RemoteImages(blobs, labels, read_s, stall_s)
    opts = {"faulty": {}, "fixed": {"in_order": False}, "prefetch": {"prefetch_factor": 8}}[args.variant]
    loader = DataLoader(dataset, batch_size=BATCH, shuffle=True, drop_last=True, num_workers=4,
                        persistent_workers=True, worker_init_fn=connect_worker, **opts)

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
    meter.print_result(scenario="loader_head_of_line", variant=args.variant, tc_s=round(tc, 5),
                       read_latency_s=round(read_s, 5), stall_s=round(stall_s, 4), batch_size=BATCH,
                       num_workers=4, prefetch_factor=loader.prefetch_factor, in_order=loader.in_order)


if __name__ == "__main__":
    main()
