"""Load: a 24-hour-equivalent run (1,000,000 steps) — record size, report time and memory, live line.

A run directory is written as whyidle would write it for ``--steps`` training steps of
``--step-ms`` (default 1 ms: 1 kHz) by ``tests/load_run.py`` (whyidle's own agent code on a
simulated clock, see there; ``--cuda`` adds the CUDA timeline records and a GPU's samples), then
measured. Growth law: every figure is printed per step (bytes) and per million steps (seconds, MB)
for each size, so linear growth reads as a flat column. 1,000,000 steps of 1 ms are 1000 s of host
samples; ``--step-ms 86.4`` makes them a real 24 h job (345,600 host ticks, every step in full detail).

**What is measured**, each in a fresh process, one after the other (heavy: run it alone):

1. bytes on disk per file, and per step; host.jsonl and gpu.jsonl per hour;
2. the end-of-run report (what ``whyidle run`` does after the command and ``whyidle report RUN_DIR``
   does, :func:`whyidle.pipeline.report_run`: report.json, report.html, timeline.json): wall seconds
   per stage (load, analysis + diagnosis, report, html, timeline) and peak RSS (``ru_maxrss``) after
   each; the sizes of report.html and timeline.json;
3. the live line (:class:`whyidle.report.live.LiveStatus` over
   :class:`whyidle.record.tail.StepTail`): the trainer's file is replayed into a growing file one
   second of simulated time at a time (a poll per second, as ``whyidle run`` ticks) and each poll
   is timed; its RSS at the first and last poll shows whether the tail's memory grows with the run;
4. the agent's own memory: the generating process's RSS after 10,000 steps and at the end;
5. with ``--live-report``, the report of the run while it is written (``whyidle report`` of a live
   run): a copy whose ``meta.json`` has no end and whose trainer file lacks its last 1 % of lines,
   which a writer appends while the report reads.

    python benchmarks/load.py [--steps 10000,100000,1000000] [--step-ms 1] [--cuda] [--dir DIR]
    python benchmarks/load.py --steps 1000000 --step-ms 86.4   # a real 24 h of host samples

Runs already written under ``--dir`` are reused (delete them after changing tests/load_run.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from load_run import HOST_S, TRAINER, S, write_run

REPORT = r"""
import json, os, resource, sys, time
t = time.perf_counter()
def rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
run_dir = sys.argv[1]
from whyidle import pipeline
from whyidle.analysis.run import analyze
from whyidle.diagnose import diagnose
from whyidle.record.reader import load_run
from whyidle.record.writer import write_json_atomic
from whyidle.report.build import build_report
out, marks = {"import_s": time.perf_counter() - t, "rss_import_mb": rss()}, time.perf_counter()
def lap(name):
    global marks
    now = time.perf_counter()
    out[name + "_s"], out["rss_" + name + "_mb"], marks = now - marks, rss(), now
from whyidle.gcpause import gc_paused
with gc_paused():  # as pipeline.analyze_run reads and analyzes
    run = load_run(run_dir); lap("load")
    facts = analyze(run); verdict, findings = diagnose(facts); lap("analyze")
a = pipeline.Analyzed(run, facts, verdict, findings)
report = build_report(facts, verdict, findings, run.problems); lap("report")
pipeline.write_parts(os.path.join(run_dir, "report.html"), pipeline.render_html_parts(a, report)); lap("html")
pipeline.write_timeline(a, os.path.join(run_dir, "timeline.json")); lap("timeline")
write_json_atomic(os.path.join(run_dir, "report.json"), report)
out["total_s"] = time.perf_counter() - t
out["peak_rss_mb"] = rss()
out["steps"] = report["metrics"]["steps"]
print(json.dumps(out))
"""

TAIL = r"""
import json, os, sys, time
src, work, chunk_ns = sys.argv[1], sys.argv[2], int(sys.argv[3])
sim_now = [0]
time.monotonic_ns = lambda: sim_now[0]  # the live line's "now" is the replayed file's
from whyidle.record.tail import StepTail
from whyidle.report.live import LiveStatus
def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
class Sampler:
    latest = {"host": [{"k": "host", "t": 0, "percpu_busy_s": [0.0, 0.0]}]}
dst = os.path.join(work, os.path.basename(src))
open(dst, "wb").close()
live = LiveStatus(StepTail(work), Sampler(), sys.stderr, tty=False)
times, rss, lines, n, next_t = [], [], [], 0, None
with open(src, "rb") as f, open(dst, "ab") as g:
    pending = []
    for raw in f:
        pending.append(raw)
        t = json.loads(raw).get("t") if b'"t":' in raw else None
        if t is None:
            continue
        if next_t is None:
            next_t = t + chunk_ns
        if t < next_t:
            continue
        g.write(b"".join(pending)); g.flush(); pending = []
        sim_now[0] = t
        t0 = time.perf_counter()
        lines.append(live.line())
        times.append(time.perf_counter() - t0)
        rss.append(rss_mb())
        next_t += chunk_ns
