"""What timing a rank's collectives adds per call and per step (in-process, no second rank needed).

whyidle's collective timing (``whyidle.instrument.collectives``) sits on three paths of a DDP
step: the wrapper around each blocking ``torch.distributed`` collective the program calls, the
communication hook DDP calls once per gradient bucket (whyidle's trampoline around the reducing
hook), and ``CollectiveTimer.end_step`` when the step ends. Each is timed here against the same
call without whyidle, many thousand times, in one process (a 1-rank gloo group, so the
backend is known), around a collective and a hook that do nothing (a gloo all-reduce's own cost
varies by more than whyidle's from one batch of calls to the next):

* ``wrapper``: a blocking collective (a function taking a 4-element tensor) through whyidle's
  wrapper, against the bare call;
* ``first bucket``: the trampoline around a hook returning a completed future, for the step's first
  bucket (``arrive`` and ``add_done_callback``: its completion time); ``other bucket``: for the
  step's later buckets (``arrive`` only);
* ``end_step``: closing a step that had one collective and one bucket (a row appended; a
  ``colls`` record every 256 steps).

Prints ns per call and, for a step with ``--calls`` program collectives and ``--buckets`` gradient
buckets, the µs whyidle adds per step and that as a share of ``--step-ms``.

    python benchmarks/collectives_cost.py [--n 20000] [--calls 1] [--buckets 2] [--step-ms 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time


def per_call_ns(fn, n: int, rounds: int = 5) -> float:
    """Median over ``rounds`` of the mean ns per call of ``fn`` over ``n`` calls."""
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        out.append((time.perf_counter_ns() - t0) / n)
    return statistics.median(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--calls", type=int, default=1, help="program collectives per step")
    ap.add_argument("--buckets", type=int, default=2, help="DDP gradient buckets per step")
    ap.add_argument("--step-ms", type=float, default=10.0)
    args = ap.parse_args(argv)

    import torch
    import torch.distributed as dist

    from whyidle.instrument import collectives as C

    torch.set_num_threads(1)
    store = os.path.join(tempfile.mkdtemp(prefix="whyidle-colls-"), "store")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    rows = []
    timer = C.CollectiveTimer(rows.append, threading.get_ident())
    is_compiling = getattr(torch.compiler, "is_compiling", lambda: False)
    t = torch.ones(4)

    def collective(tensor, op=None, group=None, async_op=False):  # the shape of dist.all_reduce
        return None

    timed = C._timed(timer, dist, collective, is_compiling)
    done = torch.futures.Future()
    done.set_result(None)

    class Bucket:  # what DDP hands a comm hook
        def index(self):
            return 0

    bucket = Bucket()
    state = C._Trampoline(lambda _state, _bucket: done, None)
    hook = C._trampoline_hook(timer)

    def first_bucket():
        timer.slot = None
        hook(state, bucket)

    def other_bucket():
        timer.slot = [1, 0]
        hook(state, bucket)

    def step_end():
        timer.n, timer.ns, timer.buckets, timer.slot = 1, 1000, 1, [1, 2]
        timer.end_step(0)

    bare = per_call_ns(lambda: collective(t), args.n)
    res = {
        "wrapper": per_call_ns(lambda: timed(t), args.n) - bare,
        "first_bucket": per_call_ns(first_bucket, args.n) - per_call_ns(lambda: state.inner(None, bucket), args.n),
        "other_bucket": per_call_ns(other_bucket, args.n) - per_call_ns(lambda: state.inner(None, bucket), args.n),
        "end_step": per_call_ns(step_end, args.n),
    }
    dist.destroy_process_group()
    per_step_us = (args.calls * res["wrapper"] + res["first_bucket"] + max(0, args.buckets - 1) * res["other_bucket"]
                   + res["end_step"]) / 1e3
    print(json.dumps({"added_ns": {k: round(v) for k, v in res.items()}, "calls": args.calls,
                      "buckets": args.buckets, "per_step_us": round(per_step_us, 2),
                      "share_of_step": round(per_step_us / (args.step_ms * 1e3), 5), "step_ms": args.step_ms}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
