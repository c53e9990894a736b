"""Time outside the training step: evaluation, checkpoints and epoch boundaries that hold the job.

A plain PyTorch loop (S-CNN, batch 32, in-memory data) written the way tutorials write it, with
one of these kinds of fault (``--kind``):

- ``eval``: a full validation pass (``model.eval()``, ``torch.no_grad()``, 60 batches, accuracy)
  every 10 training steps. fixed: every 40 steps (whyidle's fix: evaluate 4x less often).
  ``--no-eval-mode``: the same pass under ``torch.no_grad()`` alone (S-CNN has no dropout or
  batch norm, so the results are the same), as some custom loops evaluate.
- ``eval_metric``: validation (20 batches) every 20 steps whose metric, per-class precision/recall
  counts at 2,000 thresholds, is a per-sample, per-class, per-threshold Python loop over
  ``.tolist()`` outputs. fixed: the same counts with one tensor comparison (vectorized).
- ``checkpoint``: ``torch.save`` of a wider model (4.2 M parameters) and its SGD momentum state
  every 5 steps.
  fixed: the weights only, every 50 steps.
- ``epoch``: 8-batch epochs from a DataLoader with 2 ``spawn``-started workers, not persistent:
  every epoch starts them again. fixed: ``persistent_workers=True``.
- ``logging``: TensorBoard ``SummaryWriter``: the loss and a histogram of every parameter and its
  gradient every step (what ``wandb.watch(log="all", log_freq=1)`` does). fixed: every 50 steps.
  Needs ``tensorboard`` (importing it imports TensorFlow when installed: seconds of start-up).
- ``healthy``: a compute-heavy step, one short validation and one checkpoint at the end (no
  variant): whyidle must not warn about either.

Expected diagnosis (faulty): ``eval_bound`` (cause ``too_often`` / ``host_work``),
``checkpoint_bound``, ``epoch_boundary``, ``logging_bound``; healthy: none of them. The RESULT line's
``samples_per_s`` is over the whole training loop (evaluation and saves included), as the job
experiences it. Ratios: tests/scenarios/README.md.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset

from common import SCNN, StepMeter, make_parser, seed_everything


class Images(Dataset):
    """Synthetic 3x32x32 images made per index (a map-style dataset the workers can pickle)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(3, 32, 32, generator=g), i % 10


def wide_model():
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                         nn.Linear(1024, 10))


THRESHOLDS = [i / 2000 for i in range(2000)]


def pr_curve_loop(logits, y, num_classes=10):
    """Per-class precision/recall counts at 2,000 score thresholds, one sample, class and threshold at a
    time in Python (the faulty metric): returns (true positives, positives) summed over thresholds."""
    probs, ys = logits.softmax(1).tolist(), y.tolist()
    tp, pos = [0] * num_classes, [0] * num_classes
    for row, t in zip(probs, ys):
        for c in range(num_classes):
            for th in THRESHOLDS:
                if row[c] >= th:
                    pos[c] += 1
                    if c == t:
                        tp[c] += 1
    return tp, pos


def pr_curve_vectorized(logits, y, num_classes=10):
    """The same counts with tensor ops: one comparison against all thresholds at once."""
    probs = logits.softmax(1)
    above = probs.unsqueeze(-1) >= torch.tensor(THRESHOLDS)  # [batch, classes, thresholds]
    hit = F.one_hot(y, num_classes).bool().unsqueeze(-1)
    return (above & hit).sum((0, 2)).tolist(), above.sum((0, 2)).tolist()


def evaluate(model, loader, metric, eval_mode=True):
    if eval_mode:
        model.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in loader:
            c, t = metric(model(x), y)
            correct += sum(c)
            total += sum(t)
    if eval_mode:
        model.train()
    return correct / max(1, total)


def main():
    p = make_parser(__doc__, steps=60)
    p.add_argument("--kind", choices=("eval", "eval_metric", "checkpoint", "epoch", "logging", "healthy"),
                   default="eval")
    p.add_argument("--no-eval-mode", action="store_true",
                   help="evaluate under torch.no_grad() only, without model.eval() / model.train()")
    args = p.parse_args()
    torch.set_num_threads(1)
    seed_everything(args.seed)
    fixed = args.variant == "fixed"
    kind = args.kind

    g = torch.Generator().manual_seed(args.seed)
    if kind == "epoch":
        train = DataLoader(Images(256), batch_size=32, shuffle=True, num_workers=2,
                           multiprocessing_context="spawn", persistent_workers=fixed)
    else:
        train = DataLoader(TensorDataset(torch.randn(2048, 3, 32, 32, generator=g),
                                         torch.randint(0, 10, (2048,), generator=g)),
                           batch_size=32, shuffle=True, drop_last=True)
    val_batches = {"eval": 60, "eval_metric": 20, "healthy": 10}.get(kind, 0)
    val = DataLoader(TensorDataset(torch.randn(32 * max(1, val_batches), 3, 32, 32, generator=g),
                                   torch.randint(0, 10, (32 * max(1, val_batches),), generator=g)), batch_size=32)
    eval_every = {"eval": 40 if fixed else 10, "eval_metric": 20}.get(kind)
    metric = pr_curve_vectorized if (kind != "eval_metric" or fixed) else pr_curve_loop
    save_every = (50 if fixed else 5) if kind == "checkpoint" else None
    log_every = (50 if fixed else 1) if kind == "logging" else None

    if kind == "checkpoint":
        model = wide_model()
    elif kind == "healthy":
        model = nn.Sequential(SCNN(), nn.Linear(10, 512), nn.ReLU(), nn.Linear(512, 10))
        model[0].features[0] = nn.Conv2d(3, 16, 5, padding=2)
    else:
        model = SCNN()
    optimizer = (torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9) if kind == "checkpoint"
                 else torch.optim.Adam(model.parameters(), lr=1e-3))

    with tempfile.TemporaryDirectory(prefix="job_parts_") as out:
        writer = None
        if log_every:
            from torch.utils.tensorboard import SummaryWriter

            writer = SummaryWriter(os.path.join(out, "tb"))
        meter = StepMeter()
        meter.start()
        step = 0
        while step < args.steps:
            for x, y in train:
                meter.got_batch()
                optimizer.zero_grad(set_to_none=True)
                loss = F.cross_entropy(model(x), y)
                if kind == "healthy":
                    for _ in range(3):  # a heavier step: more compute per batch
                        loss = loss + F.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
                step += 1
                if eval_every and step % eval_every == 0:
                    evaluate(model, val, metric, eval_mode=not args.no_eval_mode)
                if log_every and step % log_every == 0:
                    writer.add_scalar("loss", loss.item(), step)
                    for name, param in model.named_parameters():
                        writer.add_histogram(name, param, step)
                        writer.add_histogram(name + ".grad", param.grad, step)
                if save_every and step % save_every == 0:
                    state = model.state_dict() if fixed else {
                        "model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
                    torch.save(state, os.path.join(out, "last.pt"))
                meter.step_done(x.shape[0])
                if step >= args.steps:
                    break
        if writer is not None:
            writer.close()
        if kind == "healthy":  # one short validation and one checkpoint at the end
            evaluate(model, val, metric)
            torch.save(model.state_dict(), os.path.join(out, "final.pt"))
    meter.print_result(scenario="job_parts", variant=args.variant, kind=kind, batch_size=32)


if __name__ == "__main__":
    main()
