"""`whyidle trace` on a folder of many rank traces: time, peak memory, and the culprit found.

Builds a synthetic job folder of ``--ranks`` rank traces from one real Kineto trace of
``../shared/traces`` (default: the 54 MB V100 DDP trace, 216k events, NCCL all-reduces): every rank
is the real trace with its own ``distributedInfo.rank`` and its NCCL kernels started earlier, each
kernel's end kept (a collective ends on every rank when the last one has arrived, so a rank that
arrives early waits longer): every kernel by a uniform 0–``--jitter-us``, and each step's first
NCCL kernel on every rank but the culprit (``--culprit``) by ``--late-share`` of the median
step as well — the culprit arrives that much later than the others. Files are ``.json.gz``.

Then, each in a fresh process whose tree's resident memory is sampled every 20 ms:

* ``whyidle``: ``whyidle trace FOLDER --json`` (ranks read in parallel worker processes, each
  reduced to a summary; ``--workers`` to force a count);
* ``all-in-memory``: the same reader and analysis, but every rank's columns held at once before
  the job is analyzed (how HTA's ``TraceAnalysis`` holds a job, and what whyidle did before);
* ``hta`` (with ``--hta-python PY``, a venv with ``HolisticTraceAnalysis``): HTA's
  ``TraceAnalysis(trace_dir=FOLDER)`` load alone (it has no straggler analysis).

Prints one JSON line per variant (wall seconds, peak MB of the process tree, the culprit and
its share) and a summary line. ``python benchmarks/trace_ranks.py [--ranks 64] [--base NAME]
[--culprit 37] [--late-share 0.15] [--jitter-us 200] [--keep DIR] [--workers N] [--hta-python PY]``
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time

import psutil

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRACES = os.path.join(os.path.dirname(REPO), "shared", "traces")
DEFAULT_BASE = "hta_v100_2rank_job_rank1"

ALL_IN_MEMORY = r"""
import sys
from whyidle.analysis.trace_job import job_metrics, summarize
from whyidle.record.kineto import read_trace, trace_files
traces = [read_trace(p, workers=1) for p in trace_files(sys.argv[1])]   # every rank held at once
job = job_metrics([summarize(t) for t in traces])
s = job["straggler"] or {}
print("CULPRIT", s.get("rank"), s.get("culprit_share"))
"""

HTA_LOAD = r"""
import logging, sys
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=sys.argv[1])
print("RANKS", len(a.t.traces))
"""


def build(folder: str, base: str, ranks: int, culprit: int, late_share: float, jitter_us: float, seed: int) -> int:
    """Writes the job folder; returns the bytes of JSON per rank."""
    path = next(os.path.join(TRACES, base, f) for f in sorted(os.listdir(os.path.join(TRACES, base)))
                if f.endswith((".json", ".json.gz")))
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        doc = json.load(f)
    events = doc.pop("traceEvents")
    nccl = [e for e in events if e.get("cat") in ("kernel", "Kernel") and str(e.get("name", "")).lower().startswith("nccl")]
    rest = json.dumps([e for e in events if not (e.get("cat") in ("kernel", "Kernel")
                                                 and str(e.get("name", "")).lower().startswith("nccl"))])[1:-1]
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))
    firsts = set()  # each step's first NCCL kernel: where the ranks meet after the step's own work
    for a, b in steps:
        inside = [i for i, e in enumerate(nccl) if a <= e["ts"] < b]
        if inside:
            firsts.add(min(inside, key=lambda i: nccl[i]["ts"]))
    step_us = sorted(b - a for a, b in steps)[len(steps) // 2] if steps else 0.0
    late = late_share * step_us
    rng = random.Random(seed)
    os.makedirs(folder, exist_ok=True)
    size = 0
    for r in range(ranks):
        mine = []
        for i, e in enumerate(nccl):
            early = (late if i in firsts and r != culprit else 0.0) + rng.uniform(0, jitter_us)
            args = dict(e.get("args") or {})
            if "Group size" in args:  # the whole job's process group now
                args.update({"Group size": ranks, "Process Group Ranks": str(list(range(ranks)))})
            mine.append({**e, "ts": e["ts"] - early, "dur": e["dur"] + early, "args": args})
        head = {**doc, "distributedInfo": {**(doc.get("distributedInfo") or {}), "rank": r, "world_size": ranks}}
        text = (json.dumps(head)[:-1] + ', "traceEvents": [' + rest + ", " + json.dumps(mine)[1:-1] + "]}").encode()
        size = len(text)
        with gzip.open(os.path.join(folder, f"rank-{r}.json.gz"), "wb", compresslevel=1) as f:
            f.write(text)
    return size


def measure(cmd: list[str]) -> dict:
    """Runs ``cmd``; wall seconds, peak resident MB of its process tree (sampled every 20 ms),
    return code and output."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = [0]
    done = threading.Event()

    def sample():
        root = psutil.Process(proc.pid)
        while not done.is_set():
            try:
                tree = [root, *root.children(recursive=True)]
                peak[0] = max(peak[0], sum(p.memory_info().rss for p in tree if p.is_running()))
            except psutil.Error:
                pass
            done.wait(0.02)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out, err = proc.communicate()
    done.set()
    th.join()
    return {"wall_s": round(time.perf_counter() - t0, 2), "peak_mb": round(peak[0] / 2**20, 1),
            "rc": proc.returncode, "out": out, "err": err[-500:]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--base", default=DEFAULT_BASE)
    ap.add_argument("--culprit", type=int, default=37)
    ap.add_argument("--late-share", type=float, default=0.15)
    ap.add_argument("--jitter-us", type=float, default=200.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--keep", default=None, help="build the folder here and keep it")
    ap.add_argument("--hta-python", default=None)
    ap.add_argument("--skip-all-in-memory", action="store_true")
    args = ap.parse_args(argv)
    if not os.path.isdir(os.path.join(TRACES, args.base)):
        print(f"no {os.path.join(TRACES, args.base)}: nothing to build from", file=sys.stderr)
        return 2
    tmp = None if args.keep else tempfile.TemporaryDirectory(prefix="whyidle-ranks-")
    folder = args.keep or tmp.name
    t0 = time.perf_counter()
    per_rank = build(folder, args.base, args.ranks, args.culprit, args.late_share, args.jitter_us, args.seed)
    gz = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
    print(json.dumps({"built": folder, "ranks": args.ranks, "base": args.base, "json_mb_per_rank": round(per_rank / 2**20, 1),
                      "json_gb_total": round(per_rank * args.ranks / 2**30, 2), "gz_mb_total": round(gz / 2**20, 1),
                      "build_s": round(time.perf_counter() - t0, 1), "cores": len(os.sched_getaffinity(0))}))
    rows = {}
    with tempfile.TemporaryDirectory() as out:
        rep_path = os.path.join(out, "r.json")
        cmd = [sys.executable, "-m", "whyidle", "trace", folder, "--json", rep_path]
        r = measure(cmd + (["--workers", str(args.workers)] if args.workers else []))
        rep = {}
        if r["rc"] == 0:
            with open(rep_path) as f:
                rep = json.load(f)
        s = rep.get("straggler") or {}
        rows["whyidle"] = {**{k: r[k] for k in ("wall_s", "peak_mb", "rc")}, "culprit": s.get("rank"),
                           "culprit_share": s.get("culprit_share"), "excess_ms": round((s.get("excess_s") or 0) * 1e3, 2),
                           "verdict": rep.get("verdict"), "matched": (rep.get("collectives") or {}).get("matched")}
    if not args.skip_all_in_memory:
        r = measure([sys.executable, "-c", ALL_IN_MEMORY, folder])
        words = (r["out"].split("CULPRIT", 1)[-1].split() + [None, None])[:2] if "CULPRIT" in r["out"] else [None, None]
        rows["all-in-memory"] = {**{k: r[k] for k in ("wall_s", "peak_mb", "rc")}, "culprit": words[0]}
    if args.hta_python:
        r = measure([args.hta_python, "-c", HTA_LOAD, folder])
        rows["hta"] = {**{k: r[k] for k in ("wall_s", "peak_mb", "rc")}, "err": r["err"][-200:] if r["rc"] else None}
    for name, row in rows.items():
        print(json.dumps({"variant": name, **row}))
    if tmp:
        tmp.cleanup()
    ok = rows["whyidle"]["rc"] == 0 and rows["whyidle"]["culprit"] == args.culprit
    print(json.dumps({"culprit_found": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
