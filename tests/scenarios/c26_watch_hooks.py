"""C26: experiment-tracker hooks on the model log histograms every few steps (``wandb.watch`` with a
small ``log_freq``).

Stages: an MLP of 1.6 M parameters (S-MLP, 512 -> 1024 -> 1024 -> 10) trained on in-memory data
(``num_workers=0``, batch 32, one intra-op thread), watched by ``watch(model, log_freq)``: a
stand-in for ``wandb.watch(model, log="all", log_freq=...)`` without the network or an account,
built the way wandb builds it (wandb/integration/torch/wandb_torch.py): a forward hook on the
model that, every ``log_freq`` calls, reads every parameter, and a gradient hook on every
parameter (``Tensor.register_hook``) that, every ``log_freq`` calls, reads the gradient; each read
copies the tensor to NumPy, bins it into a 64-bin histogram and appends it to a JSON-lines file.
The hooks live in this file, as a tracker's live in its package: the training loop itself is
plain.

- faulty: ``log_freq=1`` (histograms of all weights and gradients every step).
- fixed:  ``log_freq=100`` (wandb's default is 1000; transformers' integration enforces >= 100).

Expected diagnosis (faulty): the hooks hold the step (gradient hooks run inside ``backward``,
the parameter hook after ``forward``): the finding names the hooks, where they were registered
and what they cost per step, and the fix is a larger ``log_freq``. Data wait is small. Expected
faulty -> fixed ratio: ~2-4x (cases.md C26: >= 1.5x).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import json
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import SMLP, StepMeter, make_parser, seed_everything


class Watcher:
    """Histogram logging through hooks, every ``log_freq`` calls of each hook."""

    def __init__(self, log_file, log_freq: int):
        self.log_file = log_file
        self.log_freq = log_freq
        self.calls: dict[str, int] = {}

    def due(self, name: str) -> bool:
        n = self.calls.get(name, 0)
        self.calls[name] = n + 1
        return n % self.log_freq == 0

    def log_histogram(self, name: str, tensor: torch.Tensor) -> None:
        values = tensor.detach().cpu().numpy().ravel()
        counts, edges = np.histogram(values, bins=64)
        self.log_file.write(json.dumps({"name": name, "counts": counts.tolist(),
                                        "min": float(edges[0]), "max": float(edges[-1])}) + "\n")


def watch(model: torch.nn.Module, log_file, log_freq: int) -> Watcher:
    """Registers the parameter and gradient hooks (what ``wandb.watch(model, log="all")`` does)."""
    watcher = Watcher(log_file, log_freq)

    def parameter_hook(module, inputs, outputs):
        if watcher.due("parameters"):
            for name, p in module.named_parameters():
                watcher.log_histogram("parameters/" + name, p)

    model.register_forward_hook(parameter_hook)
    for name, p in model.named_parameters():
        def gradient_hook(grad, name=name):
            if watcher.due("gradients/" + name):
                watcher.log_histogram("gradients/" + name, grad)
        p.register_hook(gradient_hook)
    return watcher


def main():
    args = make_parser(__doc__, steps=150).parse_args()
    torch.set_num_threads(1)
    seed_everything(args.seed)
    log_freq = 1 if args.variant == "faulty" else 100

    g = torch.Generator().manual_seed(args.seed)
    inputs = torch.randn(4096, 512, generator=g)
    labels = torch.randint(0, 10, (4096,), generator=g)
    loader = DataLoader(TensorDataset(inputs, labels), batch_size=32, shuffle=True, drop_last=True)
    model = SMLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    with tempfile.TemporaryDirectory(prefix="c26_watch_") as log_dir:
        with open(os.path.join(log_dir, "histograms.jsonl"), "w") as log_file:
            watch(model, log_file, log_freq)
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
    meter.print_result(scenario="c26_watch_hooks", variant=args.variant, log_freq=log_freq, batch_size=32)


if __name__ == "__main__":
    main()
