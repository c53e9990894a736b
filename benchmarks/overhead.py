"""Overhead of `whyidle run` on a training loop, measured against a plain run in the same session.

Step time: a CPU training loop with ~10 ms steps (in-memory data, one intra-op thread) runs
alternately plain and under ``whyidle run`` (A B A B ..., so machine drift hits both alike); each
run reports its own median step time from ``time.perf_counter``. Prints the ratio of medians
(goal ≤ 1.02).

Memory: a loop of tiny steps runs ``--memory-steps`` steps (default 100,000) plain and under
whyidle; each reports its RSS growth between step 1,000 and the end; the benchmark polls the
whyidle process's RSS. Prints the trainer's extra growth under whyidle (goal < 20 MB),
whyidle's own peak RSS (goal < 150 MB), and the step-time ratio of those sub-millisecond steps
(the worst case for a fixed per-step cost).

    python benchmarks/overhead.py [--rounds 3] [--steps 600] [--memory-steps 100000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import psutil

WORKLOAD = r'''
import json, os, resource, sys, time
import torch
from torch.utils.data import DataLoader, TensorDataset
torch.set_num_threads(1)
steps, width, batch = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
data = TensorDataset(torch.randn(4096, width), torch.randint(0, 10, (4096,)))
loader = DataLoader(data, batch_size=batch, shuffle=True, drop_last=True)
model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                            torch.nn.ReLU(), torch.nn.Linear(width, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
times, step, rss0 = [], 0, None
t = time.perf_counter()
while step < steps:
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        now = time.perf_counter(); times.append(now - t); t = now
        step += 1
        if step == min(1000, steps // 2):
            rss0 = rss()
            times.clear()  # warm-up excluded
        if step >= steps:
            break
times.sort()
print("RESULT " + json.dumps({"median_s": times[len(times) // 2], "rss_growth_bytes": rss() - rss0}))
'''


def run_once(script: str, args: list[str], under_whyidle: bool, workdir: str) -> tuple[dict, float | None]:
    cmd = [sys.executable, script, *args]
    peak = None
    if under_whyidle:
        cmd = [sys.executable, "-m", "whyidle", "run", "-q", "--out",
               tempfile.mkdtemp(prefix="run-", dir=workdir), "--", *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    if under_whyidle:
        me = psutil.Process(proc.pid)
        peak = 0
        while proc.poll() is None:
            try:
                peak = max(peak, me.memory_info().rss)
            except psutil.Error:
                pass
            time.sleep(0.2)
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"workload failed ({proc.returncode}): {' '.join(cmd)}")
    line = next(l for l in out.splitlines() if l.startswith("RESULT "))
    return json.loads(line[7:]), peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="A/B pairs for the step-time ratio")
    parser.add_argument("--steps", type=int, default=600, help="steps per step-time run (~10 ms each)")
    parser.add_argument("--width", type=int, default=960, help="MLP width (sets the step time)")
    parser.add_argument("--memory-steps", type=int, default=100_000, help="steps of the memory run (0 = skip)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        script = os.path.join(workdir, "workload.py")
        with open(script, "w") as f:
            f.write(WORKLOAD)
        plain, observed = [], []
        for _ in range(args.rounds):
            plain.append(run_once(script, [str(args.steps), str(args.width), "64"], False, workdir)[0]["median_s"])
            observed.append(run_once(script, [str(args.steps), str(args.width), "64"], True, workdir)[0]["median_s"])
        p, o = statistics.median(plain), statistics.median(observed)
        print(f"step time  plain {p * 1000:.2f} ms   under whyidle {o * 1000:.2f} ms   "
              f"ratio {o / p:.3f}   (medians of {args.rounds} runs each; per run: "
              f"{', '.join(f'{x * 1000:.2f}' for x in plain)} vs {', '.join(f'{x * 1000:.2f}' for x in observed)} ms)")
        if args.memory_steps:
            n = str(args.memory_steps)
            base, _ = run_once(script, [n, "8", "1"], False, workdir)
            mem, peak = run_once(script, [n, "8", "1"], True, workdir)
            extra = mem["rss_growth_bytes"] - base["rss_growth_bytes"]
            print(f"memory     {args.memory_steps:,} steps: trainer RSS growth plain {base['rss_growth_bytes'] / 2**20:.1f} MB, "
                  f"under whyidle {mem['rss_growth_bytes'] / 2**20:.1f} MB (extra {extra / 2**20:.1f} MB); "
                  f"whyidle process peak RSS {peak / 2**20:.1f} MB")
            print(f"tiny steps plain {base['median_s'] * 1e3:.3f} ms   under whyidle {mem['median_s'] * 1e3:.3f} ms   "
                  f"ratio {mem['median_s'] / base['median_s']:.3f}   (one run each: the worst case for per-step cost)")


if __name__ == "__main__":
    main()
