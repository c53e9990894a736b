"""Batch 2 under bf16 autocast: a small transformer encoder classifier trained two samples at a time.

Stages: token ids held in memory (``TensorDataset``), ``nn.TransformerEncoder`` (2 layers, d=128,
4 heads, sequence 32) + mean pooling + linear head, ``torch.autocast("cpu", dtype=torch.bfloat16)``
around forward and loss, AdamW, default torch threads (as users write it). At batch 2 each step
pays the full per-step cost (hundreds of op dispatches plus autocast's casts in forward and
backward, AdamW over every parameter) for two samples.

- faulty: ``--batch 2`` (default)
- fixed: ``--batch 64`` (``--fixed``), the learning rate scaled linearly.
- ``--float32``: autocast off, at any batch (to compare the dtypes). On a 2-core EPYC with
  AVX512-BF16, float32 measured 1.06× bfloat16's samples/s at batch 2 and 0.6× at batch 64 in
  issue 32's session, 1.33× and 1.29× in a later one: the whole-model gain of the dtype varies.

Compare samples/s (the per-sample rate is the measure). Expected diagnosis (faulty):
``small_batch`` as the verdict (the fixed per-step cost, per-operation overhead included, is the
largest measured share), fix: a bigger batch with the learning-rate note.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import StepMeter, make_parser, seed_everything

VOCAB, SEQ, D = 1000, 32, 128


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        layer = nn.TransformerEncoderLayer(D, 4, dim_feedforward=256, batch_first=True, dropout=0.0)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(D, 4)

    def forward(self, x):
        return self.head(self.enc(self.emb(x)).mean(1))


def main():
    p = make_parser(__doc__, steps=0)
    p.set_defaults(steps=None)
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--float32", action="store_true", help="autocast off (emulated_precision's fix, to compare)")
    args = p.parse_args()
    batch = args.batch or (64 if args.variant == "fixed" else 2)
    steps = args.steps or max(20, 4000 // batch)
    seed_everything(args.seed)
    g = torch.Generator().manual_seed(args.seed)
    tokens = torch.randint(0, VOCAB, (8192, SEQ), generator=g)
    labels = tokens[:, 0] % 4
    loader = DataLoader(TensorDataset(tokens, labels), batch_size=batch, shuffle=True, drop_last=True)
    model = Classifier()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4 * batch / 2)
    meter = StepMeter()
    meter.start()
    step = 0
    while step < steps:
        for x, y in loader:
            meter.got_batch()
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=not args.float32):
                loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            meter.step_done(x.shape[0])
            step += 1
            if step >= steps:
                break
    meter.print_result(scenario="small_batch_bf16", variant=args.variant, batch_size=batch)


if __name__ == "__main__":
    main()
