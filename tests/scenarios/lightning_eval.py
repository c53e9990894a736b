"""Lightning: validation every few training steps holds the job.

Stages: a ``LightningModule`` (S-CNN, Adam, batch 32, in-memory data) trained for 60 steps with a
60-batch validation set and ``Trainer(val_check_interval=10, check_val_every_n_epoch=None)``:
Lightning runs the whole validation loop (``model.eval()``, ``validation_step``, accuracy logged
with ``self.log``) every 10 training steps. Progress bar, logger and checkpointing off.

- faulty: ``val_check_interval=10``.
- fixed:  ``val_check_interval=40, limit_val_batches=0.25`` (whyidle's printed fix: validate 4x
  less often, on a fixed quarter of the validation batches).

Timing: ``fw_meter.SteadyMeter`` from ``on_train_batch_start`` / ``on_train_batch_end``; a step's
time runs from one ``on_train_batch_end`` to the next, so the validation loops inside the training
loop are in it (what the job experiences).

Expected diagnosis (faulty): ``eval_bound``, cause ``too_often``, fix ``val_check_interval=40``
in Lightning's ``Trainer``. Fixed: no ``eval_bound`` warning.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import SCNN, make_parser, seed_everything
from fw_meter import SteadyMeter


class Classifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = SCNN()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        acc = (self.net(x).argmax(1) == y).float().mean()
        self.log("val_acc", acc)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


class StepTimer(L.Callback):
    def __init__(self, meter):
        self.meter = meter

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.meter.batch_start()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.meter.batch_end(batch[0].shape[0])


def main():
    args = make_parser(__doc__, steps=60).parse_args()
    torch.set_num_threads(1)
    seed_everything(args.seed)
    g = torch.Generator().manual_seed(args.seed)
    train = DataLoader(TensorDataset(torch.randn(2048, 3, 32, 32, generator=g),
                                     torch.randint(0, 10, (2048,), generator=g)), batch_size=32, shuffle=True)
    val = DataLoader(TensorDataset(torch.randn(1920, 3, 32, 32, generator=g),
                                   torch.randint(0, 10, (1920,), generator=g)), batch_size=32)
    meter = SteadyMeter(warmup=5)
    every = 40 if args.variant == "fixed" else 10
    subset = {"limit_val_batches": 0.25} if args.variant == "fixed" else {}
    trainer = L.Trainer(max_steps=args.steps, val_check_interval=every, check_val_every_n_epoch=None, **subset,
                        accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[StepTimer(meter)])
    meter.start()
    trainer.fit(Classifier(), train, val)
    meter.print_result(scenario="lightning_eval", variant=args.variant, val_check_interval=every, batch_size=32)


if __name__ == "__main__":
    main()
