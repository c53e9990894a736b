"""A job that is healthy for a while, then goes slow mid-run (the field's "it was fine for 20 hours").

Stages: an in-memory dataset of 3x32x32 float images (cheap ``__getitem__``), ``DataLoader``
``num_workers=0``, batch 32, the S-CNN, SGD, one intra-op thread. The loop runs ``--seconds``
seconds of steps (not a step count: the regression's time is what the windows are checked on).

- faulty: after ``--after`` seconds the regression is switched on:
  ``--kind data`` (default): each sample read then waits ``--latency-ms`` (2 ms: a dataset
  shard on a slower file system; off-CPU, in ``__getitem__``), so the step waits for its batch;
  ``--kind host``: after each optimizer step the loop runs ``--host-ms`` (20 ms) of Python
  (a metrics helper someone turned on).
- fixed: the regression never comes (the healthy loop throughout).

Expected diagnosis: the whole-run verdict blends both parts; the windows say when it changed:
before ``--after`` the windows' verdict is healthy (``device_bound``/``small_workload``, data wait
small), from the window holding ``--after`` on ``input_bound`` (``--kind data``) or
``host_bound`` (``--kind host``). The RESULT line has ``before_sps`` and ``after_sps`` (samples/s
before and after the switch, measured by the loop) and ``switch_t`` (monotonic ns of the switch).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import json
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from common import SCNN, make_parser, seed_everything

STATE = {"slow": False, "kind": "data"}


class Images(Dataset):
    def __init__(self, n, latency_s):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 3, 32, 32, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)
        self.latency_s = latency_s

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if STATE["slow"] and STATE["kind"] == "data":
            time.sleep(self.latency_s)  # the slower shard's read
        return self.x[i], self.y[i]


def log_metrics(model, ms):
    end = time.perf_counter() + ms / 1000
    total = 0.0
    while time.perf_counter() < end:  # Python per step: a metrics helper
        total += sum(i * 0.5 for i in range(200))
    return total


def main():
    p = make_parser(__doc__, steps=0)
    p.add_argument("--seconds", type=float, default=40.0)
    p.add_argument("--after", type=float, default=20.0, help="seconds of healthy steps before the regression")
    p.add_argument("--kind", choices=("data", "host"), default="data")
    p.add_argument("--latency-ms", type=float, default=2.0)
    p.add_argument("--host-ms", type=float, default=20.0)
    args = p.parse_args()
    torch.set_num_threads(1)
    seed_everything(args.seed)
    STATE["kind"] = args.kind
    model = SCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loader = DataLoader(Images(4096, args.latency_ms / 1000), batch_size=32, shuffle=True, drop_last=True)
    start = time.monotonic()
    switch_t = None
    ends = {False: [], True: []}  # step ends (monotonic s) before / after the switch
    done = False
    while not done:
        for x, y in loader:
            t0 = time.monotonic()
            now = t0 - start
            if now >= args.seconds:
                done = True
                break
            if args.variant == "faulty" and not STATE["slow"] and now >= args.after:
                STATE["slow"] = True
                switch_t = time.monotonic_ns()
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if STATE["slow"] and args.kind == "host":
                log_metrics(model, args.host_ms)
            ends[STATE["slow"]].append(time.monotonic())

    def sps(t):  # samples/s over a part's steps, from the loop's own clock (data loading included)
        return round(32 * (len(t) - 1) / (t[-1] - t[0]), 1) if len(t) > 2 else None

    print("RESULT", json.dumps({"switch_t": switch_t, "before_sps": sps(ends[False]), "after_sps": sps(ends[True])}),
          flush=True)


if __name__ == "__main__":
    main()
