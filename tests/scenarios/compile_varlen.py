"""Variable-length text batches under ``torch.compile``: recompilations (and the recompile limit).

Stages: synthetic token sequences (vocabulary 8,000) with lengths drawn uniformly from 16 to 128,
batches of 32, no length bucketing; a text classifier (embedding 64, two residual MLP blocks
64 -> 128 -> 64, masked mean pooling, 2 classes) wrapped in ``model = torch.compile(model)``, AdamW,
cross-entropy; ``--steps`` batches (default 200). Each batch is padded only to its own longest
sequence, as a ``collate_fn`` with ``pad_sequence`` does.

- default (``dynamic=None``): the first batch compiles for its exact length; the second length
  recompiles (Dynamo marks the length dimension dynamic then): two compilations, the second in the
  second step.
- ``--dynamic false`` (``torch.compile(model, dynamic=False)``, as advised for "fastest kernels"):
  every new length recompiles until ``torch._dynamo.config.recompile_limit`` (8), after which the
  model silently runs eagerly.
- fixed variants: ``--mark-dynamic`` (``torch._dynamo.mark_dynamic(x, 1)`` before each call: one
  compilation), ``--dynamic true`` (one compilation, every size symbolic), ``--bucket 128`` (every
  batch padded to 128 tokens: one static shape, more work per step).

``--backend aot_eager`` skips inductor's code generation (the tests use it); ``--device cuda``.

Measured, wall time of the command (RESULT ``loop_s``: the training loop), 2 or 3 runs each:
- 2-core dev box, torch 2.13 CPU, aot_eager, quiet box: default 7.3-8.3 s (loop 4.1-4.9 s);
  ``--mark-dynamic`` 7.7-8.1 s (about 1.0x: one recompilation of ~0.5 s is within the noise);
  ``--dynamic true`` 8.2-8.8 s (0.9x: every size symbolic makes each step slower here);
  ``--dynamic false`` 9.5-9.7 s (loop 6.1-6.3 s): removing ``dynamic=False`` gives 1.25x.
  whyidle: default, ``recompiles`` info (7 % of the wall time, estimate 1.08x); ``--dynamic false``,
  verdict ``recompiles`` (7 recompilations, 26 %, estimate 1.35x for removing ``dynamic=False``,
  measured 1.25x) and ``recompile_limit`` (eager steps 16.1 ms against 12.0 ms compiled).
- H200, torch 2.11, inductor, 200 steps: default loop 15.4 s, ``--dynamic true`` 10.5 s; whyidle:
  verdict ``recompiles`` (6.1 s, 26 % of the 24 s wall time, estimate 1.35x; measured 1.27x on the
  wall time).
- inductor on the 2-core box: the same command took 5 to 80 s from run to run (cold and warm FX
  graph caches, OpenMP threads oversubscribed beside other jobs): not a reproducible measure here.

Expected diagnosis: ``recompiles`` (the second compilation, its reason ``tensor 'x' size mismatch
at index 1``, the time it took as a part of the wall time: fix ``mark_dynamic(x, 1)`` /
``dynamic=True`` / bucketing), and with ``--dynamic false`` also ``recompile_limit``.
"""

import argparse
import os
import sys
import time

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

VOCAB = 8000
DIM = 64
MAX_LEN = 128


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.up = nn.Linear(DIM, 2 * DIM)
        self.down = nn.Linear(2 * DIM, DIM)

    def forward(self, h):
        return h + self.down(torch.nn.functional.gelu(self.up(self.norm(h))))


class TextClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM, padding_idx=0)
        self.blocks = nn.Sequential(Block(), Block())
        self.head = nn.Linear(DIM, 2)

    def forward(self, x):
        mask = (x != 0).unsqueeze(-1).float()
        h = self.blocks(self.emb(x))
        return self.head((h * mask).sum(1) / mask.sum(1).clamp(min=1.0))


def batches(n_batches, batch, bucket, seed=0):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n_batches):
        lengths = torch.randint(16, MAX_LEN + 1, (batch,), generator=g)
        seqs = [torch.randint(1, VOCAB, (int(n),), generator=g) for n in lengths]
        x = nn.utils.rnn.pad_sequence(seqs, batch_first=True)
        if bucket:
            x = nn.functional.pad(x, (0, -x.size(1) % bucket))
        yield x, (lengths > MAX_LEN // 2).long()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--dynamic", choices=("default", "true", "false"), default="default")
    p.add_argument("--bucket", type=int, default=0, help="pad every batch to a multiple of this length")
    p.add_argument("--mark-dynamic", action="store_true", help="torch._dynamo.mark_dynamic(x, 1) before each call")
    p.add_argument("--backend", default="inductor")
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    model = TextClassifier().to(args.device)
    dynamic = {"default": None, "true": True, "false": False}[args.dynamic]
    model = torch.compile(model, dynamic=dynamic, backend=args.backend)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    t0 = time.perf_counter()
    for x, y in batches(args.steps, args.batch, args.bucket):
        x, y = x.to(args.device), y.to(args.device)
        if args.mark_dynamic:
            torch._dynamo.mark_dynamic(x, 1)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    loop_s = time.perf_counter() - t0
    print(f"RESULT loop_s={loop_s:.2f} steps={args.steps} dynamic={args.dynamic} bucket={args.bucket} "
          f"backend={args.backend} mark_dynamic={args.mark_dynamic}")


if __name__ == "__main__":
    main()
