"""A plain PyTorch loop that already uses ``torch.compile`` (one variant: nothing is wrong).

Stages: the S-MLP (512 -> 1024 -> 1024 -> 10) wrapped in ``model = torch.compile(model)``
(default backend ``inductor``; ``--backend aot_eager|eager`` to skip the C++ code generation),
AdamW, batch 64 from an in-memory ``TensorDataset`` (``drop_last=True``: one static shape, no
recompiles), 120 steps. The first step compiles (forward and backward graphs); the first 5 steps
are left out of the rates (``fw_meter.SteadyMeter``, timed with ``perf_counter`` in the loop).

If compiling fails on the first step (no working C++ compiler for inductor, for instance), the
script says so on stderr and falls back to ``torch.compile(backend="aot_eager")``; RESULT's
``backend`` says which backend ran.

On the 2-core dev box with torch 2.13 (CPU) inductor works (gcc): the very first run on a
machine spends ~35-40 s compiling (cold cache under ``/tmp/torchinductor_$USER``); later runs hit
the cache and the first step takes ~4-5 s (process ~15 s). ``--backend aot_eager``: ~1 s first
step.

Purpose: whyidle must notice that the model is compiled (dynamo / inductor frames, compiled
graph calls in the stacks) and must **not** suggest ``torch.compile`` to this user; the loop is
compute-bound (``device_bound``), with compilation in the first step(s) only.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import SMLP, make_parser, seed_everything
from fw_meter import SteadyMeter

BATCH = 64


def make_features(n, seed, classes=10, features=512):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(classes, features, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    return centers[y] + 4.0 * torch.randn(n, features, generator=g), y


def train_step(model, optimizer, xb, yb):
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(xb), yb)
    loss.backward()
    optimizer.step()
    return loss


def main():
    p = make_parser(__doc__, steps=120, variants=False)
    p.add_argument("--backend", default="inductor", help="torch.compile backend (default %(default)s)")
    args = p.parse_args()
    torch.set_num_threads(1)
    seed_everything(args.seed)

    x, y = make_features(4096, args.seed)
    loader = DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True, drop_last=True)
    eager_model = SMLP(512, 10)
    model = torch.compile(eager_model, backend=args.backend)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    backend = args.backend

    meter = SteadyMeter(warmup=5)
    first_step_s = None
    step = 0
    meter.start()
    while step < args.steps:
        for xb, yb in loader:
            meter.batch_start()
            if step == 0:
                t0 = time.perf_counter()
                try:
                    loss = train_step(model, optimizer, xb, yb)
                except Exception as exc:  # noqa: BLE001 - e.g. inductor without a C++ compiler
                    print(f"torch.compile(backend={backend!r}) failed on the first step: "
                          f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}; "
                          "falling back to backend='aot_eager'", file=sys.stderr, flush=True)
                    torch._dynamo.reset()
                    backend = "aot_eager"
                    model = torch.compile(eager_model, backend=backend)
                    loss = train_step(model, optimizer, xb, yb)
                first_step_s = time.perf_counter() - t0
            else:
                loss = train_step(model, optimizer, xb, yb)
            step += 1
            if step % 50 == 0:
                print(f"step {step:4d}  loss {loss.item():.4f}", flush=True)
            meter.batch_end(len(xb))
            if step >= args.steps:
                break

    meter.print_result(
        scenario="compiled_model",
        variant="compiled",
        backend=backend,
        batch_size=BATCH,
        first_step_s=round(first_step_s, 3),
    )


if __name__ == "__main__":
    main()
