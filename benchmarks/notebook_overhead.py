"""Overhead of ``%%whyidle`` on a training loop in a notebook kernel, against the same loop plain.

One Jupyter kernel (``jupyter_client``, as JupyterLab or nbclient starts it) runs
``benchmarks/overhead.py``'s ``10ms`` loop (an MLP of width ``--width`` on an in-memory
TensorDataset behind a DataLoader, batch 64, one intra-op thread; ~10 ms steps) in cells, alternately
plain and under ``%%whyidle -q --no-html`` (A B A B ..., ``--rounds`` pairs, so machine drift hits
both alike), each cell printing its median and mean step time after ``--warmup`` steps and its
process CPU time per step. The kernel is pinned to one CPU (``--pin``) as in ``overhead.py``; the
sampler helper (a child of the kernel) inherits the pin, so its polling competes with the loop
exactly as a thread of the kernel would.

Printed: each cell's figures, the ratio of the medians of the per-cell medians (the goal metric:
≤ 1.02 at ~10 ms steps, issue 33, the same goal as ``whyidle run``), the same for the means and CPU
time per step; and the time a ``%%whyidle`` cell adds around the loop (start: the sampler helper,
the hooks; end: hooks out, the report built), which the step ratios do not contain. With
``--blocks N``, one cell then alternates N plain blocks and N blocks inside ``whyidle.watch()`` (what
the magic runs), each pair seconds apart, so drift between cells does not enter the ratio.

    flock /tmp/whyidle-timing.lock python benchmarks/notebook_overhead.py [--rounds 4] [--steps 400]
        [--magic-args "--stack-hz 0"] [--pin 0|none]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time

from overhead import MODEL, machine_state

SETUP = r'''
import json, time, resource
import torch
from torch.utils.data import DataLoader, TensorDataset
torch.set_num_threads(1)
width, blocks = {width}, 0
data = TensorDataset(torch.randn(4096, width), torch.randint(0, 10, (4096,)))
''' + MODEL + r'''
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(data, batch_size=64, shuffle=True, drop_last=True)  # built once, as overhead.py's

def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

def loop(steps, warmup):
    times, t_prev, cpu0 = [], None, None
    n = 0
    while n < steps:
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            now = time.perf_counter()
            if t_prev is not None and n >= warmup:
                times.append(now - t_prev)
            if n == warmup:
                cpu0 = cpu_s()
            t_prev = now
            n += 1
            if n >= steps:
                break
    times.sort()
    return {{"median": times[len(times) // 2], "mean": sum(times) / len(times),
            "cpu": (cpu_s() - cpu0) / (steps - warmup)}}
'''

#: ``--blocks``: one cell alternating plain blocks of steps and blocks inside ``whyidle.watch()`` (the
#: machinery ``%%whyidle`` runs: the same agent, helper and hooks), seconds apart instead of a cell apart.
BLOCKS = r'''
import whyidle
rows = {{"plain": [], "whyidle": []}}
for k in range({blocks}):
    for kind in ("plain", "whyidle") if k % 2 == 0 else ("whyidle", "plain"):
        if kind == "plain":
            r = loop({steps}, {warmup})
        else:
            with whyidle.watch(out="{workdir}/b%d" % k, quiet=True, html=False) as w:
                r = loop({steps}, {warmup})
            assert w.report is not None and w.report["metrics"]["steps"] >= {steps} - 1, w.problem
        rows[kind].append(r)
print("RESULT " + json.dumps(rows))
'''

CELL = "{magic}t_cell = time.perf_counter()\nr = loop({steps}, {warmup})\nr['loop_s'] = time.perf_counter() - t_cell\nprint('RESULT ' + json.dumps(r))"


def run_cell(kc, code: str, timeout: float = 600) -> tuple[str, float]:
    """Executes ``code`` in the kernel; returns (its stdout, the cell's wall time in seconds)."""
    t0 = time.perf_counter()
    msg_id = kc.execute(code)
    out = []
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream" and content["name"] == "stdout":
            out.append(content["text"])
        elif kind == "error":
            raise RuntimeError("\n".join(content["traceback"]))
        elif kind == "status" and content["execution_state"] == "idle":
            return "".join(out), time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=60)
    parser.add_argument("--width", type=int, default=960, help="MLP width (sets the step time: ~10 ms here)")
    parser.add_argument("--pin", default="0", help="CPU to pin the kernel to ('none': no pin)")
    parser.add_argument("--magic-args", default="", help="more %%%%whyidle options, e.g. '--stack-hz 0'")
    parser.add_argument("--blocks", type=int, default=0,
                        help="also: one cell alternating this many plain and whyidle.watch() blocks")
    args = parser.parse_args()
    from jupyter_client.manager import start_new_kernel

    print(machine_state(full=True))
    workdir = tempfile.mkdtemp(prefix="whyidle-nb-overhead-")
    km, kc = start_new_kernel(kernel_name="python3", cwd=workdir)
    try:
        if args.pin != "none" and shutil.which("taskset"):
            subprocess.run(["taskset", "-a", "-p", "-c", args.pin, str(km.provisioner.pid)], check=True,
                           stdout=subprocess.DEVNULL)
        run_cell(kc, "%load_ext whyidle")
        run_cell(kc, SETUP.format(width=args.width))
        run_cell(kc, CELL.format(magic="", steps=args.warmup + 20, warmup=10))  # warm the kernel once
        rows = {"plain": [], "whyidle": []}
        for k in range(args.rounds):
            for kind in ("plain", "whyidle"):
                magic = (f"%%whyidle -q --no-html --out {workdir}/r{k} {args.magic_args}\n"
                         if kind == "whyidle" else "")
                out, cell_s = run_cell(kc, CELL.format(magic=magic, steps=args.steps, warmup=args.warmup))
                r = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
                r["extra_s"] = cell_s - r["loop_s"]
                rows[kind].append(r)
                print(f"{kind:8s} median {r['median'] * 1e3:7.2f} ms  mean {r['mean'] * 1e3:7.2f} ms  "
                      f"cpu/step {r['cpu'] * 1e3:7.2f} ms  cell - loop {r['extra_s']:5.2f} s", flush=True)
            if not os.path.exists(os.path.join(workdir, f"r{k}", "report.json")):
                raise SystemExit(f"the %%whyidle cell of round {k} wrote no report")
        for key, label in (("median", "median step"), ("mean", "mean step"), ("cpu", "CPU per step")):
            ratio = statistics.median(r[key] for r in rows["whyidle"]) / statistics.median(r[key] for r in rows["plain"])
            print(f"ratio of {label}s (%%whyidle / plain): {ratio:.3f}" + ("  (goal ≤ 1.02)" if key == "median" else ""))
        if args.blocks:
            out, _ = run_cell(kc, BLOCKS.format(blocks=args.blocks, steps=args.steps, warmup=args.warmup,
                                                workdir=workdir), timeout=1800)
            blocks = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
            for key in ("median", "cpu"):
                pairs = [w[key] / p[key] for p, w in zip(blocks["plain"], blocks["whyidle"])]
                print(f"blocks in one cell ({args.blocks} pairs): ratio of {key}s watch()/plain "
                      f"{statistics.median(w[key] for w in blocks['whyidle']) / statistics.median(p[key] for p in blocks['plain']):.3f}"
                      f" (pair ratios {min(pairs):.3f}-{max(pairs):.3f}, median {statistics.median(pairs):.3f})")
        print(f"a %%whyidle cell's time around the loop: {statistics.median(r['extra_s'] for r in rows['whyidle']):.2f} s "
              f"(plain cell: {statistics.median(r['extra_s'] for r in rows['plain']):.2f} s)")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
