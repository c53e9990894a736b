"""bfloat16 autocast on a CPU without native bfloat16: a small CNN trained on the CPU under
``torch.autocast("cpu", dtype=torch.bfloat16)``, as a user would write it to "go faster".

Stages: in-memory 32×32 images (``TensorDataset``), two 3×3 convolutions + pooling + linear head,
SGD, batch 16, default torch threads. On a CPU without AVX512-BF16 or AMX (this box: an AVX2
EPYC) PyTorch runs the bfloat16 convolutions and matmuls through a slow fallback, so autocast makes
the step about ten times slower; on a CPU with native bfloat16 it is the speed-up it was meant to be.

- faulty: autocast to bfloat16 (default)
- fixed: float32 (``--fixed``): the autocast block removed.

Expected diagnosis (faulty, on a CPU without native bfloat16): ``emulated_precision`` as the
verdict, fix: float32 on this CPU. With native bfloat16 (``/proc/cpuinfo`` ``avx512_bf16`` /
``amx_bf16``) the premise does not hold: no ``emulated_precision`` warning or critical (measured
on a 2-core EPYC with AVX512-BF16, PyTorch 2.13: bfloat16 3,176 samples/s, float32 1,761, i.e.
float32 would be 0.55×; issue 32).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import StepMeter, make_parser, seed_everything


def main():
    args = make_parser(__doc__, steps=60).parse_args()
    seed_everything(args.seed)
    g = torch.Generator().manual_seed(args.seed)
    images = torch.randn(2048, 3, 32, 32, generator=g)
    labels = torch.randint(0, 10, (2048,), generator=g)
    loader = DataLoader(TensorDataset(images, labels), batch_size=16, shuffle=True, drop_last=True)
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    bf16 = args.variant == "faulty"
    meter = StepMeter()
    meter.start()
    step = 0
    while step < args.steps:
        for x, y in loader:
            meter.got_batch()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            meter.step_done(x.shape[0])
            step += 1
            if step >= args.steps:
                break
    meter.print_result(scenario="emulated_bf16", variant=args.variant, batch_size=16)


if __name__ == "__main__":
    main()
