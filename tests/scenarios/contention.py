"""A healthy training loop that gets slowed down by other processes busy on the same cores.

Stages: an ordinary training loop with nothing wrong in it: the S-MLP (512 -> 1024 -> 1024 ->
10, batch 256) on in-memory data (``TensorDataset``, ``num_workers=0``), ``torch.set_num_threads(2)``
so the model's matmuls use both cores. On its own it is compute-bound.

The fault is outside the script: run ``python burn.py 2 SECONDS`` alongside (started by the test,
outside the observed command). Two pure-Python spinners on a 2-core box take about half of each
core, and the two intra-op threads of every matmul must both get a core before the op can
finish, so the step slows by much more than 2x.

- "fixed":  no burners (the machine to itself): 100 steps, ~1.5 s.
- "faulty": 2 burners running (this script is unchanged; there is no ``--variant``).

The slowdown under burners is large and very uneven from run to run (measured 2x to 29x, often
bimodal: ~40-60 ms or ~250-470 ms per step against ~15 ms alone), so the loop also stops after
``--time-budget`` seconds (default 8): the RESULT line then has fewer ``steps`` than asked.

Expected diagnosis (faulty): ``cpu_contention`` (system-wide CPU busy well above what the
observed process tree uses; the trainer's threads runnable but waiting for a CPU:
high ``run_delay`` / involuntary context switches; step time inflated with no change in the
work per step). Fix: free the cores (stop/renice the other jobs, pin with taskset/cgroups),
or lower the intra-op thread count to the cores really available.
Without burners: ``device_bound`` (healthy).

Expected slowdown with 2 burners on 2 cores (samples/s without / with): median ~4x, at least ~2x
in every measured run (see README); assert >= 1.5x.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import SMLP, StepMeter, make_parser, seed_everything


def main():
    p = make_parser(__doc__, steps=100, variants=False)
    p.add_argument(
        "--time-budget",
        type=float,
        default=8.0,
        help="also stop once the loop has run this many seconds (0: no limit; default %(default)s)",
    )
    args = p.parse_args()
    torch.set_num_threads(2)
    seed_everything(args.seed)

    g = torch.Generator().manual_seed(args.seed)
    features = torch.randn(8192, 512, generator=g)
    labels = torch.randint(0, 10, (8192,), generator=g)
    loader = DataLoader(TensorDataset(features, labels), batch_size=256, shuffle=True, drop_last=True)

    model = SMLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    meter = StepMeter()
    step = 0

    def finished():
        return step >= args.steps or (args.time_budget > 0 and meter.last - meter.t_start >= args.time_budget)

    meter.start()
    while not finished():
        for x, y in loader:
            meter.got_batch()
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            meter.step_done(x.shape[0])
            step += 1
            if finished():
                break
    meter.print_result(scenario="contention", variant="as-run", threads=torch.get_num_threads(), batch_size=256)


if __name__ == "__main__":
    main()
