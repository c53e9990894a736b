"""Cost of the CUDA timeline on the host, and speed of its analysis (no GPU needed).

1. Mark cost: ``CudaTimeline.mark()`` with an event whose ``record()`` does nothing, against a
   baseline of the same number of empty Python method calls, in the same process. This is
   whyidle's own Python cost per mark; a real ``torch.cuda.Event.record()`` adds the CUDA call
   (a few µs, measure it on a GPU with benchmarks/gpu_check.sh).
2. Analysis speed: a synthetic run of ``--steps`` steps, each with 10 phase marks, 3 probes and a
   sync, analyzed by :func:`whyidle.analysis.gpu_idle.gpu_idle`; prints marks/s.

    python benchmarks/timeline_cost.py [--marks 200000] [--steps 100000]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from whyidle.analysis.gpu_idle import gpu_idle  # noqa: E402
from whyidle.instrument.cuda import CudaTimeline  # noqa: E402


class NullEvent:
    def record(self):
        pass

    def query(self):
        return True

    def elapsed_time(self, other):
        return 0.0


class Baseline:
    def mark(self, phase, kind="phase", step=-1, extra=None):
        pass


def mark_cost(n: int) -> tuple[float, float]:
    """(seconds per mark, seconds per baseline call)."""
    tl = CudaTimeline(NullEvent)
    base = Baseline()
    results = []
    for target in (base, tl):
        t0 = time.perf_counter()
        for i in range(n):
            target.mark("forward", "phase", i)
            if i % 1000 == 999 and target is tl:
                tl.poll()
        results.append((time.perf_counter() - t0) / n)
    return results[1], results[0]


def synthetic_records(steps: int) -> tuple[list[dict], tuple[int, int]]:
    """A run of 10 ms steps whose GPU is starved 8 ms of each: data wait 4 ms, 1 ms before the forward
    kernel, 1 ms of backward Python beyond its 1 ms of queued work, 1 ms of host code after the
    optimizer and 1 ms after a sync (the analysis must give 0.800)."""
    ms = 1_000_000
    h, g, phase, kind, extra = [], [], [], [], []
    t = 0
    for i in range(steps):
        base = i * 10 * ms
        marks = [(0, "other", "step"), (0, "data", "phase"), (4 * ms, "other", "phase"),
                 (4 * ms, "forward", "phase"), (5 * ms, "other", "phase"), (5 * ms, "backward", "phase"),
                 (7 * ms, "other", "phase"), (7 * ms, "optimizer", "phase"), (8 * ms, "other", "phase"),
                 (9 * ms, "other", "sync")]
        for off, ph, kd in marks:
            t = base + off
            h.append(t)
            g.append(t + (ms if kd == "phase" and ph in ("backward", "optimizer") else 0))
            phase.append(ph)
            kind.append(kd)
            if kd == "sync":
                extra.append([len(h) - 1, ["train.py:40 train", "train.py:40 train", None]])
        for k in range(3):
            h.append(base + 9 * ms + (k + 1) * 250_000)
            g.append(h[-1])
            phase.append("other")
            kind.append("probe")
            extra.append([len(h) - 1, ["train.py:50 log", "train.py:50 log", 3.3]])
    rec = {"k": "gpu_marks", "t": t, "h": h, "g": g, "phase": phase, "kind": kind, "step": [0] * len(h),
           "extra": extra}
    return [rec], (0, t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--marks", type=int, default=200_000)
    ap.add_argument("--steps", type=int, default=100_000)
    args = ap.parse_args()
    per_mark, per_call = mark_cost(args.marks)
    print(f"mark(): {per_mark * 1e6:.2f} µs per mark; baseline method call {per_call * 1e6:.2f} µs; "
          f"ratio {per_mark / per_call:.1f}×")
    print(f"        at 10 marks per step that is {10 * per_mark * 1e6:.0f} µs per step "
          f"({10 * per_mark / 0.010:.2%} of a 10 ms step, before the CUDA call itself)")
    records, window = synthetic_records(args.steps)
    n = len(records[0]["h"])
    t0 = time.perf_counter()
    out = gpu_idle(records, window)
    dt = time.perf_counter() - t0
    print(f"analysis: {n:,} marks ({args.steps:,} steps) in {dt:.2f} s = {n / dt:,.0f} marks/s; "
          f"starved share {out['starved_share']:.3f} (expected 0.800)")


if __name__ == "__main__":
    main()
