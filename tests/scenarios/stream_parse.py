"""A data stream parsed in the training process: an ``IterableDataset`` that reads JSON lines from a
file (written at start-up) and turns each record into tensors with Python, ``num_workers=0``, the
S-MLP.

Each record: ``{"id", "label", "features": [256 floats as text], "meta": {...}}``; per sample one
``json.loads``, a float conversion per feature and a small dict walk: ~0.5 ms of Python per sample.

- faulty: ``DataLoader(stream, batch_size=64, num_workers=0)``: the parsing runs inside the step.
- fixed: the same stream moved off the training process: ``num_workers=2`` (each worker parses
  every 2nd line, ``get_worker_info``), ``persistent_workers=True``, ``prefetch_factor=4``.
- ``--workers N``: N workers (either variant).
- ``--cached``: the stream converted once at start-up (outside the loop) into a float32 array
  (what "computed once and cached" means for a stream: a binary shard), streamed row by row.

Expected diagnosis (faulty): ``input_bound`` / ``loader_in_main_process``, hot lines in
``__iter__``'s parsing. Measured ratio: README table.
"""

import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from common import SMLP, StepMeter, make_parser, seed_everything

FEATURES = 256


def write_stream(path: str, n: int, seed: int) -> None:
    """``n`` JSON lines of records."""
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for i in range(n):
            rec = {"id": i, "label": int(rng.integers(0, 10)),
                   "features": [f"{v:.5f}" for v in rng.normal(size=FEATURES)],
                   "meta": {"source": "sensor", "tags": ["a", "b"], "quality": float(rng.uniform())}}
            f.write(json.dumps(rec) + "\n")


class JsonLines(IterableDataset):
    """Parses the file's records one by one, forever (each worker every k-th line)."""

    def __init__(self, path: str):
        self.path = path

    def __iter__(self):
        info = get_worker_info()
        k, me = (info.num_workers, info.id) if info else (1, 0)
        while True:
            with open(self.path) as f:
                for n, line in enumerate(f):
                    if n % k != me:
                        continue
                    rec = json.loads(line)
                    x = torch.tensor([float(v) for v in rec["features"]], dtype=torch.float32)
                    weight = rec["meta"]["quality"] if "sensor" in rec["meta"]["source"] else 1.0
                    yield x * weight, rec["label"]


class CachedRows(IterableDataset):
    """The same records converted once into arrays, streamed row by row (each worker every k-th)."""

    def __init__(self, path: str):
        rows = [json.loads(line) for line in open(path)]
        self.x = np.array([[float(v) for v in r["features"]] for r in rows], dtype=np.float32)
        self.x *= np.array([r["meta"]["quality"] for r in rows], dtype=np.float32)[:, None]
        self.y = np.array([r["label"] for r in rows], dtype=np.int64)

    def __iter__(self):
        info = get_worker_info()
        k, me = (info.num_workers, info.id) if info else (1, 0)
        while True:
            for n in range(me, len(self.y), k):
                yield torch.from_numpy(self.x[n]), int(self.y[n])


def main():
    p = make_parser(__doc__, steps=60)
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--cached", action="store_true", help="convert the stream once into arrays (either variant)")
    args = p.parse_args()
    torch.set_num_threads(1)
    seed_everything(args.seed)
    workers = args.workers if args.workers is not None else (2 if args.variant == "fixed" else 0)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "stream.jsonl")
        write_stream(path, 4096, args.seed)
        loader = DataLoader(CachedRows(path) if args.cached else JsonLines(path), batch_size=64, num_workers=workers, persistent_workers=workers > 0,
                            prefetch_factor=4 if workers else None)
        model = SMLP(FEATURES)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        meter = StepMeter()
        meter.start()
        step = 0
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
        meter.print_result(scenario="stream_parse", variant=args.variant, workers=workers, cached=args.cached,
                           batch_size=64)


if __name__ == "__main__":
    main()
