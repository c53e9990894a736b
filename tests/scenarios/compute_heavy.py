"""Healthy, compute-bound training: nothing upstream of the model limits it.

Stages: the data is fully in memory (pre-generated float tensors in a ``TensorDataset``,
``DataLoader(num_workers=0)``: fetching a batch is a few tensor index/stack ops, ~0.3 ms), and the
model is a VGG-style CNN (6 conv3x3 + BatchNorm + ReLU layers, 32 -> 64 -> 128 channels, batch
32) whose forward + backward + optimizer step take ~60 ms per step on the 2-core dev box with
``torch.set_num_threads(1)``. Forward + backward + optimizer are >= 95 % of the step; data wait
is ~1 %.

Only one variant (it is the control case; there is no ``--variant``).

Expected diagnosis: ``device_bound`` (on CPU: the compute itself is the bottleneck; nothing to fix
upstream; the way to go faster is a faster device / less compute per sample).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import StepMeter, make_parser, seed_everything


def conv_bn_relu(cin, cout):
    return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]


class VGGSmall(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.features = nn.Sequential(
            *conv_bn_relu(3, 32),
            *conv_bn_relu(32, 32),
            nn.MaxPool2d(2),
            *conv_bn_relu(32, 64),
            *conv_bn_relu(64, 64),
            nn.MaxPool2d(2),
            *conv_bn_relu(64, 128),
            *conv_bn_relu(128, 128),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.classifier = nn.Linear(128, num_classes)

    def forward(self, x):
        return self.classifier(self.features(x))


def main():
    args = make_parser(__doc__, steps=80, variants=False).parse_args()
    torch.set_num_threads(1)
    seed_everything(args.seed)

    g = torch.Generator().manual_seed(args.seed)
    images = torch.randn(2048, 3, 32, 32, generator=g)
    labels = torch.randint(0, 10, (2048,), generator=g)
    loader = DataLoader(TensorDataset(images, labels), batch_size=32, shuffle=True, drop_last=True, num_workers=0)

    model = VGGSmall()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)

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
    meter.print_result(scenario="compute_heavy", variant="healthy", batch_size=32)


if __name__ == "__main__":
    main()
