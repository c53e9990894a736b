"""Lightning: CPU-heavy per-sample decoding in the ``LightningDataModule``'s main-process loader.

Stages: keyword-spotting-style audio classification. A ``LightningDataModule`` holds 1,024
synthetic clips (12 classes: class-dependent tone pairs + noise, 16,640 samples at 16 kHz,
stored mu-law encoded as uint8). Its ``Dataset.__getitem__`` decodes each clip on the fly with
numpy: mu-law expansion, pre-emphasis, framing (64 frames of 512, hop 256), Hann window, ``rfft``,
power spectrum, 64-band mel filterbank, log, per-band normalisation and a SpecAugment-style
frequency/time mask -> a 1x64x64 log-mel image (~0.7 ms of CPU per clip on the slow 2-core box,
about one compute step per batch of 32).
The ``LightningModule`` is a small CNN (conv 1->16 stride 2, 16->32, 32->96, global pool,
linear to 12), AdamW, batch 32, ``Trainer(max_steps=N, enable_progress_bar=False, logger=False,
enable_checkpointing=False)``, 80 steps (~2.5 epochs).

- faulty: ``DataLoader(num_workers=0)``: the trainer's main process decodes every batch itself,
  then trains on it; nothing overlaps.
- fixed:  ``DataLoader(num_workers=1, persistent_workers=True, prefetch_factor=4)``: one worker
  decodes the next batches on the other core while the main process trains (the box has 2 cores,
  so 1 worker is the right number; more would only compete with the training process).

Timing: a ``StepTimer`` callback (``on_train_batch_start`` / ``on_train_batch_end``) feeds
``fw_meter.SteadyMeter``; the first 5 steps (worker start-up) are left out of the rates.

Expected diagnosis (faulty): ``input_bound``, cause ``loader_in_main_process`` (the Lightning
fetch, ``_DataFetcher`` -> ``DataLoader.__next__`` -> ``MelClips.__getitem__`` / ``decode``,
CPU-busy, not sleeping); the hot spot is numpy inside ``decode``. The fix should be in Lightning
terms: ``num_workers`` / ``persistent_workers`` in the DataModule's ``train_dataloader``.
Fixed: compute-bound (data wait small), or close to it.

Expected faulty -> fixed throughput ratio: at most 2x on 2 cores (all the work is CPU work); the
decode cost is set about equal to the compute step so the ratio can come near that ceiling.
Measured: median 1.59x, 1.16-1.87x over 5 quiet repeats, ~0.7-1.1x while other jobs load the box
(the fix needs the second core; see README); the data-wait share (faulty ~0.48, fixed ~0.15) is
the robust signal.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# one BLAS thread per process (set before numpy loads): the trainer and the loader share 2 cores,
# and a 2-thread OpenBLAS pool in ``decode``'s small matmul stalls whenever the other core is busy
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import lightning as L
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from common import make_parser
from fw_meter import SteadyMeter

SR = 16000
N_FFT, HOP, N_MELS, N_FRAMES = 512, 256, 64, 64
CLIP = N_FFT + HOP * (N_FRAMES - 1)  # 16,640 samples -> exactly 64 frames
NUM_CLASSES = 12
BATCH = 32
MU = 255.0


def mel_filterbank(sr, n_fft, n_mels):
    freqs = np.linspace(0, sr / 2, n_fft // 2 + 1)
    mel = 2595.0 * np.log10(1.0 + freqs / 700.0)
    pts = np.linspace(mel[0], mel[-1], n_mels + 2)
    fb = np.zeros((n_mels, len(freqs)), np.float32)
    for m in range(n_mels):
        lo, c, hi = pts[m], pts[m + 1], pts[m + 2]
        fb[m] = np.clip(np.minimum((mel - lo) / (c - lo), (hi - mel) / (hi - c)), 0.0, None)
    return fb


MEL_FB = mel_filterbank(SR, N_FFT, N_MELS)
WINDOW = np.hanning(N_FFT).astype(np.float32)


def mulaw_encode(x):
    y = np.sign(x) * np.log1p(MU * np.abs(x)) / np.log1p(MU)
    return np.clip((y + 1.0) * 127.5, 0, 255).astype(np.uint8)


def decode(ulaw):
    """uint8 mu-law clip -> 64x64 log-mel spectrogram (float32)."""
    y = ulaw.astype(np.float32) / 127.5 - 1.0
    x = np.sign(y) * ((1.0 + MU) ** np.abs(y) - 1.0) / MU  # mu-law expansion
    x = np.append(x[0], x[1:] - 0.97 * x[:-1])  # pre-emphasis
    frames = np.lib.stride_tricks.sliding_window_view(x, N_FFT)[::HOP][:N_FRAMES] * WINDOW
    power = np.abs(np.fft.rfft(frames, axis=1)) ** 2
    mel = np.log(power @ MEL_FB.T + 1e-6)  # frames x mels
    return ((mel - mel.mean(0)) / (mel.std(0) + 1e-5)).T  # mels x frames


def spec_augment(mel, rng):
    f0 = rng.integers(0, N_MELS - 8)
    t0 = rng.integers(0, N_FRAMES - 8)
    mel = mel.copy()
    mel[f0 : f0 + rng.integers(1, 8), :] = 0.0
    mel[:, t0 : t0 + rng.integers(1, 8)] = 0.0
    return mel


class MelClips(Dataset):
    def __init__(self, clips, labels, seed):
        self.clips, self.labels, self.seed = clips, labels, seed
        self.epoch = 0

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        rng = np.random.default_rng((self.seed, i, self.epoch))
        mel = spec_augment(decode(self.clips[i]), rng)
        return torch.from_numpy(mel[None].astype(np.float32)), int(self.labels[i])


class AudioDataModule(L.LightningDataModule):
    def __init__(self, n_clips=1024, batch_size=BATCH, num_workers=0, persistent_workers=False,
                 prefetch_factor=None, seed=0):
        super().__init__()
        self.n_clips, self.batch_size, self.seed = n_clips, batch_size, seed
        self.num_workers, self.persistent_workers, self.prefetch_factor = (
            num_workers, persistent_workers, prefetch_factor)

    def setup(self, stage=None):
        rng = np.random.default_rng(self.seed)
        labels = rng.integers(0, NUM_CLASSES, self.n_clips)
        t = np.arange(CLIP, dtype=np.float32) / SR
        base = 200.0 + 150.0 * np.arange(NUM_CLASSES, dtype=np.float32)
        clips = np.empty((self.n_clips, CLIP), np.uint8)
        for i0 in range(0, self.n_clips, 128):  # in chunks, to keep memory small
            lab = labels[i0 : i0 + 128]
            f = base[lab][:, None]
            wave = 0.4 * np.sin(2 * np.pi * f * t) + 0.2 * np.sin(2 * np.pi * 2.7 * f * t)
            wave += 0.2 * rng.standard_normal(wave.shape, dtype=np.float32)
            clips[i0 : i0 + 128] = mulaw_encode(wave)
        self.train_set = MelClips(clips, labels, self.seed)

    def train_dataloader(self):
        return DataLoader(
            self.train_set,
            batch_size=self.batch_size,
            shuffle=True,
            drop_last=True,
            num_workers=self.num_workers,
            persistent_workers=self.persistent_workers,
            prefetch_factor=self.prefetch_factor,
        )


class KeywordNet(L.LightningModule):
    def __init__(self, lr=2e-3):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Conv2d(1, 16, 3, stride=2, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 96, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(96, NUM_CLASSES),
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train/loss", loss, on_step=True, on_epoch=False)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


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
    p = make_parser(__doc__, steps=80)
    p.add_argument("--workers", type=int, default=None, help="num_workers of the fixed variant (default 1)")
    args = p.parse_args()
    torch.set_num_threads(1)
    L.seed_everything(args.seed, verbose=False)

    if args.variant == "faulty":
        dm = AudioDataModule(num_workers=0, seed=args.seed)
    else:
        dm = AudioDataModule(num_workers=args.workers or 1, persistent_workers=True, prefetch_factor=4,
                             seed=args.seed)
    meter = SteadyMeter(warmup=5)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=args.steps,
        enable_progress_bar=False,
        logger=False,
        enable_checkpointing=False,
        callbacks=[StepTimer(meter)],
    )
    trainer.fit(KeywordNet(), datamodule=dm)
    meter.print_result(
        scenario="lightning_input", variant=args.variant, batch_size=BATCH, num_workers=dm.num_workers
    )


if __name__ == "__main__":
    main()
