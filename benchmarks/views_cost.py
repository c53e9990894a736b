"""Cost of the views written at the end of every run (report.html, timeline.json) on a long run.

A synthetic run of ``--steps`` steps (``tests/synthetic_run.py``: ~50 ms input-bound steps with
phase spans, one fake GPU with NVML samples and GPM windows) is loaded and analyzed in a fresh
process per case: the analysis alone (the baseline: what ``whyidle report`` did before the views),
then the analysis plus each view. Prints, per case, wall seconds and peak RSS (``ru_maxrss``) and
each view's extra time and memory over the baseline measured in this same run, plus file sizes.
Goals: each view adds ≲ 40 MB and ≲ 2 s for 100,000 steps.

    python benchmarks/views_cost.py [--steps 100000] [--dir /tmp/whyidle-views-bench]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CASE = r"""
import json, resource, sys, time
t = time.perf_counter()
from whyidle import pipeline
from whyidle.report.build import build_report
run_dir, view, out = sys.argv[1], sys.argv[2], sys.argv[3]
a = pipeline.analyze_run(run_dir)
report = build_report(a.facts, a.verdict, a.findings, a.run.problems)
if view == "html":
    pipeline.write_parts(out, pipeline.render_html_parts(a, report))
elif view == "timeline":
    pipeline.write_timeline(a, out)
print(json.dumps({"s": time.perf_counter() - t, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def case(run_dir: str, view: str, out: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"))
    proc = subprocess.run([sys.executable, "-c", CASE, run_dir, view, out], capture_output=True, text=True,
                          env=env, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--dir", default=None, help="where the synthetic run goes (default: a temporary folder)")
    args = parser.parse_args()
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from synthetic_run import write_run

    work = args.dir or tempfile.mkdtemp(prefix="whyidle-views-")
    run_dir = os.path.join(work, f"run-{args.steps}")
    if not os.path.exists(os.path.join(run_dir, "meta.json")):
        write_run(run_dir, steps=args.steps, gpu=True, ph=True)
    base = case(run_dir, "none", os.devnull)
    print(f"analysis only (baseline)  {base['s']:.2f} s   peak RSS {base['rss_mb']:.0f} MB   ({args.steps:,} steps)")
    for view, name in (("html", "report.html"), ("timeline", "timeline.json")):
        out = os.path.join(work, name)
        r = case(run_dir, view, out)
        print(f"+ {name:<14}  {r['s']:.2f} s   peak RSS {r['rss_mb']:.0f} MB   "
              f"extra {r['s'] - base['s']:+.2f} s ({r['s'] / base['s']:.2f}× the baseline), "
              f"{r['rss_mb'] - base['rss_mb']:+.0f} MB   file {os.path.getsize(out) / 2**20:.1f} MB")


if __name__ == "__main__":
    main()
