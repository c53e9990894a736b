"""Lightning: a per-class metric computed with Python loops in ``training_step``, every step.

Stages: a ``LightningModule`` around the S-MLP (512 -> 1024 -> 1024 -> 64 classes), SGD + momentum,
batch 64 from an in-memory ``TensorDataset`` of 4,096 synthetic feature vectors (class centres +
noise, so the model learns), ``num_workers=0``. ``Trainer(accelerator="cpu", max_steps=N,
enable_progress_bar=False, logger=False, enable_checkpointing=False)``. Every ``training_step`` computes per-class
precision / recall / F1 over the batch and ``self.log``s the macro F1, balanced accuracy and the
worst class's recall (``on_step=True``). A small ``HistoryLogger`` callback reads the loss
(``.item()``) and the LR in ``on_train_batch_end`` and appends a JSON line to a list (the same in
both variants, ~0.1 ms). After ``fit`` the script runs ``trainer.validate`` (256 rows) and
``torch.save``s the weights to a temporary file, printing a line after each. 60 steps.

- faulty: ``class_stats_loop``: confusion counts with nested Python loops over the 64 classes and
  the 64 samples, comparing 0-d tensors (``preds[i] == c``, ``bool()`` of the result), then
  Python arithmetic per class: 4,096 (class, sample) pairs, ~15,000 tiny tensor ops per step
  (~90 ms against a ~25 ms step with the vectorised metric, on the slow 2-core box).
- fixed:  ``class_stats``: the confusion matrix from one ``torch.bincount`` and the per-class
  rates as tensor ops (same values: ``--check-metric`` compares both on one batch).

Timing: a ``StepTimer`` callback (``on_train_batch_start`` / ``on_train_batch_end``, last in the
callback list so it includes the other callbacks' work) feeds ``fw_meter.SteadyMeter``; the first
5 steps are left out of the rates.

Expected diagnosis (faulty): ``host_bound``, naming ``class_stats_loop``
(lightning_metric_loop.py) called from ``training_step``: Python frames of the user's module,
many tiny ops per step, between forward and backward; the framework is Lightning, and the fix
should be Lightning-shaped (vectorise the metric, or ``torchmetrics`` / compute it every N steps
or in ``on_train_epoch_end``), not "raise num_workers". The ``HistoryLogger`` callback should
show up as a small share (~1 %), not as the cause.

Expected faulty -> fixed throughput ratio: ~4x (measured 3.97-4.79x over 5 repeats; see README).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import json
import tempfile

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import SMLP, make_parser
from fw_meter import SteadyMeter

NUM_CLASSES = 64
BATCH = 64
FEATURES = 512


def make_features(n, seed):
    g = torch.Generator().manual_seed(1234)  # same class centres for train and validation
    centers = torch.randn(NUM_CLASSES, FEATURES, generator=g)
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, NUM_CLASSES, (n,), generator=g)
    x = centers[y] + 2.0 * torch.randn(n, FEATURES, generator=g)
    return x, y


def class_stats_loop(preds, target, num_classes):
    """Per-class precision / recall / F1 from confusion counts, the Python way."""
    precision, recall, f1, support = [], [], [], []
    for c in range(num_classes):
        tp = fp = fn = 0
        for i in range(len(target)):
            p, t = preds[i], target[i]
            if p == c and t == c:
                tp += 1
            elif p == c:
                fp += 1
            elif t == c:
                fn += 1
        prec = tp / (tp + fp) if tp + fp > 0 else 0.0
        rec = tp / (tp + fn) if tp + fn > 0 else 0.0
        precision.append(prec)
        recall.append(rec)
        f1.append(2 * prec * rec / (prec + rec) if prec + rec > 0 else 0.0)
        support.append(tp + fn)
    present = [c for c in range(num_classes) if support[c] > 0]
    return {
        "macro_f1": sum(f1[c] for c in present) / len(present),
        "balanced_acc": sum(recall[c] for c in present) / len(present),
        "worst_recall": min(recall[c] for c in present),
    }


def class_stats(preds, target, num_classes):
    """The same statistics, vectorised (tensors in, 0-d tensors out)."""
    conf = torch.bincount(target * num_classes + preds, minlength=num_classes * num_classes)
    conf = conf.reshape(num_classes, num_classes).float()  # rows: target, columns: prediction
    tp = conf.diagonal()
    support = conf.sum(1)
    predicted = conf.sum(0)
    precision = torch.where(predicted > 0, tp / predicted.clamp(min=1), torch.zeros_like(tp))
    recall = torch.where(support > 0, tp / support.clamp(min=1), torch.zeros_like(tp))
    denom = precision + recall
    f1 = torch.where(denom > 0, 2 * precision * recall / denom.clamp(min=1e-12), torch.zeros_like(tp))
    present = support > 0
    return {
        "macro_f1": f1[present].mean(),
        "balanced_acc": recall[present].mean(),
        "worst_recall": recall[present].min(),
    }


class LitClassifier(L.LightningModule):
    def __init__(self, vectorized_metric: bool, lr: float = 0.02):
        super().__init__()
        self.save_hyperparameters()
        self.model = SMLP(FEATURES, num_classes=NUM_CLASSES)
        self.stats = class_stats if vectorized_metric else class_stats_loop

    def forward(self, x):
        return self.model(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        stats = self.stats(logits.argmax(dim=1), y, NUM_CLASSES)
        self.log("train/loss", loss, on_step=True, on_epoch=False)
        for name, value in stats.items():
            self.log(f"train/{name}", value, on_step=True, on_epoch=False, batch_size=len(y))
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        stats = self.stats(logits.argmax(dim=1), y, NUM_CLASSES)
        self.log("val/loss", F.cross_entropy(logits, y), batch_size=len(y))
        self.log("val/macro_f1", stats["macro_f1"], batch_size=len(y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


class HistoryLogger(L.Callback):
    """Keeps a JSON line per step (loss, LR, step) for a later plot."""

    def __init__(self):
        self.lines = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        record = {
            "step": trainer.global_step,
            "epoch": trainer.current_epoch,
            "loss": round(outputs["loss"].item(), 5),
            "lr": trainer.optimizers[0].param_groups[0]["lr"],
        }
        self.lines.append(json.dumps(record))


class StepTimer(L.Callback):
    def __init__(self, meter):
        self.meter = meter

    def on_train_start(self, trainer, pl_module):
        self.meter.start()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.meter.batch_start()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.meter.batch_end(len(batch[0]))


def main():
    p = make_parser(__doc__, steps=60)
    p.add_argument("--check-metric", action="store_true", help="compare both metric functions on one batch")
    args = p.parse_args()
    torch.set_num_threads(1)
    L.seed_everything(args.seed, verbose=False)

    x, y = make_features(4096, args.seed)
    xv, yv = make_features(256, args.seed + 1)
    train_loader = DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True, drop_last=True)
    val_loader = DataLoader(TensorDataset(xv, yv), batch_size=64)

    extra = {}
    if args.check_metric:
        preds = torch.randint(0, NUM_CLASSES, (BATCH,))
        a = class_stats_loop(preds, y[:BATCH], NUM_CLASSES)
        b = class_stats(preds, y[:BATCH], NUM_CLASSES)
        extra["metric_abs_diff"] = max(abs(a[k] - float(b[k])) for k in a)

    model = LitClassifier(vectorized_metric=args.variant == "fixed")
    meter = SteadyMeter(warmup=5)
    history = HistoryLogger()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=args.steps,
        enable_progress_bar=False,
        logger=False,
        enable_checkpointing=False,
        callbacks=[history, StepTimer(meter)],
    )
    trainer.fit(model, train_dataloaders=train_loader)
    print(f"fit done: {trainer.global_step} steps, history {len(history.lines)} lines", flush=True)

    val = trainer.validate(model, dataloaders=val_loader, verbose=False)[0]
    print("validate done: " + json.dumps({k: round(float(v), 4) for k, v in val.items()}), flush=True)

    with tempfile.TemporaryDirectory(prefix="lit_metric_") as d:
        path = os.path.join(d, "model.pt")
        torch.save(model.state_dict(), path)
        print(f"saved weights: {os.path.getsize(path)} bytes", flush=True)

    meter.print_result(
        scenario="lightning_metric_loop", variant=args.variant, batch_size=BATCH, num_classes=NUM_CLASSES, **extra
    )


if __name__ == "__main__":
    main()
