"""A hand-written text collate called in the training loop, after the DataLoader, so the main
process pads every batch in Python while the four workers only index lists.

Stages: 8,192 documents held as Python lists of token ids (lengths 16-72, seeded), binary
labels. ``pad_batch`` is the collate of many text tutorials: it allocates the padded
``input_ids`` / ``attention_mask`` tensors and fills them token by token in two Python loops
(~20-25 ms per batch of 64 on the 2-core dev box, about the model's ~22 ms step). The model: an
``nn.Embedding`` (20k x 128), masked mean over the tokens, a 128 -> 512 -> 512 -> 2 MLP; AdamW,
batch 64, ``torch.set_num_threads(1)``. All costs are fixed CPU work.

- faulty: ``DataLoader(num_workers=4, collate_fn=keep_list)`` (each batch stays a list of
  samples) and ``input_ids, mask, labels = pad_batch(batch)`` as the loop's first line, before the
  forward: the padding runs in the training process, serial with the model; more workers cannot
  help, they already wait.
- fixed:  ``DataLoader(num_workers=4, collate_fn=pad_batch)``: the same function, run by the
  workers while the training process runs the previous step.

Expected diagnosis (faulty): ``host_bound`` (the loop's own Python before the forward, not
inside ``next(loader)``: data wait ~0): the hot spot is ``pad_batch``, called from the training
loop; fix: pass it to the DataLoader as ``collate_fn`` (the workers run it). An
``input_bound`` verdict would be wrong (the loader is not what the loop waits on).

Measured plainly on the 2-core dev box (3 alternated repeats, medians): faulty 1344 samples/s
(data wait 0.01), fixed 2681 (0.20): 2.0x [1.94-1.99]. The fix needs the second core for the
workers: with other jobs loading the box (load average 4-6) it measured 0.98-1.7x.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from common import StepMeter, make_parser, seed_everything

N_DOCS = 8192
VOCAB = 20000
PAD = 0
BATCH = 64


class TokenizedDocs(Dataset):
    def __init__(self, seed):
        rng = np.random.default_rng(seed)
        lengths = rng.integers(16, 73, size=N_DOCS)
        self.docs = [rng.integers(1, VOCAB, size=n).tolist() for n in lengths]
        self.labels = rng.integers(0, 2, size=N_DOCS).tolist()

    def __len__(self):
        return N_DOCS

    def __getitem__(self, i):
        return {"input_ids": self.docs[i], "label": self.labels[i]}


def keep_list(batch):
    """Identity collate: the batch stays a list of sample dicts."""
    return batch


def pad_batch(batch):
    """Pad the token-id lists to the longest one; 1s in the mask where there is a token."""
    max_len = max(len(s["input_ids"]) for s in batch)
    input_ids = torch.full((len(batch), max_len), PAD, dtype=torch.long)
    attention_mask = torch.zeros(len(batch), max_len)
    for i, sample in enumerate(batch):
        for j, token in enumerate(sample["input_ids"]):
            input_ids[i, j] = token
            attention_mask[i, j] = 1.0
    labels = torch.tensor([s["label"] for s in batch])
    return input_ids, attention_mask, labels


class BagOfEmbeddings(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 128, padding_idx=PAD)
        self.mlp = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 2))

    def forward(self, input_ids, attention_mask):
        h = self.embed(input_ids) * attention_mask.unsqueeze(-1)
        h = h.sum(1) / attention_mask.sum(1, keepdim=True)
        return self.mlp(h)


def main():
    p = make_parser(__doc__, steps=180)
    args = p.parse_args()
    torch.set_num_threads(1)
    seed_everything(args.seed)

    dataset = TokenizedDocs(args.seed)
    collate = keep_list if args.variant == "faulty" else pad_batch
    loader = DataLoader(dataset, batch_size=BATCH, shuffle=True, drop_last=True, num_workers=4,
                        persistent_workers=True, collate_fn=collate)
    model = BagOfEmbeddings()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    meter = StepMeter()
    meter.start()
    step = 0
    while step < args.steps:
        for batch in loader:
            meter.got_batch()
            if args.variant == "faulty":
                batch = pad_batch(batch)
            input_ids, attention_mask, labels = batch
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(input_ids, attention_mask), labels)
            loss.backward()
            optimizer.step()
            meter.step_done(labels.shape[0])
            step += 1
            if step >= args.steps:
                break
    meter.print_result(scenario="collate_in_loop", variant=args.variant, batch_size=BATCH, num_workers=4)


if __name__ == "__main__":
    main()
