"""C36: model-side preprocessing (resize, normalise, tokenization) run inside ``forward`` (cases.md C36).

Stages: 4,096 raw samples in memory, each a 3x96x96 uint8 image and a 10-word caption (C07's
synthetic words); a small vision-language classifier: S-CNN features of the 3x32x32 image plus an
``EmbeddingBag`` of the caption's token ids (C07's pure-Python WordPiece tokenizer, truncated to 32
ids), a 10-way head; SGD, batch 32, ``DataLoader(num_workers=2)``, ``torch.set_num_threads(1)``
(one core stands for the accelerator, the other is the workers').

- faulty: the dataset returns raw samples; ``VisionLanguageModel.forward`` preprocesses them per
  sample in the main process (``F.interpolate`` to 32x32, normalise, tokenize) before its first
  layer, serial with the model, while the two workers only index memory.
- fixed:  the same preprocessing in the DataLoader's ``collate_fn`` (``Preprocess``), so the
  workers do it while the main process trains on the previous batch; ``forward`` gets tensors.

Expected diagnosis (faulty): ``host_bound`` kind ``preprocess_in_forward``: the model's forward
spends its first part before its first layer (module hooks), in the tokenizer's frames (stack
samples), not in the model. Fix: move it into the collate / dataset (the workers).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from c07_tokenize_on_the_fly import WordPieceTokenizer, build_vocab, make_word_list
from common import SCNN, StepMeter, make_parser, seed_everything

SAMPLES = 4096
CAPTION_WORDS = 10
IDS = 32
MEAN = torch.tensor([0.48, 0.46, 0.41]).view(3, 1, 1)
STD = torch.tensor([0.27, 0.26, 0.28]).view(3, 1, 1)


def make_samples(seed: int):
    rng = np.random.default_rng(seed)
    words = make_word_list()
    images = torch.from_numpy(rng.integers(0, 256, (SAMPLES, 3, 96, 96), dtype=np.uint8))
    captions = [" ".join(words[i] for i in rng.integers(0, len(words), CAPTION_WORDS)) for _ in range(SAMPLES)]
    labels = torch.from_numpy(rng.integers(0, 10, SAMPLES)).long()
    return images, captions, labels, WordPieceTokenizer(build_vocab(words), max_len=IDS)


class RawSamples(Dataset):
    def __init__(self, images, captions, labels):
        self.images, self.captions, self.labels = images, captions, labels

    def __len__(self):
        return len(self.captions)

    def __getitem__(self, i):
        return self.images[i], self.captions[i], self.labels[i]


def preprocess(image, caption, tokenizer):
    """One raw sample -> (3x32x32 float image, IDS token ids)."""
    x = F.interpolate(image.unsqueeze(0).float() / 255.0, size=(32, 32), mode="bilinear", align_corners=False)[0]
    return (x - MEAN) / STD, torch.tensor(tokenizer.encode(caption), dtype=torch.long)


class Preprocess:
    """The fixed variant's collate: the same per-sample preprocessing, in the workers."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, samples):
        done = [preprocess(img, cap, self.tokenizer) for img, cap, _ in samples]
        return (torch.stack([x for x, _ in done]), torch.stack([ids for _, ids in done]),
                torch.stack([y for _, _, y in samples]))


class VisionLanguageModel(nn.Module):
    def __init__(self, vocab_rows, tokenizer=None):
        super().__init__()
        self.tokenizer = tokenizer  # faulty: preprocessing inside forward
        self.image = SCNN(num_classes=64)
        self.text = nn.EmbeddingBag(vocab_rows, 64, mode="mean")
        self.head = nn.Linear(128, 10)

    def forward(self, images, captions):
        if self.tokenizer is not None:  # raw uint8 images and caption strings
            done = [preprocess(img, cap, self.tokenizer) for img, cap in zip(images, captions)]
            images = torch.stack([x for x, _ in done])
            captions = torch.stack([ids for _, ids in done])
        return self.head(torch.cat([self.image(images), self.text(captions)], dim=1))


def main():
    args = make_parser(__doc__, steps=80).parse_args()
    seed_everything(args.seed)
    torch.set_num_threads(1)
    images, captions, labels, tokenizer = make_samples(args.seed)
    fixed = args.variant == "fixed"
    loader = DataLoader(RawSamples(images, captions, labels), batch_size=32, shuffle=True, num_workers=2,
                        collate_fn=Preprocess(tokenizer) if fixed else None, persistent_workers=True)
    model = VisionLanguageModel(len(tokenizer.vocab), None if fixed else tokenizer)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    meter = StepMeter()
    meter.start()
    step = 0
    while step < args.steps:
        for batch in loader:
            meter.got_batch()
            x, text, y = batch
            loss = F.cross_entropy(model(x, text), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            meter.step_done(len(y))
            if step >= args.steps:
                break
    meter.print_result(scenario="c36_preprocess_in_forward", variant=args.variant)


if __name__ == "__main__":
    main()
