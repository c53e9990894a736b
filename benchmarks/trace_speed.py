"""Speed and memory of `whyidle trace` on a large Kineto trace, against Holistic Trace Analysis (HTA).

Builds a large trace (default about 500 MB of uncompressed JSON) by repeating the events of a real
trace from ``../shared/traces`` (default: the Kineto ResNet-50 ``num_workers_0`` one). Copy ``k``
shifts every timestamp by ``k`` × (source span + 1 ms), and keeps ids unique: ``args.correlation``
and the flow-event ``id`` (``s``/``f`` events), ``External id``/``external id`` are offset per copy,
and ``ProfilerStep#N`` numbers continue (copy ``k`` has ``N + k × steps``). Metadata events
(``ph: M``) appear once. The file is written streaming, one event per line (as Kineto writes
it), with ``"distributedInfo": {"rank": 0, ...}`` at the top when the source has none (so HTA
finds the rank without scanning the file), into a temporary folder that holds only that file
(HTA wants one folder per job). Nothing of the file is held in memory beyond one copy's events.

Then, each in its own subprocess, with wall time and peak RSS measured: ``ru_maxrss`` from
``os.wait4`` of that child (the kernel's high-water mark; it covers the processes the child waited
for, and is at least the parent's RSS at the fork, which is why the trace is built in a separate
process and this one stays small), cross-checked by polling the RSS of the child's process tree
every 20 ms with psutil (in ``--json``):

  (a) the floor: a bare single-process typed msgspec decode of the same file (``FLOOR_SCRIPT``:
      read the file, decode ``traceEvents`` into structs, nothing else), of the five fields the
      issue timed (``floor``: ph, cat, name, ts, dur) and of every field whyidle's reader takes
      (``floor_all``: those, pid, tid and six ``args``);
  (b) ``python -m whyidle trace FILE --workers N --json OUT`` from this repo for each ``--workers``
      value (default 1 and 2: one process alone, and the file's byte ranges read by two processes
      at once, each taking the next range left; skipped with a message when the command does not
      exist);
  (c) HTA: ``TraceAnalysis(trace_dir=folder)`` then ``get_idle_time_breakdown(visualize=False)``,
      run by the Python of a side venv with ``HolisticTraceAnalysis`` installed (``--hta-python``;
      default ``/tmp/hta-venv/bin/python`` when it exists). Make one with::

          python3 -m venv /tmp/hta-venv && /tmp/hta-venv/bin/pip install HolisticTraceAnalysis

``--rounds`` (default 3) rounds run every tool once each, interleaved, so that the ratios come from
one run under the same conditions. Prints, per tool, the median (min-max) wall seconds, events/s
and peak RSS, each tool's ratio to the floor, HTA's time over whyidle's, and the goal lines of
issue 35: ``--workers 1`` within 1.5× the floor, ``--workers 2`` below it, whyidle at least 25×
faster than HTA, whyidle's peak RSS below the uncompressed file size. HTA on 500 MB needs about
40 s and 2.2 GB of RAM (HTA 0.5.0, 2-core VM; up to minutes on slower machines): run nothing else
heavy at the same time. The built file needs its size in free disk in the temporary folder's file
system. This is a benchmark to run by hand, not a test.

Measured (2026-12-05, ``--mb 129``: 150.6 MB, 378,510 events; the 2-core VM shared with other
work, every run under a lock that kept other benchmarks out, not the other load, which kept about
one core busy most of the time). Reader of this turn (byte ranges taken in turn by forked helpers
that import nothing, columns sent back as raw array bytes, the helpers started before the
analysis imports; 1 MiB blocks; numpy's OpenBLAS held to one thread; medians of 5 interleaved
rounds): floor 0.370 s (CPU 0.35 s), ``--workers 1`` 0.525 s (1.42×; CPU 0.51 s), ``--workers 2``
0.392 s (1.06×; CPU 0.56 s); the reader before it in the run just before: 1.81× and 1.91× (CPU
0.63 / 0.72 s). A pair of runs right after, with the other load heavier: this reader 1.49× /
1.60×, the one before 1.54× / 1.51×. With HTA (3 rounds) in a quieter moment: floor 0.348 s,
``--workers 1`` 0.510 s (1.46×), ``--workers 2`` 0.354 s (1.01×), HTA 9.247 s = 26.1× the
two-process read and 18.1× the one-process one; in a run where another process held a core
throughout, 1.48× / 1.54× and HTA 17.2× ``--workers 1`` (9.61 s). Peak RSS 80 / 72 MB against
277 MB for the floor and 697 MB for HTA. With both cores free, two processes read the file in
about the floor's time (0.35-0.39 s); when another process holds one core, the second reader has
no core to run on and takes as long as one. The reader before the field checks became decoder constraints took
2.3-2.7× the floor (issue 35).

    python benchmarks/trace_speed.py [--mb 500] [--source TRACE] [--rounds 3] [--workers 1,2]
                                     [--hta-python PY] [--no-hta] [--tmpdir DIR] [--keep]
                                     [--json RESULT.json]
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

try:
    import psutil
except ImportError:  # the polled cross-check is skipped; ru_maxrss is still measured
    psutil = None

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(REPO), "shared", "traces")
DEFAULT_SOURCE = os.path.join(SHARED, "kineto_resnet50_v100_num_workers_0",
                              "worker0.1623143089861.pt.trace.json.gz")
DEFAULT_HTA_PYTHON = "/tmp/hta-venv/bin/python"
GAP_US = 1000  # between copies, so copies never overlap
EXTERNAL_KEYS = ("External id", "external id")

HTA_SCRIPT = r'''
import json, sys, time, logging
t0 = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=sys.argv[1])
t1 = time.perf_counter()
df, _ = a.get_idle_time_breakdown(ranks=a.t.get_ranks(), visualize=False)
t2 = time.perf_counter()
rows = [{k: (v.item() if hasattr(v, "item") else v) for k, v in r.items()} for r in df.to_dict("records")]
print("HTA_RESULT " + json.dumps({"load_s": t1 - t0, "breakdown_s": t2 - t1, "rows": rows}))
'''


#: The floor: a bare single-process typed msgspec decode of the same file, nothing else (no
#: columns, no analysis), timed as a process like the tools. "five": the five fields the filer of
#: issue 35 timed (ph, cat, name, ts, dur); "all": every field whyidle's reader takes (those, pid,
#: tid and args.device/stream/correlation/bytes/cuda_sync_kind/Group size), untyped checks
#: left out.
FLOOR_SCRIPT = r'''
import gc, sys, time
t0 = time.perf_counter()
from typing import Any
import msgspec
gc.disable()

class Args(msgspec.Struct, gc=False):
    device: Any = None
    stream: Any = None
    correlation: Any = -1
    bytes: Any = -1
    cuda_sync_kind: Any = None
    group_size: Any = msgspec.field(default=None, name="Group size")

class Five(msgspec.Struct, gc=False):
    ph: Any = None
    cat: str | None = None
    name: str | None = None
    ts: float | None = None
    dur: float | None = 0

class All(msgspec.Struct, gc=False):
    ph: Any = None
    cat: str | None = None
    name: str | None = None
    ts: float | None = None
    dur: float | None = 0
    pid: Any = None
    tid: Any = None
    args: Args | None = None

Event = Five if sys.argv[2] == "five" else All

class Trace(msgspec.Struct, gc=False):
    traceEvents: list[Event]

with open(sys.argv[1], "rb") as f:
    doc = msgspec.json.decode(f.read(), type=Trace)
print("FLOOR_RESULT", len(doc.traceEvents), time.perf_counter() - t0)
'''


def _load(path: str) -> dict:
    import msgspec

    with open(path, "rb") as f:
        magic = f.read(2)
    opener = gzip.open if magic == b"\x1f\x8b" else open
    with opener(path, "rb") as f:
        return msgspec.json.decode(f.read())


def _step_number(name) -> int | None:
    if isinstance(name, str) and name.startswith("ProfilerStep#"):
        try:
            return int(name[13:])
        except ValueError:
            return None
    return None


def build_trace(source: str, target_bytes: int, out_path: str) -> dict:
    """Writes the repeated trace to ``out_path``; returns facts about it (events, copies, bytes)."""
    import msgspec

    doc = _load(source)
    events = doc.pop("traceEvents")
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    t0 = min(e["ts"] for e in timed)
    t1 = max(e["ts"] + (e.get("dur") or 0) for e in timed)
    shift = math.ceil(t1 - t0) + GAP_US
    corr = [e["args"]["correlation"] for e in events
            if isinstance(e.get("args"), dict) and isinstance(e["args"].get("correlation"), int)]
    corr += [e["id"] for e in events if e.get("ph") in ("s", "f") and isinstance(e.get("id"), int)]
    corr_shift = (max(corr) + 1) if corr else 0
    ext = [e["args"][k] for e in events if isinstance(e.get("args"), dict)
           for k in EXTERNAL_KEYS if isinstance(e["args"].get(k), int)]
    ext_shift = (max(ext) + 1) if ext else 0
    steps = [n for n in (_step_number(e.get("name")) for e in events) if n is not None]
    step_shift = (max(steps) - min(steps) + 1) if steps else 0
    meta_events = [e for e in events if e.get("ph") == "M"]
    body = [e for e in events if e.get("ph") != "M"]
    del events, timed

    def copy_events(k: int) -> list:
        if k == 0:
            return body
        out = []
        for e in body:
            d = dict(e)
            if isinstance(d.get("ts"), (int, float)):
                d["ts"] = d["ts"] + k * shift
            if d.get("ph") in ("s", "f") and isinstance(d.get("id"), int):
                d["id"] = d["id"] + k * corr_shift
            args = d.get("args")
            if isinstance(args, dict):
                a = None
                if isinstance(args.get("correlation"), int) and args["correlation"] >= 0:
                    a = dict(args)
                    a["correlation"] = args["correlation"] + k * corr_shift
                for key in EXTERNAL_KEYS:
                    if isinstance(args.get(key), int) and args[key] >= 0:
                        a = a if a is not None else dict(args)
                        a[key] = args[key] + k * ext_shift
                if a is not None:
                    d["args"] = a
            n = _step_number(d.get("name"))
            if n is not None:
                d["name"] = f"ProfilerStep#{n + k * step_shift}"
            out.append(d)
        return out

    head = dict(doc)
    if not isinstance(head.get("distributedInfo"), dict):
        head["distributedInfo"] = {"backend": "nccl", "rank": 0, "world_size": 1}
    n_events = 0
    copies = 0
    with open(out_path, "wb") as f:
        f.write(b"{\n")
        f.writelines(msgspec.json.encode(key) + b": " + json.dumps(value).encode() + b",\n" for key, value in head.items())
        f.write(b'"traceEvents": [\n')
        first = True
        for e in meta_events:
            f.write((b"" if first else b",\n") + msgspec.json.encode(e))
            first = False
        n_events += len(meta_events)
        while f.tell() < target_bytes or copies == 0:
            chunk = b",\n".join(msgspec.json.encode(e) for e in copy_events(copies))
            f.write((b"" if first else b",\n") + chunk)
            first = False
            n_events += len(body)
            copies += 1
        f.write(b"\n]}\n")
        size = f.tell()
    return {"events": n_events, "copies": copies, "bytes": size, "source_events": len(body) + len(meta_events),
            "span_shift_us": shift}


def _tree_rss(proc) -> int:
    """RSS in bytes of a psutil process and its children (0 when it is gone)."""
    total = 0
    try:
        for p in [proc] + proc.children(recursive=True):
            try:
                total += p.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                pass
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        pass
    return total


def measure(cmd: list[str], log_path: str, timeout: float) -> dict:
    """Runs ``cmd``; wall seconds, CPU seconds (user + system of the child and its waited-for
    descendants: the work done, less sensitive than the wall to other load on the machine) and
    peak RSS in MB: ``ru_maxrss`` of this child and its waited-for descendants via ``os.wait4``,
    and the peak of the polled RSS of its process tree."""
    polled = 0
    timed_out = False
    with open(log_path, "wb") as log:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        ps = psutil.Process(proc.pid) if psutil else None
        deadline = start + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if ps is not None:
                polled = max(polled, _tree_rss(ps))
            if time.perf_counter() > deadline:
                timed_out = True
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.02)
        wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    with open(log_path, "rb") as f:
        out = f.read().decode("utf-8", "replace")
    return {"rc": proc.returncode, "wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
            "peak_rss_mb": usage.ru_maxrss / 1024,
            "polled_peak_rss_mb": polled / 2**20 if ps is not None else None, "output": out,
            "timed_out": timed_out}


def _summary(runs: list[dict]) -> dict:
    """Median wall seconds and peak RSS MB of a tool's runs (all must have succeeded), with the
    range, and each run."""
    import statistics

    good = all(r["rc"] == 0 for r in runs)
    walls = [r["wall_s"] for r in runs]
    out = {"ok": good, "runs": runs, "wall_s": statistics.median(walls), "wall_min_s": min(walls),
           "wall_max_s": max(walls), "cpu_s": statistics.median(r["cpu_s"] for r in runs),
           "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in runs)}
    for key in ("load_s", "breakdown_s"):
        if all(key in r for r in runs):
            out[key] = statistics.median(r[key] for r in runs)
    return out


def _whyidle_has_trace() -> bool:
    r = subprocess.run([sys.executable, "-m", "whyidle", "trace", "--help"], check=False, cwd=REPO,
                       capture_output=True, text=True)
    return r.returncode == 0


def _tail(text: str, n: int = 6) -> str:
    return "\n".join("    " + line for line in text.strip().splitlines()[-n:])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=500, help="size of the built trace in MB (10^6 bytes) of JSON")
    ap.add_argument("--source", default=DEFAULT_SOURCE, help="real trace whose events are repeated")
    ap.add_argument("--hta-python", default=None, help="Python of a venv with HolisticTraceAnalysis "
                    f"(default {DEFAULT_HTA_PYTHON} when it exists)")
    ap.add_argument("--no-hta", action="store_true", help="do not run HTA")
    ap.add_argument("--tmpdir", default=None, help="where the temporary folder goes (default: system temp)")
    ap.add_argument("--keep", action="store_true", help="keep the built trace (its path is printed)")
    ap.add_argument("--timeout", type=float, default=3600, help="per-tool limit in seconds")
    ap.add_argument("--json", dest="json_out", default=None, help="also write the figures as JSON here")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every tool (medians are shown)")
    ap.add_argument("--workers", type=lambda v: [int(x) for x in v.split(",")], default=[1, 2],
                    help="whyidle trace --workers values to time, comma-separated (default 1,2)")
    ap.add_argument("--build-only", metavar="OUT", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.build_only:
        print(json.dumps(build_trace(args.source, int(args.mb * 1e6), args.build_only)))
        return 0

    hta_python = args.hta_python
    if hta_python is None and os.path.exists(DEFAULT_HTA_PYTHON):
        hta_python = DEFAULT_HTA_PYTHON
    if args.no_hta:
        hta_python = None

    work = tempfile.mkdtemp(prefix="whyidle-trace-speed-", dir=args.tmpdir)
    job = os.path.join(work, "job")
    os.makedirs(job)
    trace_path = os.path.join(job, "rank-0.pt.trace.json")
    results: dict = {}
    try:
        t = time.perf_counter()
        # built in a child process so that this one stays small (see the docstring on ru_maxrss)
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--build-only", trace_path,
                            "--mb", str(args.mb), "--source", args.source], check=False,
                           capture_output=True, text=True)
        if r.returncode != 0:
            print(f"building the trace failed:\n{_tail(r.stderr)}")
            return 2
        facts = json.loads(r.stdout.strip().splitlines()[-1])
        size_mb = facts["bytes"] / 1e6
        print(f"built {trace_path}: {size_mb:.1f} MB, {facts['events']:,} events "
              f"({facts['copies']} copies of {os.path.basename(args.source)}) in {time.perf_counter() - t:.1f} s")
        results["file"] = {"mb": size_mb, **facts, "source": args.source}

        tools = [("floor", [sys.executable, "-c", FLOOR_SCRIPT, trace_path, "five"]),
                 ("floor_all", [sys.executable, "-c", FLOOR_SCRIPT, trace_path, "all"])]
        if _whyidle_has_trace():
            for w in args.workers:
                tools.append((f"whyidle_w{w}", [sys.executable, "-m", "whyidle", "trace", trace_path,
                                                "--workers", str(w), "--json", os.path.join(work, f"whyidle_w{w}.json")]))
        else:
            print("whyidle trace: the command does not exist in this checkout yet (skipped)")
        if hta_python:
            tools.append(("hta", [hta_python, "-c", HTA_SCRIPT, job]))
        else:
            print(f"HTA: no side venv (--hta-python; default {DEFAULT_HTA_PYTHON}) - skipped")
        runs: dict[str, list] = {name: [] for name, _ in tools}
        for _round in range(args.rounds):  # interleaved: each round runs every tool once
            for name, cmd in tools:
                r = measure(cmd, os.path.join(work, f"{name}.log"), args.timeout)
                if name == "hta":
                    line = [x for x in r["output"].splitlines() if x.startswith("HTA_RESULT ")]
                    if r["rc"] == 0 and line:
                        r.update(json.loads(line[-1][len("HTA_RESULT "):]))
                    else:
                        r["rc"] = r["rc"] or 1
                if r["rc"] != 0:
                    print(f"{name} failed (exit {r['rc']}):\n{_tail(r['output'])}")
                runs[name].append({k: v for k, v in r.items() if k != "output"})
        for name, rs in runs.items():
            results[name] = _summary(rs)
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    events = results["file"]["events"]
    print()
    print(f"file: {size_mb:.1f} MB uncompressed JSON, {events:,} events; {args.rounds} interleaved round(s), "
          f"median (min-max) wall of each")
    print(f"{'tool':<11} {'wall s':>7} {'(min-max)':>13} {'cpu s':>6} {'events/s':>11} {'peak RSS MB':>12} "
          f"{'x floor':>8} {'(min)':>6}")
    floor = results.get("floor")
    ok = {}
    for name in runs:
        r = results[name]
        ok[name] = r["ok"]
        if not r["ok"]:
            print(f"{name:<11} failed")
            continue
        x = (f"{r['wall_s'] / floor['wall_s']:>8.2f} {r['wall_min_s'] / floor['wall_min_s']:>6.2f}"
             if floor and floor["ok"] else f"{'-':>8} {'-':>6}")
        print(f"{name:<11} {r['wall_s']:>7.3f} {r['wall_min_s']:>6.3f}-{r['wall_max_s']:<6.3f} {r['cpu_s']:>6.2f} "
              f"{events / r['wall_s']:>11,.0f} {r['peak_rss_mb']:>12.0f} {x}")
    h = results.get("hta")
    ratios = {}
    for name in runs:
        if not name.startswith("whyidle") or not ok.get(name):
            continue
        w = results[name]
        ratios[name] = {"over_floor": w["wall_s"] / floor["wall_s"] if floor and floor["ok"] else None,
                        "min_over_floor_min": w["wall_min_s"] / floor["wall_min_s"] if floor and floor["ok"] else None,
                        "cpu_over_floor": w["cpu_s"] / floor["cpu_s"] if floor and floor["ok"] else None,
                        "hta_over": h["wall_s"] / w["wall_s"] if h and h["ok"] else None}
        print(f"{name}: {ratios[name]['over_floor']:.2f}x the floor (five fields; fastest runs "
              f"{ratios[name]['min_over_floor_min']:.2f}x, CPU {ratios[name]['cpu_over_floor']:.2f}x; "
              f"{w['wall_s'] / results['floor_all']['wall_s']:.2f}x the all-fields floor)"
              + (f"; HTA takes {ratios[name]['hta_over']:.1f}x as long" if ratios[name]["hta_over"] else "")
              + f"; peak RSS {w['peak_rss_mb']:.0f} MB vs the {size_mb:.0f} MB file")
    results["ratios"] = ratios
    one, two = ratios.get("whyidle_w1"), ratios.get("whyidle_w2")
    if one and one["over_floor"]:
        print(f"goal: --workers 1 <= 1.5x the floor: {one['over_floor']:.2f}x -> "
              f"{'met' if one['over_floor'] <= 1.5 else 'NOT met'}")
    if two and two["over_floor"]:
        print(f"goal: --workers 2 below the floor: {two['over_floor']:.2f}x -> "
              f"{'met' if two['over_floor'] < 1 else 'NOT met'}")
    best = max((r["hta_over"] for r in ratios.values() if r["hta_over"]), default=None)
    if best:
        print(f"goal: >= 25x faster than HTA: {best:.1f}x -> {'met' if best >= 25 else 'NOT met'}")
    if h and h.get("ok") and "load_s" in h:
        print(f"HTA split: load {h['load_s']:.1f} s, idle breakdown {h['breakdown_s']:.1f} s "
              f"(plus interpreter start and imports)")
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return 0 if all(ok.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