k = max(1, len(times) // 10)
print(json.dumps({"polls": len(times), "first_ms": 1000 * sum(times[:k]) / k, "last_ms": 1000 * sum(times[-k:]) / k,
                  "max_ms": 1000 * max(times), "mean_ms": 1000 * sum(times) / len(times),
                  "rss_first_mb": rss[min(k, len(rss) - 1)], "rss_last_mb": rss[-1], "last_line": lines[-1]}))
"""


LIVE = r"""
import json, os, shutil, subprocess, sys, time
src, live, code, keep = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
# the run as it was at hour 24 of a longer job: meta without its end, the trainer's file short of
# its last lines, which a writer appends (ten lines every 10 ms) while the report reads
os.makedirs(live, exist_ok=True)
for name in os.listdir(src):
    if name.endswith(".jsonl"):
        shutil.copyfile(os.path.join(src, name), os.path.join(live, name))
with open(os.path.join(src, "meta.json")) as f:
    meta = json.load(f)
for key in ("exit_t", "ended_utc", "end_t", "wall_s", "exit_code", "signal", "interrupted"):
    meta.pop(key, None)
meta["run_dir"] = live
with open(os.path.join(live, "meta.json"), "w") as f:
    json.dump(meta, f)
path = os.path.join(live, next(n for n in os.listdir(live) if n.startswith("proc-")))
with open(path, "rb") as f:
    f.seek(int(os.path.getsize(path) * keep))
    f.readline()
    cut = f.tell()
    rest = f.read()
os.truncate(path, cut)
WRITER = ("import sys, time\n"
          "lines = sys.stdin.buffer.read().splitlines(keepends=True)\n"
          "with open(sys.argv[1], 'ab', buffering=0) as g:\n"
          "    for k in range(0, len(lines), 10):\n"
          "        g.write(b''.join(lines[k:k + 10])); time.sleep(0.01)\n")
writer = subprocess.Popen([sys.executable, "-c", WRITER, path], stdin=subprocess.PIPE)
writer.stdin.write(rest)
writer.stdin.close()
time.sleep(0.5)
size0 = os.path.getsize(path)
out = subprocess.run([sys.executable, "-c", code, live], capture_output=True, text=True, check=True)
grew = os.path.getsize(path) - size0
writer.kill()
writer.wait()
rep = json.loads(out.stdout.strip().splitlines()[-1])
rep["grew_bytes"] = grew
print(json.dumps(rep))
"""


#: The end-of-run report's targets (issue 35): (steps, hours of samples, seconds, peak MB, what).
GOALS = ((1_000_000, 1_000 / 3600, 5, 300, "1,000,000 steps of 1 ms"),
         (1_000_000, 24, 20, 500, "a 24-hour job of 86.4 ms steps"),
         (3_000_000, 72, 30, 600, "a 72-hour job of 86.4 ms steps"))


def _child(code: str, *args: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"))
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, check=False)
    if proc.returncode:
        raise SystemExit(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def sizes(run_dir: str) -> dict[str, int]:
    """File name → bytes, for the recorded files."""
    return {n: os.path.getsize(os.path.join(run_dir, n)) for n in sorted(os.listdir(run_dir))
            if n.endswith(".jsonl") or n == "meta.json"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default="10000,100000,1000000", help="comma-separated step counts")
    parser.add_argument("--step-ms", type=float, default=1.0, help="mean step time (ms)")
    parser.add_argument("--cuda", action="store_true", help="a GPU run: CUDA timeline records and gpu.jsonl")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader worker processes in the host samples")
    parser.add_argument("--no-tail", action="store_true", help="skip the live line's measurement")
    parser.add_argument("--dir", default=None, help="where the runs go (default: a temporary folder)")
    parser.add_argument("--live-report", action="store_true",
                        help="also time the report of the run while it is written (a copy without its end, "
                             "the trainer's last 1 %% of lines appended during the report)")
    args = parser.parse_args()
    work = args.dir or tempfile.mkdtemp(prefix="whyidle-load-")
    counts = [int(s) for s in args.steps.split(",")]
    rows = []
    for n in counts:
        tag = f"run-{n}-{args.step_ms:g}ms{'-cuda' if args.cuda else ''}"
        run_dir = os.path.join(work, tag)
        t = time.perf_counter()
        if not os.path.exists(os.path.join(run_dir, "meta.json")):
            write_run(run_dir, n, args.step_ms, args.cuda, args.workers)
            print(f"{tag}: written in {time.perf_counter() - t:.1f} s", flush=True)
        sz = sizes(run_dir)
        with open(os.path.join(run_dir, "meta.json")) as f:
            span_s = json.load(f)["wall_s"]
        rep = _child(REPORT, run_dir)
        html = os.path.getsize(os.path.join(run_dir, "report.html"))
        timeline = os.path.getsize(os.path.join(run_dir, "timeline.json"))
        tail = None
        if not args.no_tail:
            with tempfile.TemporaryDirectory(prefix="whyidle-tail-") as tw:
                tail = _child(TAIL, os.path.join(run_dir, f"proc-{TRAINER}.jsonl"), tw, str(S))
        live = None
        if args.live_report:
            with tempfile.TemporaryDirectory(prefix="whyidle-live-", dir=work) as lw:
                live = _child(LIVE, run_dir, os.path.join(lw, tag), REPORT, "0.99")
        rows.append((n, span_s, sz, rep, html, timeline, tail))
        agent = None
        if os.path.exists(os.path.join(run_dir, "load-agent.json")):
            with open(os.path.join(run_dir, "load-agent.json")) as f:
                agent = json.load(f)["agent_rss_mb"]
        proc = sz[f"proc-{TRAINER}.jsonl"]
        host = sz["host.jsonl"]
        print(f"\n{n:,} steps of {args.step_ms:g} ms ({span_s:,.0f} s recorded, report says {rep['steps']:,} steps)")
        for name, b in sz.items():
            print(f"  {name:<18} {b / 2**20:9.2f} MB")
        print(f"  trainer {proc / n:.1f} B/step; host.jsonl {host / span_s * 3600 / 2**20:.2f} MB/h; "
              f"gpu.jsonl {sz['gpu.jsonl'] / span_s * 3600 / 2**20:.2f} MB/h")
        print("  report: " + ", ".join(f"{k} {rep[k + '_s']:.2f} s" for k in
                                       ("load", "analyze", "report", "html", "timeline"))
              + f" = {rep['total_s']:.2f} s (+ imports {rep['import_s']:.2f} s); "
              + "RSS after " + ", ".join(f"{k} {rep['rss_' + k + '_mb']:.0f}" for k in
                                         ("import", "load", "analyze", "html", "timeline")) + " MB")
        print(f"  report.html {html / 2**20:.2f} MB, timeline.json {timeline / 2**20:.2f} MB")
        if live:
            print(f"  report of the live run (the trainer's file grew {live['grew_bytes'] / 2**20:.1f} MB meanwhile): "
                  f"{live['total_s']:.2f} s, peak RSS {live['peak_rss_mb']:.0f} MB, {live['steps']:,} steps "
                  f"(the ended run's: {rep['total_s']:.2f} s, {rep['peak_rss_mb']:.0f} MB)")
        if agent:
            print(f"  the agent's step recording (instrument/torch.py, writer): RSS {agent[0]:.1f} MB after "
                  f"10,000 steps, {agent[1]:.1f} MB at the end")
        if tail:
            print(f"  live line: {tail['polls']} polls (1/s), first {tail['first_ms']:.2f} ms, last "
                  f"{tail['last_ms']:.2f} ms, max {tail['max_ms']:.1f} ms; RSS {tail['rss_first_mb']:.0f} → "
                  f"{tail['rss_last_mb']:.0f} MB\n  {tail['last_line']}")

    print(f"\n{'steps':>9} {'span s':>7} {'B/step':>7} {'host MB/h':>9} {'report s':>8} {'s/Mstep':>7} "
          f"{'peak MB':>7} {'MB/Mstep':>8} {'html MB':>7} {'tl MB':>6} {'poll ms':>7} {'tail ΔMB':>8}")
    for n, span_s, sz, rep, html, timeline, tail in rows:
        total = sum(sz.values())
        print(f"{n:>9,} {span_s:>7.0f} {total / n:>7.1f} {sz['host.jsonl'] / span_s * 3600 / 2**20:>9.2f} "
              f"{rep['total_s']:>8.2f} {rep['total_s'] / n * 1e6:>7.1f} {rep['peak_rss_mb']:>7.0f} "
              f"{(rep['peak_rss_mb'] - rep['rss_import_mb']) / n * 1e6:>8.0f} {html / 2**20:>7.2f} "
              f"{timeline / 2**20:>6.1f} "
              + (f"{tail['last_ms']:>7.2f} {tail['rss_last_mb'] - tail['rss_first_mb']:>8.1f}" if tail else ""))
    hour_ticks = 3600 / HOST_S
    print(f"\nhost.jsonl growth: {hour_ticks:,.0f} ticks per hour; 24 h = {24 * hour_ticks:,.0f} ticks")
    for n, span_s, _sz, rep, _html, _timeline, _tail in rows:
        goal = None if args.cuda else next((g for g in GOALS if n == g[0] and
                                            abs(span_s / 3600 - g[1]) < 0.1 * max(g[1], 0.01)), None)
        if goal:
            ok = rep["total_s"] <= goal[2] and rep["peak_rss_mb"] <= goal[3]
            print(f"goal ({goal[4]}): ≤ {goal[2]:g} s and ≤ {goal[3]} MB: {rep['total_s']:.1f} s, "
                  f"{rep['peak_rss_mb']:.0f} MB: {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
