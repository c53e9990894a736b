"""Cost of on-demand deep traces (issue 34, ``src/whyidle/instrument/deep_trace.py``).

1. ``poll``: what the step boundary pays when nobody asks for a trace. In this process, 100,000
   calls of an end_step-like function (a clock read and a little bookkeeping, as
   ``TorchInstrument.end_step`` starts) without and with the deep-trace check
   (``if now >= inst.trace_due: now = deep.boundary(now)``, a real :class:`DeepTrace` on a run
   directory with a control file that does not change), alternated over ``--rounds`` rounds; the
   median difference in ns per step. Also the cost of one look (the ``os.stat`` made once a
   second) in µs.
2. ``window``: what a window costs the steps it traces. ``tests/scenarios/midrun_regression.py``
   (healthy: ``--after`` past its end) runs under ``whyidle run``; this script writes
   ``--windows`` requests of ``--steps`` steps into ``RUN_DIR/control/trace.json`` a few seconds
   apart, then reads the step records: for each window, the median traced step time / the median
   untraced step time (steps after the first 50, outside every window), and the first (profiler
   start) and last (stop + export) traced steps apart, with the record's ``stop_s`` / ``export_s``.

    python benchmarks/deep_trace_cost.py [--part poll|window|both] [--rounds 7] [--windows 3] [--steps 20]

Timings from a shared 2-core machine are noisy: the medians are what to read.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from time import monotonic_ns

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Agent:
    def __init__(self, run_dir):
        self.run_dir = run_dir
        self.t_start = monotonic_ns()
        self.on_exit = []
        self.disabled = False

    def record(self, rec):
        pass

    def notice(self, msg):
        print("notice:", msg)


class _Inst:
    step = 0
    off = False
    trace_due = 1 << 62
    deep = None


def poll_cost(rounds: int, n: int = 100_000) -> dict:
    import torch

    from whyidle.instrument import deep_trace, patches

    run_dir = tempfile.mkdtemp(prefix="whyidle-deep-")
    os.makedirs(os.path.join(run_dir, "control"))
    with open(os.path.join(run_dir, "control", "trace.json"), "w") as f:  # served once, then unchanged
        json.dump({"id": "old", "steps": 1, "ranks": [99], "pids": None, "reason": "", "t": 0}, f)
    inst = _Inst()
    deep = deep_trace.install(_Agent(run_dir), torch, inst)
    acc = {"t": 0, "n": 0}

    def plain():
        now = monotonic_ns()
        acc["t"] = now
        acc["n"] += 1

    def polled():
        now = monotonic_ns()
        if now >= inst.trace_due:
            now = deep.boundary(now)
        acc["t"] = now
        acc["n"] += 1

    def per_call(fn) -> float:
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        return (time.perf_counter_ns() - t0) / n

    diffs, base = [], []
    for _ in range(rounds):
        a, b = per_call(plain), per_call(polled)
        base.append(a)
        diffs.append(b - a)
    looks = []
    for _ in range(2000):
        inst.trace_due = 0
        t0 = time.perf_counter_ns()
        deep.boundary(monotonic_ns())
        looks.append(time.perf_counter_ns() - t0)
    patches.restore()
    return {"calls": n, "rounds": rounds, "plain_ns_per_step": round(statistics.median(base), 1),
            "poll_ns_per_step": round(statistics.median(diffs), 1),
            "look_us": round(statistics.median(looks) / 1000, 2),
            "look_share_at_1_per_s": f"{statistics.median(looks) / 1e9:.2e}"}


def _records(run_dir, kind=None):
    out = []
    for path in glob.glob(os.path.join(run_dir, "proc-*.jsonl")):
        with open(path) as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if kind is None or rec.get("k") == kind:
                    out.append(rec)
    return out


def window_cost(windows: int, steps: int) -> dict:
    run_dir = os.path.join(tempfile.mkdtemp(prefix="whyidle-deep-"), "run")
    seconds = 8 + 4 * windows
    cmd = [sys.executable, "-m", "whyidle", "run", "-q", "--out", run_dir, "--no-html", "--", sys.executable,
           os.path.join(REPO, "tests", "scenarios", "midrun_regression.py"), "--seconds", str(seconds),
           "--after", "1000"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.monotonic() + 60
    while not _records(run_dir, "step") and time.monotonic() < end:
        time.sleep(0.1)
    time.sleep(3)
    control = os.path.join(run_dir, "control")
    os.makedirs(control, exist_ok=True)
    for w in range(windows):
        req = {"id": f"w{w}", "steps": steps, "ranks": None, "pids": None, "reason": "benchmark",
               "t": monotonic_ns()}
        with open(os.path.join(control, "trace.json.tmp"), "w") as f:
            json.dump(req, f)
        os.replace(os.path.join(control, "trace.json.tmp"), os.path.join(control, "trace.json"))
        time.sleep(4)
    proc.wait(timeout=300)
    step_s = {}
    for rec in _records(run_dir):
        if rec["k"] == "step":
            step_s[rec["i"]] = (rec["t1"] - rec["t0"]) / 1e9
        elif rec["k"] == "steps":
            for row in rec["rows"]:
                step_s[row[0]] = (row[2] - row[1]) / 1e9
    wins = sorted(_records(run_dir, "trace_window"), key=lambda r: r["first_step"])
    traced = {i for w in wins for i in range(w["first_step"], w["first_step"] + w["steps"] + 1)}
    untraced = [s for i, s in step_s.items() if i >= 50 and i not in traced]
    med = statistics.median(untraced)
    out = {"untraced_step_ms": round(med * 1e3, 2), "untraced_steps": len(untraced), "windows": []}
    for w in wins:
        idx = list(range(w["first_step"], w["first_step"] + w["steps"]))
        times = [step_s[i] for i in idx if i in step_s]
        out["windows"].append({
            "id": w["id"], "steps": w["steps"], "error": w["error"],
            "median_traced_ratio": round(statistics.median(times[1:-1]) / med, 3),
            "first_step_ratio": round(times[0] / med, 2), "last_step_ratio": round(times[-1] / med, 2),
            "window_ratio": round(sum(times) / (len(times) * med), 3),
            "after_window_ratio": round(step_s.get(idx[-1] + 1, float("nan")) / med, 2),
            "stop_s": w["stop_s"], "export_s": w["export_s"]})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--part", choices=("poll", "window", "both"), default="both")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--windows", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    if args.part in ("poll", "both"):
        print("poll", json.dumps(poll_cost(args.rounds)))
    if args.part in ("window", "both"):
        print("window", json.dumps(window_cost(args.windows, args.steps), indent=1))


if __name__ == "__main__":
    main()
