"""C11: progress-bar / logging overhead on every step (cases.md C11).

Stages: a tabular regression MLP 16 -> 64 -> 64 -> 1 on 2,000 synthetic rows, batch 32
(62 steps per epoch with ``drop_last``), 15 epochs = 930 steps, Adam, gradient clipping. The
steps are tiny (~0.4 ms including the DataLoader fetch). A rich progress display (bar, M/N,
elapsed, ETA and a multi-column metrics field) renders to a log file (a forced-terminal rich
``Console``, so every refresh really draws and writes; non-TTY is fine). Per refresh the loop
reads 8 scalar metrics with ``.item()`` (loss, MAE, RMSE, R^2, grad norm, mean prediction, mean
target, max abs error) plus the LR, formats the status line, logs it (``console.log``), redraws
the bar and flushes the file (``update_progress``): ~2 ms against a ~0.45 ms step.

- faulty: ``update_progress`` (metric reads + redraw + flush) on every step.
- fixed:  the bar only advances every step (no redraw); metrics are read and the display redrawn
  and flushed every 50 steps.

Expected diagnosis (faulty): ``host_bound``, naming ``update_progress`` (c11_progress_logging.py)
and the rich rendering under it as the time between optimizer steps; forward + backward +
optimizer are a small part of the step. Fix: refresh every N steps (``refresh_rate``,
``log_every_n_steps``, ``mininterval``), lighter bar, log asynchronously.

Expected faulty -> fixed throughput ratio: ~4x; assert >= 2x. (The runs are short: ~2 s faulty,
~0.5 s fixed at the spec's 930 steps; pass ``--steps`` for longer ones.)
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from torch.utils.data import DataLoader, TensorDataset

from common import StepMeter, make_parser, seed_everything

STEPS_PER_EPOCH = 2000 // 32  # 62


def make_rows(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    w = torch.randn(16, 1, generator=g)
    y = torch.tanh(x @ w) + 0.1 * torch.randn(n, 1, generator=g)
    return x, y


def read_metrics(loss, pred, target, grad_norm, optimizer):
    err = pred.detach() - target
    ss_res = (err**2).sum()
    ss_tot = ((target - target.mean()) ** 2).sum()
    return {
        "loss": loss.item(),
        "mae": err.abs().mean().item(),
        "rmse": err.pow(2).mean().sqrt().item(),
        "r2": (1 - ss_res / ss_tot).item(),
        "gnorm": grad_norm.item(),
        "pred": pred.detach().mean().item(),
        "tgt": target.mean().item(),
        "maxerr": err.abs().max().item(),
        "lr": optimizer.param_groups[0]["lr"],
    }


def update_progress(progress, task, epoch, step, metrics, log_file):
    status = (
        f"loss {metrics['loss']:.4f} | mae {metrics['mae']:.4f} | rmse {metrics['rmse']:.4f} | "
        f"r2 {metrics['r2']:+.3f} | gnorm {metrics['gnorm']:.3f} | pred {metrics['pred']:+.3f} | "
        f"tgt {metrics['tgt']:+.3f} | maxerr {metrics['maxerr']:.3f} | lr {metrics['lr']:.2e}"
    )
    progress.console.log(f"step {step:5d} epoch {epoch:2d} " + status)
    progress.update(task, completed=step, epoch=epoch, metrics=status)
    progress.refresh()
    log_file.flush()


def main():
    p = make_parser(__doc__, steps=15 * STEPS_PER_EPOCH)
    p.add_argument("--refresh-every", type=int, default=None, help="override: redraw every N steps")
    args = p.parse_args()
    torch.set_num_threads(1)
    seed_everything(args.seed)
    refresh_every = args.refresh_every or (1 if args.variant == "faulty" else 50)

    x, y = make_rows(2000, args.seed)
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True, drop_last=True)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    with tempfile.TemporaryDirectory(prefix="c11_") as log_dir:
        log_file = open(os.path.join(log_dir, "train.log"), "w")
        console = Console(file=log_file, force_terminal=True, width=220)
        progress = Progress(
            TextColumn("epoch {task.fields[epoch]:>2}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[metrics]}"),
            console=console,
            auto_refresh=False,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        with progress:
            task = progress.add_task("train", total=args.steps, epoch=0, metrics="")
            meter = StepMeter()
            meter.start()
            step, epoch = 0, 0
            while step < args.steps:
                for xb, yb in loader:
                    meter.got_batch()
                    optimizer.zero_grad(set_to_none=True)
                    pred = model(xb)
                    loss = F.mse_loss(pred, yb)
                    loss.backward()
                    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
                    optimizer.step()
                    step += 1
                    if step % refresh_every == 0 or step == args.steps:
                        metrics = read_metrics(loss, pred, yb, grad_norm, optimizer)
                        update_progress(progress, task, epoch, step, metrics, log_file)
                    else:
                        progress.advance(task)
                    meter.step_done(xb.shape[0])
                    if step >= args.steps:
                        break
                epoch += 1
        log_file.close()
    meter.print_result(
        scenario="c11_progress_logging", variant=args.variant, refresh_every=refresh_every, batch_size=32
    )


if __name__ == "__main__":
    main()
