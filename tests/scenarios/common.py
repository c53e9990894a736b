"""Small shared pieces of the scenario training scripts (plain PyTorch, no whyidle import).

- the two reference models of /work/shared/cases.md: S-CNN and S-MLP;
- ``make_parser``: the common command line (``--variant`` (or ``--fixed``), ``--steps``, ``--seed``,
  ``--tc``, and ``--device`` for the scripts that also run on a GPU);
- ``measure_tc``: the start-up calibration (median of 5 warm-up steps = T_c);
- ``StepMeter``: the classic "data_time / batch_time" meter of the PyTorch ImageNet example,
  which the training loops call as ``meter.got_batch()`` right after the ``for`` loop hands
  them a batch and ``meter.step_done(n)`` after ``optimizer.step()``; it prints the single
  ``RESULT {json}`` line the tests parse.

Each script puts this directory on ``sys.path`` itself (``sys.path.insert(0, dirname(__file__))``),
so the scripts run from any working directory and need nothing installed but torch and numpy.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import numpy as np
import torch
import torch.nn as nn


class SCNN(nn.Module):
    """S-CNN: 3 conv layers (16 -> 32 -> 64, 3x3, ReLU, 2x2 max-pool after the first two),
    global average pool, linear layer to 10 classes. Input float 3x32x32."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.head = nn.Linear(64, num_classes)

    def forward(self, x):
        return self.head(self.features(x))


class SMLP(nn.Module):
    """S-MLP: 512 -> 1024 -> 1024 -> 10."""

    def __init__(self, in_features: int = 512, num_classes: int = 10):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(in_features, 1024),
            nn.ReLU(inplace=True),
            nn.Linear(1024, 1024),
            nn.ReLU(inplace=True),
            nn.Linear(1024, num_classes),
        )

    def forward(self, x):
        return self.net(x)


def make_parser(doc: str | None, steps: int, variants: bool = True, tc: bool = False, device: bool = False):
    """The command line every scenario shares.

    ``--fixed`` is short for ``--variant fixed``. With ``device=True``, ``--device cpu|cuda``
    (default: None, which :func:`pick_device` turns into cuda when available, else cpu).
    """
    first = (doc or "").strip().splitlines()[0] if doc else None
    p = argparse.ArgumentParser(description=first)
    if variants:
        p.add_argument("--variant", choices=("faulty", "fixed"), default="faulty")
        p.add_argument("--fixed", dest="variant", action="store_const", const="fixed",
                       help="same as --variant fixed")
    if device:
        p.add_argument("--device", choices=("cpu", "cuda"), default=None,
                       help="device to train on (default: cuda when available, else cpu)")
    p.add_argument("--steps", type=int, default=steps, help="optimizer steps to run (default %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    if tc:
        p.add_argument(
            "--tc",
            type=float,
            default=None,
            help="compute time T_c in seconds; skips the start-up calibration (injected costs are multiples of it)",
        )
    return p


def pick_device(arg: str | None) -> str:
    """``--device`` or, when not given, ``"cuda"`` if PyTorch can use a GPU, else ``"cpu"``."""
    if arg:
        return arg
    return "cuda" if torch.cuda.is_available() else "cpu"


def sync_device(device: str) -> None:
    """Waits for the device's queued work (CUDA), so loop timings include it. Call outside the
    timed steps only (before ``meter.start()`` and before the final result)."""
    if device == "cuda":
        torch.cuda.synchronize()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def measure_tc(model, batch, loss_fn, optimizer, n: int = 5) -> float:
    """Run ``n`` warm-up training steps on one in-memory batch; return the median step time (T_c)."""
    x, y = batch
    times = []
    model.train()
    for _ in range(n):
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


class StepMeter:
    """Times the training loop: blocked-in-``next(loader)`` time and step time.

    ``start()`` before the first ``for x, y in loader`` (so creating the iterator, which starts
    the workers, counts as data wait); ``got_batch()`` as the first statement of the loop body;
    ``step_done(n)`` after ``optimizer.step()`` (and after whatever else the step does).
    """

    def __init__(self):
        self.t_start = self.last = None
        self.cpu_start = self.cpu_last = None
        self.data_s = 0.0
        self.data_cpu_s = 0.0
        self.thread_cpu_last = 0.0
        self.data_times: list[float] = []
        self.step_times: list[float] = []
        self.samples = 0

    def start(self) -> None:
        self.t_start = self.last = time.perf_counter()
        self.cpu_start = self.cpu_last = time.process_time()
        self.thread_cpu_last = time.thread_time()

    def got_batch(self) -> None:
        waited = time.perf_counter() - self.last
        self.data_s += waited
        self.data_times.append(waited)
        self.data_cpu_s += time.thread_time() - self.thread_cpu_last

    def step_done(self, n_samples: int) -> None:
        now = time.perf_counter()
        self.step_times.append(now - self.last)
        self.samples += int(n_samples)
        self.last = now
        self.cpu_last = time.process_time()
        self.thread_cpu_last = time.thread_time()

    @property
    def steps(self) -> int:
        return len(self.step_times)

    def result(self, **extra) -> dict:
        wall = (self.last - self.t_start) if self.step_times else 0.0
        out = {
            "steps": self.steps,
            "wall_s": round(wall, 4),
            "samples_per_s": round(self.samples / wall, 2) if wall > 0 else 0.0,
            "step_time_p50_s": round(statistics.median(self.step_times), 5) if self.step_times else 0.0,
            "data_wait_share": round(self.data_s / wall, 4) if wall > 0 else 0.0,
            "samples": self.samples,
        }
        # CPU time of this process (all its threads, not its loader workers) over the loop's wall time
        out["main_cpu_share"] = round((self.cpu_last - self.cpu_start) / wall, 4) if wall > 0 else 0.0
        # main-thread CPU time while blocked in next(loader), over that wait: ~1 when the main process
        # does the data work itself on the CPU, ~0 when it sleeps (I/O latency, waiting for workers)
        out["data_cpu_share"] = round(self.data_cpu_s / self.data_s, 4) if self.data_s > 0 else 0.0
        # the same data share without the first step (which includes starting the loader workers)
        if len(self.step_times) > 1 and wall - self.step_times[0] > 0:
            steady = (self.data_s - self.data_times[0]) / (wall - self.step_times[0])
            out["data_wait_share_steady"] = round(steady, 4)
        # the loop after its first step (the workers' first start is start-up): what whyidle's
        # training-loop estimates are about
        out["first_step_s"] = round(self.step_times[0], 4) if self.step_times else 0.0
        out.update(extra)
        return out

    def print_result(self, prefix: str = "", **extra) -> dict:
        res = self.result(**extra)
        print(prefix + "RESULT " + json.dumps(res, sort_keys=False), flush=True)
        return res
