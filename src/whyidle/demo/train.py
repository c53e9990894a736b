"""The demo's training script, written the way a beginner writes it.

A plain PyTorch program that knows nothing about whyidle (whyidle observes it unchanged): an
image-folder Dataset that opens each JPEG with Pillow, decodes it and augments it per sample
(random resized crop, flip, brightness/contrast jitter), a small CNN, SGD, and the accuracy on
held-out images at the end (reported with ``whyidle.log_metric`` when whyidle is installed, for
``whyidle compare``). The DataLoader options come from the command line so the demo can run it
first as written (``--workers 0``) and then with the fix that whyidle recommends.

    python -m whyidle.demo.train --data DIR --workers 0 --steps 60
"""

from __future__ import annotations

import argparse
import os
import random

import numpy as np
import torch
from PIL import Image, ImageEnhance
from torch import nn
from torch.utils.data import DataLoader, Dataset

try:  # whyidle.log_metric records a metric for `whyidle compare`; without whyidle it does nothing
    from whyidle import log_metric
except ImportError:
    def log_metric(name, value, step=None, n=None):
        return False

SIZE = 64
#: Every VAL_EVERY-th image (by file name) is held out for validation.
VAL_EVERY = 5


def image_files(root: str) -> tuple[list[str], list[tuple[str, int]]]:
    """Classes (sub-folder names) and ``(path, class index)`` of every JPEG under ``root``."""
    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    files = [(os.path.join(root, c, f), i) for i, c in enumerate(classes)
             for f in sorted(os.listdir(os.path.join(root, c))) if f.endswith(".jpg")]
    return classes, files


def to_tensor(image) -> torch.Tensor:
    array = np.asarray(image, dtype=np.float32) / 255.0
    array = (array - 0.5) / 0.25
    return torch.from_numpy(array.transpose(2, 0, 1).copy())


class ImageFolderDataset(Dataset):
    """``(path, class)`` list → (float tensor 3×64×64, class index), decoded and augmented per sample."""

    def __init__(self, files: list[tuple[str, int]]) -> None:
        self.files = files

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int):
        path, label = self.files[index]
        image = Image.open(path).convert("RGB")
        image = random_resized_crop(image, SIZE)
        if random.random() < 0.5:
            image = image.transpose(Image.FLIP_LEFT_RIGHT)
        image = ImageEnhance.Brightness(image).enhance(random.uniform(0.7, 1.3))
        image = ImageEnhance.Contrast(image).enhance(random.uniform(0.7, 1.3))
        return to_tensor(image), label


def random_resized_crop(image, size: int):
    """Crop 30–100 % of the area at a random place, resize to size×size (as torchvision does)."""
    width, height = image.size
    scale = random.uniform(0.3, 1.0)
    side = int((width * height * scale) ** 0.5)
    side = min(side, width, height)
    left = random.randint(0, width - side)
    top = random.randint(0, height - side)
    return image.resize((size, size), Image.BILINEAR, box=(left, top, left + side, top + side))


@torch.no_grad()
def validate(model: nn.Module, files: list[tuple[str, int]], device, batch: int = 64) -> float:
    """Accuracy (fraction) on the held-out images, resized whole (no augmentation)."""
    model.eval()
    correct = 0
    for start in range(0, len(files), batch):
        chunk = files[start:start + batch]
        images = torch.stack([to_tensor(Image.open(p).convert("RGB").resize((SIZE, SIZE), Image.BILINEAR))
                              for p, _ in chunk]).to(device)
        labels = torch.tensor([label for _, label in chunk], device=device)
        correct += int((model(images).argmax(1) == labels).sum())
    model.train()
    return correct / len(files)


def make_model(classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, classes),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--prefetch-factor", type=int, default=None)
    parser.add_argument("--persistent-workers", action="store_true")
    parser.add_argument("--pin-memory", action="store_true")
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu":
        # Without a GPU the model gets one core, standing in for the accelerator, and the other
        # cores are left to data loading, as on a GPU machine.
        torch.set_num_threads(1)
    torch.manual_seed(0)
    random.seed(0)
    classes, files = image_files(args.data)
    val_files = files[::VAL_EVERY]
    dataset = ImageFolderDataset([f for i, f in enumerate(files) if i % VAL_EVERY])
    loader_args = {"batch_size": args.batch_size, "shuffle": True, "num_workers": args.workers,
                   "pin_memory": args.pin_memory}
    if args.workers > 0:
        loader_args["persistent_workers"] = args.persistent_workers
        loader_args["prefetch_factor"] = args.prefetch_factor or 2
    loader = DataLoader(dataset, **loader_args)
    model = make_model(len(classes)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    step = 0
    correct = seen = 0
    while step < args.steps:
        for images, labels in loader:
            images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            logits = model(images)
            loss = loss_fn(logits, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            correct += (logits.argmax(1) == labels).sum().item()
            seen += labels.numel()
            step += 1
            if step % 20 == 0:
                print(f"step {step}: loss {loss.item():.3f}, train accuracy {correct / seen:.1%}", flush=True)
                correct = seen = 0
            if step >= args.steps:
                break
    accuracy = validate(model, val_files, device)
    print(f"validation accuracy {accuracy:.1%} ({len(val_files)} held-out images)", flush=True)
    log_metric("val_accuracy", accuracy, step, n=len(val_files))


if __name__ == "__main__":
    main()
