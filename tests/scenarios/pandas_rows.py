"""A tabular pipeline that looks up one DataFrame row per sample (``df.iloc[i]``) and converts each
field with Python in ``__getitem__``, ``num_workers=0``, the S-MLP (as users write it).

- faulty: ``__getitem__`` reads ``df.iloc[i]`` (a pandas Series built per row), then turns each of
  the 256 feature fields into a float one by one (``float(row[c])``) and builds the tensor from that
  list: pandas' per-row object path plus a Python loop per field.
- fixed: the same values vectorized once: ``df[features].to_numpy(np.float32)`` at start-up and a
  tensor index per sample (``self.x[i]``), same shuffling, same batches.

Expected diagnosis (faulty): ``input_bound`` (verdict), cause ``loader_in_main_process``, the
hot lines in ``__getitem__`` with their share of the loading time. Measured ratio: README table.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from common import SMLP, StepMeter, make_parser, seed_everything

FEATURES = 256
ROWS = 4096


def make_frame(seed: int) -> pd.DataFrame:
    """A DataFrame of ``ROWS`` rows: 256 float feature columns, a category and an int label."""
    rng = np.random.default_rng(seed)
    df = pd.DataFrame(rng.normal(size=(ROWS, FEATURES)).astype(np.float32), columns=[f"f{i}" for i in range(FEATURES)])
    df["city"] = rng.choice(["a", "b", "c"], ROWS)
    df["label"] = rng.integers(0, 10, ROWS)
    return df


class RowLookup(Dataset):
    """One ``df.iloc[i]`` per sample and a Python conversion per field (faulty)."""

    def __init__(self, df):
        self.df, self.cols = df, [f"f{i}" for i in range(FEATURES)]

    def __len__(self):
        return len(self.df)

    def __getitem__(self, i):
        row = self.df.iloc[i]
        values = [float(row[c]) for c in self.cols]
        x = torch.tensor(values, dtype=torch.float32)
        return x, int(row["label"])


class Vectorized(Dataset):
    """The same values converted once at start-up (fixed)."""

    def __init__(self, df):
        cols = [f"f{i}" for i in range(FEATURES)]
        self.x = torch.from_numpy(df[cols].to_numpy(np.float32, copy=True))
        self.y = torch.from_numpy(df["label"].to_numpy(np.int64, copy=True))

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def main():
    p = make_parser(__doc__, steps=60)
    args = p.parse_args()
    torch.set_num_threads(1)
    seed_everything(args.seed)
    df = make_frame(args.seed)
    dataset = Vectorized(df) if args.variant == "fixed" else RowLookup(df)
    loader = DataLoader(dataset, batch_size=64, shuffle=True, drop_last=True, num_workers=0)
    model = SMLP(FEATURES)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
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
    meter.print_result(scenario="pandas_rows", variant=args.variant, batch_size=64)


if __name__ == "__main__":
    main()
