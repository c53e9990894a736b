"""Slow (network-like) storage read one small file per sample, in the main process.

Stages: at start-up the dataset is written as one raw file per sample (3x32x32 uint8, 3,072
bytes) into a temporary directory. ``__getitem__`` reads the sample's file with a real
``open()``/``read()`` and then suffers a per-read latency standing for slow network storage
(``time.sleep``: off-CPU, releases the GIL). The latency is calibrated at start-up as
0.1 x T_c per file (T_c = median compute step of the S-CNN at batch 32), i.e. ~3.2 T_c of
waiting per batch of 32: ~1 ms per file on the 2-core dev box (T_c ~10 ms), 3-6 ms per file
where T_c is 30-60 ms. Decoding (bytes -> normalised float tensor, random flip) is cheap.

- faulty: ``DataLoader(num_workers=0)``: every read latency lands on the training loop; the
  main process is mostly off-CPU (sleeping in the reads), data wait ~75 % of the step.
- fixed:  ``DataLoader(num_workers=6, persistent_workers=True, prefetch_factor=4)``: six workers
  overlap their read latencies even on 2 cores (they sleep, they do not need a core each).

Expected diagnosis (faulty): ``input_bound``, cause ``storage`` (the data phase is off-CPU:
blocked in file reads / sleeping, low CPU, low loader CPU). Fix: more workers to overlap I/O
latency (workers ~ fetch_time_per_batch / step_time, more than the core count is fine for I/O),
larger prefetch, local cache or packed shards.

Expected faulty -> fixed throughput ratio: ~4x; assert >= 2x.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import shutil
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from common import SCNN, StepMeter, make_parser, measure_tc, seed_everything

N_SAMPLES = 2000
MEAN = torch.tensor([0.49, 0.48, 0.45]).view(3, 1, 1)
STD = torch.tensor([0.25, 0.24, 0.26]).view(3, 1, 1)


def write_shards(root, n, seed):
    """One raw file per sample, ~3 KB each, like an image folder on a network file system."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, 3, 32, 32), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n)
    files = []
    for i in range(n):
        path = os.path.join(root, f"{i // 500:03d}", f"sample_{i:06d}_{labels[i]}.raw")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(images[i].tobytes())
        files.append((path, int(labels[i])))
    return files


class FileDataset(Dataset):
    def __init__(self, files, read_latency_s):
        self.files = files
        self.read_latency_s = read_latency_s

    def __len__(self):
        return len(self.files)

    def read_file(self, path):
        with open(path, "rb") as f:
            data = f.read()
        time.sleep(self.read_latency_s)  # round trip to the (slow) storage server
        return data

    def __getitem__(self, idx):
        path, label = self.files[idx]
        data = self.read_file(path)
        img = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(3, 32, 32)
        x = (img.float().div_(255.0) - MEAN) / STD
        if torch.rand(()) < 0.5:
            x = x.flip(2)
        return x, label


def main():
    p = make_parser(__doc__, steps=100, tc=True)
    p.add_argument("--read-latency-ms", type=float, default=None, help="per-file latency (default 0.1 x T_c)")
    args = p.parse_args()
    torch.set_num_threads(1)
    seed_everything(args.seed)

    model = SCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    # the files first: written between the calibration steps and the loop, they would count in the
    # training loop's span (whyidle's samples/s) as if the loop had stalled
    root = tempfile.mkdtemp(prefix="slow_storage_")
    try:
        files = write_shards(root, N_SAMPLES, args.seed)
        tc = args.tc or measure_tc(
            model, (torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))), F.cross_entropy, optimizer
        )
        latency = args.read_latency_ms / 1000.0 if args.read_latency_ms is not None else 0.1 * tc
        dataset = FileDataset(files, latency)
        if args.variant == "faulty":
            loader = DataLoader(dataset, batch_size=32, shuffle=True, drop_last=True, num_workers=0)
        else:
            loader = DataLoader(
                dataset,
                batch_size=32,
                shuffle=True,
                drop_last=True,
                num_workers=6,
                persistent_workers=True,
                prefetch_factor=4,
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
            scenario="slow_storage",
            variant=args.variant,
            tc_s=round(tc, 5),
            read_latency_s=round(latency, 5),
            batch_size=32,
        )
        del loader  # stop persistent workers before the files go away
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
