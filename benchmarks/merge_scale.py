"""Time and memory of reporting one multi-node job from its node runs (``whyidle report DIR ...``).

Writes a synthetic job (``tests/synthetic_run.py`` ``write_job``: ``--nodes`` node run
directories of ``--ranks-per-node`` ranks, ``--steps`` steps each, the last rank late at every
all-reduce) and times :func:`whyidle.pipeline.analyze_run` over all of them in a fresh process,
printing the wall time, the peak RSS (``ru_maxrss``), the bytes on disk per rank and what it
found (straggler, culprit share, verdict, findings).

``--summaries``: ``none`` (node runs without rank summaries, as made before they existed: every
rank's records are read); ``all`` (every rank's records on disk, and the rank summaries each
node's report writes at the end of its run, made from them by whyidle's own writer,
:func:`whyidle.pipeline.summarize_ranks`); ``lean`` (the same summaries, but only rank 0 and the
late rank keep their step records on disk: the other ranks' summaries are made by whyidle's
summarizer from their node's step records, which a synthetic node's ranks share, and written by
whyidle's writer; 1,024 ranks × 36,000 steps of full records would be ~18 GB). ``--compare``
(with ``all``) merges a second time with the summaries set aside (the full read) and says whether
both found the same.

    python benchmarks/merge_scale.py [--nodes 32] [--ranks-per-node 8] [--steps 600]
        [--summaries none|all|lean] [--compare] [--dir DIR [--write-only]]

``--dir`` keeps the job there (written when missing), so it can be written once and measured under
a lock: ``python benchmarks/merge_scale.py --dir D ... --write-only``, then
``flock LOCK python benchmarks/merge_scale.py --dir D ...``. Issue 35's goal (an hour of a 1,024-rank
job at 100 ms steps, ≤ 30 s and ≤ 1 GB): ``--nodes 128 --ranks-per-node 8 --steps 36000 --summaries
lean`` (~2 minutes and ~410 MB to write); the parity check: ``--nodes 32 --ranks-per-node 8 --steps
3600 --summaries all --compare``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = r'''
import json, resource, sys, time
from whyidle.pipeline import analyze_run
t = time.perf_counter()
a = analyze_run(sys.argv[1:])
dt = time.perf_counter() - t
s = a.facts.straggler or {}
out = {"s": round(dt, 2), "peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
       "ranks": len(a.facts.ranks), "summaries": len(getattr(a.run, "summaries", {})), "straggler": s.get("rank"),
       "measured": s.get("measured"), "culprit_share": s.get("culprit_share"), "verdict": a.verdict,
       "findings": [f["id"] for f in a.findings], "shares": (a.facts.step or {}).get("shares")}
print(json.dumps(out))
'''
NAMES = ("ranks.json", "ranks.npy")


def merge(dirs: list[str]) -> dict:
    """The child's figures of one merge in a fresh process."""
    proc = subprocess.run([sys.executable, "-c", CHILD, *dirs], capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"the merge failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def show(label: str, r: dict) -> None:
    print(f"{label}: analyze {r['s']:.2f} s  peak RSS {r['peak_mb']} MB  ranks {r['ranks']} "
          f"({r['summaries']} from summaries)  straggler {r['straggler']} (measured {r['measured']}, culprit share "
          f"{r['culprit_share']})  verdict {r['verdict']}  findings {r['findings']}")


def same(a: dict, b: dict) -> list[str]:
    """What differs between two merges' figures (shares within 0.5 pp)."""
    out = [k for k in ("ranks", "straggler", "measured", "verdict", "findings") if a[k] != b[k]]
    if (a["culprit_share"] is None) != (b["culprit_share"] is None) or \
            abs((a["culprit_share"] or 0) - (b["culprit_share"] or 0)) > 0.005:
        out.append("culprit_share")
    out += [f"shares.{k}" for k in a["shares"] or {} if abs(a["shares"][k] - (b["shares"] or {}).get(k, 0)) > 0.005]
    return out


def write(root: str, args) -> list[str]:
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    from synthetic_run import write_job

    world = args.nodes * args.ranks_per_node
    t = time.perf_counter()
    dirs = write_job(root, args.nodes, args.ranks_per_node, steps=args.steps, late=world - 1,
                     summaries=args.summaries != "none", full={0, world - 1} if args.summaries == "lean" else None)
    print(f"written in {time.perf_counter() - t:.1f} s")
    with open(os.path.join(root, "job.json"), "w") as f:
        json.dump({"args": key(args), "dirs": dirs}, f)
    return dirs


def key(args) -> list:
    return [args.nodes, args.ranks_per_node, args.steps, args.summaries]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=32)
    p.add_argument("--ranks-per-node", type=int, default=8)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--summaries", choices=("none", "all", "lean"), default="none")
    p.add_argument("--compare", action="store_true", help="with --summaries all: merge again without them")
    p.add_argument("--dir", help="keep the job in DIR (written when it holds no job of these arguments)")
    p.add_argument("--write-only", action="store_true")
    args = p.parse_args()
    if args.compare and args.summaries != "all":
        p.error("--compare needs --summaries all (every rank's records on disk)")
    with tempfile.TemporaryDirectory() as tmp:
        root = args.dir or tmp
        try:
            with open(os.path.join(root, "job.json")) as f:
                job = json.load(f)
            dirs = job["dirs"] if job["args"] == key(args) else None
        except (OSError, ValueError, KeyError):
            dirs = None
        world = args.nodes * args.ranks_per_node
        print(f"{world} ranks on {args.nodes} nodes, {args.steps} steps (~50 ms each, {args.steps * 0.05:.0f} s), "
              f"summaries: {args.summaries}")
        if dirs is None:
            if os.path.isdir(root) and os.listdir(root) and root != tmp:
                p.error(f"{root}: holds something else; give an empty or new directory")
            dirs = write(root, args)
        size = sum(os.path.getsize(os.path.join(d, f)) for d in dirs for f in os.listdir(d) if f.startswith("proc-"))
        extra = sum(os.path.getsize(os.path.join(d, f)) for d in dirs for f in NAMES if os.path.exists(os.path.join(d, f)))
        print(f"{size / world / 1024:.1f} KB of proc records and {extra / world / 1024:.1f} KB of rank summaries per rank")
        if args.write_only:
            return
        first = merge(dirs)
        show("merge", first)
        if args.compare:
            for d in dirs:
                for name in NAMES:
                    os.replace(os.path.join(d, name), os.path.join(d, name + ".aside"))
            try:
                second = merge(dirs)
            finally:
                for d in dirs:
                    for name in NAMES:
                        os.replace(os.path.join(d, name + ".aside"), os.path.join(d, name))
            show("merge without the summaries (every rank read in full)", second)
            diff = same(first, second)
            print("same straggler, culprit share, verdict, findings and shares" if not diff
                  else f"DIFFERENT: {', '.join(diff)}")


if __name__ == "__main__":
    main()
