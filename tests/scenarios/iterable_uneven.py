"""An ``IterableDataset`` sharded across its DataLoader workers by whole files of unequal size:
worker 0 reads 4x as many records as each of the other three, so every epoch ends with the loop
waiting on worker 0 alone.

Stages: the training set is 4 record files on (simulated) remote storage, 1,024 + 256 + 256 +
256 records of 3x32x32 uint8 (1,792 records, 56 batches of 32 per epoch). Reading a record is a
round trip to the storage (sleep 0.12 x T_c, off CPU; T_c = the S-CNN's compute step at
batch 32, calibrated at start-up, ``--tc`` skips it) plus a small NumPy decode (normalise, random
flip). Each worker batches its own records (an ``IterableDataset``), so the in-order loader takes
one batch from each worker in turn. S-CNN, batch 32, SGD, ``torch.set_num_threads(1)``,
``DataLoader(num_workers=4, persistent_workers=True)``, 4 epochs (224 steps) by default.

- faulty: ``files[worker_id::num_workers]``: worker 0 gets the big file (1,024 records, 32
  batches), workers 1-3 a small one each (8 batches). Worker 0 alone needs ~123 T_c per epoch,
  the loop ~56 T_c: workers 1-3 finish after 8 rounds and for the last 24 batches of the epoch
  only worker 0 produces while the loop waits (data wait ~55 %, the training process asleep).
- fixed:  the same records interleaved: record i of the concatenated files goes to worker i % 4
  (448 records, 14 batches each, ~54 T_c per worker); same samples per epoch.

The per-record cost is mostly storage latency on purpose: with a CPU-only cost the four workers
share the box's 2 cores, and an even split can at best use 2 cores where the uneven tail uses 1
(~1.1x here; on a machine with a core per worker it is the same fault with ~2.3x).

Expected diagnosis (faulty): ``input_bound`` concentrated at the end of each epoch (the data wait
per step grows through the epoch: the last ~40 % of the steps wait), workers 1-3 idle
(exhausted) while worker 0 is still reading: uneven shards of an ``IterableDataset``; fix:
split by record (or balance the files) across ``get_worker_info()`` workers, not by whole files.

Measured plainly on the 2-core dev box (3 alternated repeats, medians): faulty 749 samples/s
(data wait 0.56), fixed 1596 (0.16): 2.1x [1.84-2.18].
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from common import SCNN, StepMeter, make_parser, measure_tc, seed_everything

FILE_RECORDS = [1024, 256, 256, 256]
RECORD_BYTES = 3 * 32 * 32
BATCH = 32


def make_files(seed):
    """name -> (bytes of all records, labels): like record files of different sizes in a bucket."""
    rng = np.random.default_rng(seed)
    files = {}
    for k, n in enumerate(FILE_RECORDS):
        data = rng.integers(0, 256, size=n * RECORD_BYTES, dtype=np.uint8).tobytes()
        files[f"train-{k:05d}-of-{len(FILE_RECORDS):05d}.rec"] = (data, rng.integers(0, 10, size=n).tolist())
    return files


class RecordStream(IterableDataset):
    def __init__(self, files, read_s, interleave):
        self.files, self.read_s, self.interleave = files, read_s, interleave

    def read_record(self, name, j):
        time.sleep(self.read_s)  # round trip to the storage for one record
        data, labels = self.files[name]
        raw = np.frombuffer(data, dtype=np.uint8, count=RECORD_BYTES, offset=j * RECORD_BYTES)
        img = (raw.reshape(3, 32, 32).astype(np.float32) / 255.0 - 0.5) / 0.25
        if np.random.rand() < 0.5:
            img = img[:, :, ::-1].copy()
        return torch.from_numpy(img), labels[j]

    def __iter__(self):
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info else (0, 1)
        names = sorted(self.files)
        if not self.interleave:
            # each worker reads whole files
            for name in names[wid::nw]:
                for j in range(len(self.files[name][1])):
                    yield self.read_record(name, j)
        else:
            # every worker reads every nw-th record of the concatenated files
            records = [(name, j) for name in names for j in range(len(self.files[name][1]))]
            for name, j in records[wid::nw]:
                yield self.read_record(name, j)


def main():
    p = make_parser(__doc__, steps=4 * sum(FILE_RECORDS) // BATCH, tc=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    seed_everything(args.seed)

    files = make_files(args.seed)
    model = SCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    tc = args.tc or measure_tc(
        model, (torch.randn(BATCH, 3, 32, 32), torch.randint(0, 10, (BATCH,))), F.cross_entropy, optimizer
    )
    read_s = 0.12 * tc
    dataset = RecordStream(files, read_s, interleave=args.variant == "fixed")
    loader = DataLoader(dataset, batch_size=BATCH, num_workers=4, persistent_workers=True)

    meter = StepMeter()
    meter.start()
    step = epoch = 0
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
        epoch += 1
    meter.print_result(scenario="iterable_uneven", variant=args.variant, tc_s=round(tc, 5),
                       read_latency_s=round(read_s, 5), batch_size=BATCH, num_workers=4, epochs=epoch,
                       steps_per_epoch=sum(FILE_RECORDS) // BATCH)


if __name__ == "__main__":
    main()
