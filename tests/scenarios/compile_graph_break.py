"""A compiled model with a graph break in every forward: a ``.item()`` token counter inside it.

Stages: batches of 32 token sequences, all padded to 128 tokens (one static shape: no
recompilations), vocabulary 8,000; a text classifier (embedding 64, three residual MLP blocks
64 -> 128 -> 64 (``compile_varlen.Block``), masked mean pooling, 2 classes) wrapped in ``torch.compile``; AdamW; ``--steps``
batches (default 300). Its ``forward`` keeps the batch's count of real tokens for a log line, as
``self.tokens_seen = int(mask.sum().item())``: Dynamo cannot trace ``.item()`` (with
``capture_scalar_outputs`` off, the default), so every call runs the first graph, the counter
eagerly, then a second graph from a resume function; on a GPU the ``.item()`` also synchronizes.

Fixed variant (``--fixed``): the count stays a tensor (``self.tokens_seen = mask.sum()``, read
when logging): one graph per call. (A running total, ``self.tokens_seen += int(...)``, would be
worse: Dynamo guards on the Python int it reads, so every step recompiles until the recompile
limit.)

Measured (RESULT ``steady_ms``: median step after the first 10, 300 steps, 2 runs each):
- 2-core dev box, torch 2.13 CPU, inductor: broken 16.1-23.1 ms, fixed 14.9-21.5 ms (1.07-1.08x);
  whyidle: ``graph_breaks`` info, the eager code at the break 4.7 % of the step, estimate 1.05x
  (the verdict stays ``device_bound``). Under aot_eager (no fusion to lose) the two are alike.
- H200, torch 2.11, inductor, ``--device cuda``: broken 4.0-4.4 ms, fixed 3.2-3.4 ms (1.27x): the
  ``.item()`` synchronizes; whyidle: verdict ``sync_bound`` naming the ``.item()`` line (44 % of
  the GPU idle), and ``graph_breaks`` info at the same line (9 %, estimate 1.10x).

Expected diagnosis: ``graph_breaks`` (one break, at the ``.item()`` line, reason "Tensor.item()";
fix: keep it a tensor / ``capture_scalar_outputs``), no ``recompiles``; the break costs little on a
CPU (info), more on a GPU where ``.item()`` synchronizes.
"""

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compile_varlen import DIM, VOCAB, Block  # noqa: E402  the same residual MLP block


class TextClassifier(nn.Module):
    def __init__(self, fixed: bool):
        super().__init__()
        self.fixed = fixed
        self.emb = nn.Embedding(VOCAB, DIM, padding_idx=0)
        self.blocks = nn.Sequential(Block(), Block(), Block())
        self.head = nn.Linear(DIM, 2)
        self.tokens_seen = None

    def forward(self, x):
        mask = (x != 0).unsqueeze(-1).float()
        if self.fixed:
            self.tokens_seen = mask.sum().long()
        else:
            self.tokens_seen = int(mask.sum().item())
        h = self.blocks(self.emb(x))
        return self.head((h * mask).sum(1) / mask.sum(1).clamp(min=1.0))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--fixed", action="store_true")
    p.add_argument("--backend", default="inductor")
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    model = torch.compile(TextClassifier(args.fixed).to(args.device), backend=args.backend)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    times = []
    for step in range(args.steps):
        x = torch.randint(1, VOCAB, (32, 128), generator=g)
        x[:, 100:] = 0
        y = torch.randint(0, 2, (32,), generator=g)
        x, y = x.to(args.device), y.to(args.device)
        t0 = time.perf_counter()
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    steady = statistics.median(times[10:]) * 1e3
    print(f"RESULT steady_ms={steady:.2f} steps={args.steps} fixed={args.fixed} backend={args.backend} "
          f"tokens={int(model.tokens_seen)}")


if __name__ == "__main__":
    main()
