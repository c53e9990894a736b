"""Time and memory of reporting one multi-node job from its node runs (``whyidle report DIR ...``).

Writes a synthetic job (``tests/synthetic_run.py`` ``write_job``: ``--nodes`` node run
directories of ``--ranks-per-node`` ranks, ``--steps`` steps each, one rank late at every
all-reduce) and times :func:`whyidle.pipeline.analyze_run` over all of them in a fresh process,
printing the wall time, the peak RSS (``ru_maxrss``), the bytes on disk per rank and the
straggler found.

    python benchmarks/merge_scale.py [--nodes 32] [--ranks-per-node 8] [--steps 600]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = r'''
import resource, sys, time
from whyidle.pipeline import analyze_run
t = time.perf_counter()
a = analyze_run(sys.argv[1:])
dt = time.perf_counter() - t
s = a.facts.straggler or {}
print(f"analyze {dt:.2f} s  peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB  "
      f"ranks {len(a.facts.ranks)}  straggler {s.get('rank')} (measured {s.get('measured')})  verdict {a.verdict}")
'''


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=32)
    p.add_argument("--ranks-per-node", type=int, default=8)
    p.add_argument("--steps", type=int, default=600)
    args = p.parse_args()
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    from synthetic_run import write_job

    with tempfile.TemporaryDirectory() as root:
        t = time.perf_counter()
        world = args.nodes * args.ranks_per_node
        dirs = write_job(root, args.nodes, args.ranks_per_node, steps=args.steps, late=world - 1)
        size = sum(os.path.getsize(os.path.join(d, f)) for d in dirs for f in os.listdir(d) if f.startswith("proc-"))
        print(f"{world} ranks on {args.nodes} nodes, {args.steps} steps (~50 ms each, {args.steps * 0.05:.0f} s): "
              f"written in {time.perf_counter() - t:.1f} s, {size / world / 1024:.0f} KB of proc records per rank")
        subprocess.run([sys.executable, "-c", CHILD, *dirs], check=True)


if __name__ == "__main__":
    main()
