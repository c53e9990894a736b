"""A shared encoder called in a Python loop over the views of each sample.

Stages: multi-view classification (e.g. 24 crops or frames per sample). Each sample is 24 views of
3x16x16; a small CNN encoder (conv 3→16, conv 16→32, global pool, linear 32→64) embeds each view,
the embeddings are averaged and a linear head classifies. Batch 8 (192 views per step), Adam,
in-memory data.

- faulty: ``torch.stack([self.encoder(x[:, v]) for v in range(V)], 1)``: 24 encoder calls per step,
  each on an 8-image slice.
- fixed:  ``self.encoder(x.flatten(0, 1)).unflatten(0, (B, V))``: one call on 192 images.

Expected diagnosis (faulty): ``host_bound`` kind ``module_loop`` naming the encoder call's line
(``module_loop.py``, in ``forward``), 24 calls per step, batch 8 per call; fix: fold the view
dimension into the batch. Fixed: no ``module_loop``.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import StepMeter, make_parser, seed_everything

VIEWS = 24


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.proj = nn.Linear(32, 64)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.relu(self.conv2(x)).mean((2, 3))
        return self.proj(x)


class MultiView(nn.Module):
    def __init__(self, folded: bool):
        super().__init__()
        self.encoder = Encoder()
        self.head = nn.Linear(64, 10)
        self.folded = folded

    def forward(self, x):  # x: [B, V, 3, 16, 16]
        if self.folded:
            feats = self.encoder(x.flatten(0, 1)).unflatten(0, x.shape[:2])
        else:
            feats = torch.stack([self.encoder(x[:, v]) for v in range(x.shape[1])], 1)
        return self.head(feats.mean(1))


def main():
    args = make_parser(__doc__, steps=60).parse_args()
    torch.set_num_threads(1)
    seed_everything(args.seed)
    g = torch.Generator().manual_seed(args.seed)
    data = TensorDataset(torch.randn(512, VIEWS, 3, 16, 16, generator=g), torch.randint(0, 10, (512,), generator=g))
    loader = DataLoader(data, batch_size=8, shuffle=True, drop_last=True)
    model = MultiView(folded=args.variant == "fixed")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
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
    meter.print_result(scenario="module_loop", variant=args.variant, views=VIEWS, batch_size=8)


if __name__ == "__main__":
    main()
