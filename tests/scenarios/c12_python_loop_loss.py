"""C12: Python loops in the loss (cases.md C12).

Stages: metric learning. A small linear encoder (512 -> 256 -> ReLU -> 128, L2-normalised
embeddings; ~1.2 ms per training step with the loss done right on the 2-core dev box: the spec's
~5 ms encoder would leave only ~9x here, since the Python-loop loss costs ~35 ms on this CPU)
over batches of 64 samples, 16 classes x 4 samples per batch (a P x K sampler), in-memory data.
The loss is a batch-hard triplet margin loss: for each anchor, the hardest (farthest) positive
and the hardest (closest) negative, ``relu(d_pos - d_neg + margin)``, averaged.

- faulty: ``batch_hard_loss_loop``: nested Python loops over anchors and candidates, a
  ``torch.norm`` per pair on 0-d / 1-d tensor slices, and Python ``max()`` / ``min()`` over lists
  of 0-d tensors: ~4,000 pair distances and ~20,000 tiny ops per step.
- fixed:  ``batch_hard_loss``: ``torch.cdist`` + masked ``amax`` / ``amin`` + ``relu``: a handful of
  ops. ``--check-loss`` evaluates both on one batch and reports the absolute difference (same
  loss to 1e-5).

40 steps each.

Expected diagnosis (faulty): ``host_bound``, naming ``batch_hard_loss_loop``
(c12_python_loop_loss.py): the time sits in the loss function's Python frames (called
between the model's forward and backward, outside any module's forward), thousands of tiny
ops per step (op count per step >> layer count); launch-bound on a GPU (memory full,
utilization low). Fix: vectorise (cdist, masks, topk), no per-element
Python min/max/.item(), or torch.compile.

Expected faulty -> fixed throughput ratio: >= 10x (measured ~26x on the 2-core dev box; see README).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Sampler, TensorDataset

from common import StepMeter, make_parser, seed_everything

MARGIN = 0.2
P_CLASSES, K_PER_CLASS = 16, 4  # batch of 64


class PKSampler(Sampler):
    """Yields batches of P classes x K samples each (so every anchor has positives)."""

    def __init__(self, labels, p, k, seed):
        self.by_class = {}
        for i, c in enumerate(labels.tolist()):
            self.by_class.setdefault(c, []).append(i)
        self.p, self.k = p, k
        self.g = torch.Generator().manual_seed(seed)
        self.n_batches = len(labels) // (p * k)

    def __len__(self):
        return self.n_batches

    def __iter__(self):
        classes = list(self.by_class)
        for _ in range(self.n_batches):
            chosen = torch.randperm(len(classes), generator=self.g)[: self.p].tolist()
            batch = []
            for c in chosen:
                members = self.by_class[classes[c]]
                picks = torch.randperm(len(members), generator=self.g)[: self.k].tolist()
                batch.extend(members[j] for j in picks)
            yield batch


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(512, 256), nn.ReLU(inplace=True), nn.Linear(256, 128))

    def forward(self, x):
        return F.normalize(self.net(x), dim=1)


def batch_hard_loss_loop(emb, labels, margin=MARGIN):
    """Batch-hard triplet loss, written with Python loops (the slow way)."""
    labels = labels.tolist()
    n = len(labels)
    losses = []
    for i in range(n):
        positives, negatives = [], []
        for j in range(n):
            if j == i:
                continue
            d = torch.norm(emb[i] - emb[j])
            if labels[j] == labels[i]:
                positives.append(d)
            else:
                negatives.append(d)
        hardest_pos = max(positives)
        hardest_neg = min(negatives)
        losses.append(F.relu(hardest_pos - hardest_neg + margin))
    return torch.stack(losses).mean()


def batch_hard_loss(emb, labels, margin=MARGIN):
    """The same loss, vectorised."""
    d = torch.cdist(emb, emb)
    same = labels.unsqueeze(0) == labels.unsqueeze(1)
    eye = torch.eye(len(labels), dtype=torch.bool)
    hardest_pos = d.masked_fill(~same | eye, float("-inf")).amax(dim=1)
    hardest_neg = d.masked_fill(same, float("inf")).amin(dim=1)
    return F.relu(hardest_pos - hardest_neg + margin).mean()


def main():
    p = make_parser(__doc__, steps=40)
    p.add_argument("--check-loss", action="store_true", help="compare both losses on one batch first")
    args = p.parse_args()
    torch.set_num_threads(1)
    seed_everything(args.seed)

    g = torch.Generator().manual_seed(args.seed)
    n = 4096
    labels = torch.arange(n) % 64
    centers = torch.randn(64, 512, generator=g)
    features = centers[labels] + 0.8 * torch.randn(n, 512, generator=g)
    dataset = TensorDataset(features, labels)
    loader = DataLoader(dataset, batch_sampler=PKSampler(labels, P_CLASSES, K_PER_CLASS, args.seed))

    model = Encoder()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = batch_hard_loss_loop if args.variant == "faulty" else batch_hard_loss

    extra = {}
    if args.check_loss:
        xb, yb = next(iter(loader))
        with torch.no_grad():
            emb = model(xb)
            a, b = batch_hard_loss_loop(emb, yb), batch_hard_loss(emb, yb)
        extra["loss_abs_diff"] = abs(a.item() - b.item())

    meter = StepMeter()
    meter.start()
    step = 0
    while step < args.steps:
        for x, y in loader:
            meter.got_batch()
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            meter.step_done(x.shape[0])
            step += 1
            if step >= args.steps:
                break
    meter.print_result(scenario="c12_python_loop_loss", variant=args.variant, batch_size=64, **extra)


if __name__ == "__main__":
    main()
