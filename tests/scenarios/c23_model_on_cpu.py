"""C23: the batches go to the device, the model never does (cases.md C23).

Stages: the usual device idiom ``device = "cuda" if torch.cuda.is_available() else "cpu"``, a
``DataLoader`` over in-memory random images, and every batch moved with ``.to(device)``. The
S-CNN sits inside a small library-style wrapper (``Learner``) whose ``forward`` moves its input
to wherever its parameters are and hands the output back on the input's device, the way a library
"silently moves inputs" (cases.md's pykan report): nothing fails, whatever the placement.

- faulty: the model is built and never moved: its parameters stay on the CPU. On a GPU machine
  the batches go to the GPU (VRAM in use), the wrapper copies them back, and the CPU does the
  compute while the GPU idles.
- fixed:  ``model.to(device)`` before the optimizer is built.

Sizes: batch 32 of 3x32x32, ``num_workers=0``, 60 steps (cases.md's GPU-box spec: the same
S-CNN, 60 steps). ``--device`` overrides the idiom's choice.

Expected diagnosis (faulty): on a CPU-only box ``wrong_device`` with ``evidence.kind ==
"model_not_moved"`` as a warning (the batches are moved with ``.to(device)``, the model never
is, and the script asks ``torch.cuda.is_available()``); on a GPU the critical ``wrong_device``
(all parameters on the CPU while CUDA is in use), which is the verdict. Fixed: no
``wrong_device``.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import SCNN, StepMeter, make_parser, seed_everything


class Learner(nn.Module):
    """A library's model wrapper: runs the network where its parameters are."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, x):
        where = next(self.net.parameters()).device
        return self.net(x.to(where)).to(x.device)


def main():
    p = make_parser(__doc__, steps=60, device=True)
    args = p.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device:
        device = args.device
    torch.set_num_threads(1)
    seed_everything(args.seed)

    g = torch.Generator().manual_seed(args.seed)
    images = torch.randn(2048, 3, 32, 32, generator=g)
    labels = torch.randint(0, 10, (2048,), generator=g)
    loader = DataLoader(TensorDataset(images, labels), batch_size=32, shuffle=True, drop_last=True)

    model = Learner(SCNN())
    if args.variant == "fixed":
        model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    meter = StepMeter()
    meter.start()
    step = 0
    while step < args.steps:
        for x, y in loader:
            meter.got_batch()
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            meter.step_done(x.shape[0])
            step += 1
            if step >= args.steps:
                break
    params = sorted({p.device.type for p in model.parameters()})
    meter.print_result(scenario="c23_model_on_cpu", variant=args.variant, device=device, param_devices=params,
                       batch_size=32, final_loss=round(loss.item(), 4))


if __name__ == "__main__":
    main()
