"""A loss computed per sample in a Python loop (the loss-side kind of cases.md C13).

A token tagger (embedding + 2-layer MLP over each token, 50 tags) on padded sequences of varying
length (16-64 tokens, batch 32). The faulty loss slices each sample to its own length and calls
``nn.CrossEntropyLoss`` on it, 32 calls per step, as scripts written sample-by-sample do to skip
the padding; the fixed one pads the targets with ``-100`` (the loss's ``ignore_index``) and calls
it once on the whole batch (whyidle's fix; the same tokens count, each sample's mean is replaced
by the mean over all real tokens).

Expected diagnosis (faulty): ``host_bound`` kind ``module_loop`` with ``module``
``CrossEntropyLoss`` and ``calls_per_step`` 32 at the loop's line; fixed: no ``module_loop``.
Ratios: tests/scenarios/README.md.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.nn as nn

from common import StepMeter, make_parser, seed_everything

VOCAB, TAGS, MAX_LEN, BATCH = 1000, 50, 64, 32


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 64, padding_idx=0)
        self.mlp = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, TAGS))

    def forward(self, ids):
        return self.mlp(self.embed(ids))


def make_batches(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        lengths = torch.randint(16, MAX_LEN + 1, (BATCH,), generator=g)
        ids = torch.randint(1, VOCAB, (BATCH, MAX_LEN), generator=g)
        tags = torch.randint(0, TAGS, (BATCH, MAX_LEN), generator=g)
        pad = torch.arange(MAX_LEN) >= lengths[:, None]
        ids[pad] = 0
        out.append((ids, tags, lengths, pad))
    return out


def main():
    p = make_parser(__doc__, steps=150)
    args = p.parse_args()
    torch.set_num_threads(1)
    seed_everything(args.seed)
    batches = make_batches(args.steps, args.seed)
    model = Tagger()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    meter = StepMeter()
    meter.start()
    for ids, tags, lengths, pad in batches:
        meter.got_batch()
        logits = model(ids)
        if args.variant == "faulty":
            losses = []
            for i in range(ids.shape[0]):  # each sample up to its own length, skipping the padding
                n = int(lengths[i])
                losses.append(criterion(logits[i, :n], tags[i, :n]))
            loss = torch.stack(losses).mean()
        else:
            loss = criterion(logits.flatten(0, 1), tags.masked_fill(pad, -100).flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        meter.step_done(ids.shape[0])
    meter.print_result(scenario="loss_loop", variant=args.variant, batch_size=BATCH)


if __name__ == "__main__":
    main()
