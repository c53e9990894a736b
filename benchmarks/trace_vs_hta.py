"""Busy/idle figures of `whyidle trace` next to Holistic Trace Analysis (HTA) on every real trace.

For each job folder of ``../shared/traces`` (one folder per job, as HTA wants), runs HTA in a side
venv (``--hta-python``, default ``/tmp/hta-venv/bin/python``; make it with
``python3 -m venv /tmp/hta-venv && /tmp/hta-venv/bin/pip install HolisticTraceAnalysis``) and
whyidle's metrics (``whyidle.analysis.trace.rank_metrics``) in this interpreter, rank by rank, and
writes a markdown table to ``docs/trace-vs-hta.md``:

* temporal breakdown: HTA's ``get_temporal_breakdown`` idle share of its window (first to last
  GPU event kept by its loader) and busy share (compute + non-compute), next to whyidle's
  ``idle_share`` / ``busy_share``. HTA is run twice: as ``TraceAnalysis`` loads by default
  (``include_last_profiler_step=False``: GPU work launched from the start of the last
  ``ProfilerStep`` on is dropped) and with ``include_last_profiler_step=True`` (closest to
  whyidle's whole-trace window); the differences are taken against the latter.
* idle-time breakdown: HTA's ``get_idle_time_breakdown`` per stream (host wait / kernel wait /
  other, summed over streams, as shares of the summed per-stream idle) next to whyidle's
  ``idle_breakdown["per_stream"]``.

Failures are caught per job (and per HTA mode) and reported in the table. A "why" column says
where the definitions differ (see the notes written under the table).

    python benchmarks/trace_vs_hta.py [--traces ../shared/traces] [--hta-python PY]
                                      [--out docs/trace-vs-hta.md] [--json RAW.json] [--only NAME]
                                      [--reuse-hta RAW.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_TRACES = os.path.join(os.path.dirname(REPO), "shared", "traces")
DEFAULT_HTA_PYTHON = "/tmp/hta-venv/bin/python"
DEFAULT_OUT = os.path.join(REPO, "docs", "trace-vs-hta.md")
TOLERANCE_PP = 0.5

# Runs in the side venv: one job folder -> JSON with, per HTA mode and rank, the temporal and the
# idle-time breakdown plus what HTA kept as GPU events.
HTA_SCRIPT = r'''
import json, sys, time, traceback, logging
logging.disable(logging.WARNING)
folder = sys.argv[1]
out = {"version": None, "modes": {}}
try:
    from hta.version import __version_tuple__
    out["version"] = ".".join(map(str, __version_tuple__))
except Exception:
    pass
from hta.trace_analysis import TraceAnalysis

def num(v):
    return v.item() if hasattr(v, "item") else v

for mode, include_last in (("default", False), ("last_step", True)):
    res = {"ranks": {}}
    t0 = time.perf_counter()
    try:
        a = TraceAnalysis(trace_dir=folder, include_last_profiler_step=include_last)
    except Exception as exc:
        res["error"] = f"TraceAnalysis: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        out["modes"][mode] = res
        continue
    res["load_s"] = time.perf_counter() - t0
    syms = a.t.symbol_table.get_sym_table()
    for rank in a.t.get_ranks():
        r = {}
        df = a.t.get_trace(rank)
        gpu = df[df["stream"].ne(-1)]
        cats = {}
        for c, n in gpu["cat"].value_counts().items():
            cats[syms[int(c)]] = int(n)
        r["gpu_rows_by_cat"] = cats
        try:
            tb = a.get_temporal_breakdown(visualize=False)
            row = tb[tb["rank"] == rank].iloc[0]
            r["temporal"] = {k: num(row[k]) for k in ("idle_time(us)", "compute_time(us)",
                                                        "non_compute_time(us)", "kernel_time(us)")}
        except Exception as exc:
            r["temporal_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        try:
            ib, _ = a.get_idle_time_breakdown(ranks=[rank], visualize=False)
            r["idle_breakdown"] = [{"stream": num(x["stream"]), "category": x["idle_category"],
                                    "idle_us": num(x["idle_time"])} for x in ib.to_dict("records")]
        except Exception as exc:
            r["idle_breakdown_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        res["ranks"][str(rank)] = r
    out["modes"][mode] = res
print("HTA_JSON " + json.dumps(out))
'''


def run_hta(hta_python: str, folder: str, timeout: float) -> dict:
    try:
        r = subprocess.run([hta_python, "-c", HTA_SCRIPT, folder], check=False, capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"HTA timed out after {timeout:.0f} s"}
    lines = [x for x in r.stdout.splitlines() if x.startswith("HTA_JSON ")]
    if r.returncode != 0 or not lines:
        tail = (r.stderr or r.stdout).strip().splitlines()
        last = tail[-1] if tail else f"exit {r.returncode}"
        return {"error": f"HTA failed: {last[:200]}"}
    return json.loads(lines[-1][len("HTA_JSON "):])


def hta_summary(rank_res: dict) -> dict:
    """Shares in percent from one HTA rank result."""
    out: dict = {}
    t = rank_res.get("temporal")
    if t and t["kernel_time(us)"]:
        w = t["kernel_time(us)"]
        out["idle_pct"] = 100 * t["idle_time(us)"] / w
        out["busy_pct"] = 100 * (t["compute_time(us)"] + t["non_compute_time(us)"]) / w
        out["window_ms"] = w / 1e3
    elif "temporal_error" in rank_res:
        out["temporal_error"] = rank_res["temporal_error"]
    ib = rank_res.get("idle_breakdown")
    if ib:
        cats = {"host_wait": 0.0, "kernel_wait": 0.0, "other": 0.0}
        for row in ib:
            cats[row["category"]] = cats.get(row["category"], 0.0) + (row["idle_us"] or 0.0)
        total = sum(cats.values())
        out["stream_idle_ms"] = total / 1e3
        out["streams"] = len({row["stream"] for row in ib})
        for k, v in cats.items():
            out[f"{k}_ms"] = v / 1e3
            out[f"{k}_pct"] = 100 * v / total if total else 0.0
    elif "idle_breakdown_error" in rank_res:
        out["idle_breakdown_error"] = rank_res["idle_breakdown_error"]
    return out


def _pct(x) -> float:
    """A share given as a fraction (0..1) or already in percent -> percent."""
    return 100 * x if x is not None and abs(x) <= 1.0000001 else x


def hta_event_set(t, include_last_step: bool = True):
    """A copy of a whyidle ``TraceData`` reduced to the GPU ops HTA's loader keeps, with HTA's
    timestamp rounding, to check that the *definitions* agree once the *event sets* do.

    HTA (``Trace._filter_irrelevant_gpu_kernels``, when the trace has two or more distinct
    ``ProfilerStep`` names) keeps a GPU op only when a host event with the same correlation id
    began before the last step's end (``include_last_profiler_step=True``; before the last step's
    start by default). ``round_down_time_stamps``: with fractional timestamps every event's start
    is rounded up and its end down to whole µs. Returns (copy, facts)."""
    import dataclasses

    import numpy as np

    g, rt = t.gpu, t.runtime
    facts = {"gpu_ops": len(g["ts"])}
    keep = np.ones(len(g["ts"]), dtype=bool)
    names = {s[0] for s in t.steps}
    if len(names) >= 2:
        last_start = max(s[1] for s in t.steps)
        last_end = max(s[1] + s[2] for s in t.steps)
        launched = rt["ts"] <= last_end if include_last_step else rt["ts"] < last_start
        ok = np.unique(rt["correlation"][launched & (rt["correlation"] >= 0)])
        has_cpu = np.isin(g["correlation"], np.unique(rt["correlation"][rt["correlation"] >= 0]))
        keep = np.isin(g["correlation"], ok)
        facts["no_launch_in_trace"] = int((~has_cpu).sum())
        facts["launched_late"] = int((has_cpu & ~keep).sum())
    frac = int((g["ts"] % 1 != 0).sum() + (g["dur"] % 1 != 0).sum())
    facts["fractional_ts"] = frac
    gpu = {k: v[keep] for k, v in g.items()}
    runtime = dict(rt)
    if frac or (rt["ts"] % 1 != 0).any():
        end = np.floor(gpu["ts"] + gpu["dur"])
        gpu["ts"] = np.ceil(gpu["ts"])
        gpu["dur"] = end - gpu["ts"]
        runtime["ts"] = np.ceil(rt["ts"])
    pageable = t.pageable[keep] if t.pageable is not None else None
    return dataclasses.replace(t, gpu=gpu, runtime=runtime, pageable=pageable), facts


def _why_figures(m: dict) -> dict:
    r: dict = {}
    if m.get("idle_share") is not None:
        r["idle_pct"] = _pct(m["idle_share"])
    if m.get("busy_share") is not None:
        r["busy_pct"] = _pct(m["busy_share"])
    if m.get("window_s") is not None:
        r["window_ms"] = m["window_s"] * 1e3
    ib = m.get("idle_breakdown") or {}
    per = ib.get("per_stream") or []
    if per:
        cats = {"host_wait": 0.0, "kernel_wait": 0.0, "other": 0.0}
        for s in per:
            cats["host_wait"] += s.get("host_wait_s") or 0.0
            cats["kernel_wait"] += s.get("kernel_wait_s") or 0.0
            cats["other"] += s.get("other_s") or 0.0
        total = sum(cats.values())
        r["stream_idle_ms"] = total * 1e3
        r["streams"] = len(per)
        for k, v in cats.items():
            r[f"{k}_ms"] = v * 1e3
            r[f"{k}_pct"] = 100 * v / total if total else 0.0
    dev = ib.get("device")
    if isinstance(dev, dict) and dev.get("idle_s"):
        r["device"] = {k: 100 * (dev.get(f"{k}_s") or 0.0) / dev["idle_s"]
                       for k in ("host_wait", "kernel_wait", "other")}
        r["device"]["idle_ms"] = dev["idle_s"] * 1e3
    return r


def whyidle_summary(folder: str) -> dict:
    """rank -> whyidle's figures (percent, ms) on the whole trace (``all``) and on HTA's event
    set (``hta_set``, see :func:`hta_event_set`), or {"error": ...}."""
    from whyidle.analysis.trace import rank_metrics
    from whyidle.record.kineto import TraceError, read_job

    try:
        traces = read_job(folder)
    except TraceError as exc:
        return {"error": str(exc)}
    out = {}
    for t in traces:
        key = str(t.rank if t.rank is not None else 0)
        try:
            m = rank_metrics(t)
            h, facts = hta_event_set(t)
            mh = rank_metrics(h)
        except Exception as exc:  # noqa: BLE001 - report it in the table, do not stop
            out[key] = {"error": f"rank_metrics: {type(exc).__name__}: {exc}"[:200],
                        "trace": traceback.format_exc(limit=3)}
            continue
        out[key] = {"all": _why_figures(m), "hta_set": _why_figures(mh), "facts": facts}
    return out


def _f(x, nd=2) -> str:
    return "–" if x is None else f"{x:.{nd}f}"


def _d(a, b) -> str:
    if a is None or b is None:
        return "–"
    d = a - b
    s = f"{d:+.2f}" if abs(d) >= 0.005 else "0.00"
    return f"**{s}**" if abs(d) > TOLERANCE_PP else s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default=DEFAULT_TRACES)
    ap.add_argument("--hta-python", default=DEFAULT_HTA_PYTHON)
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--json", dest="json_out", default=None, help="also write the raw figures here")
    ap.add_argument("--only", default=None, help="only job folders whose name contains this")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--reuse-hta", metavar="RAW.json", default=None,
                    help="take HTA's figures from an earlier --json output instead of running HTA")
    args = ap.parse_args(argv)
    reused = {}
    if args.reuse_hta:
        with open(args.reuse_hta, encoding="utf-8") as f:
            reused = {job: r["hta"] for job, r in json.load(f).items()}

    sys.path.insert(0, os.path.join(REPO, "src"))
    jobs = sorted(d for d in os.listdir(args.traces) if os.path.isdir(os.path.join(args.traces, d)))
    if args.only:
        jobs = [j for j in jobs if args.only in j]
    raw: dict = {}
    hta_version = None
    for job in jobs:
        folder = os.path.join(args.traces, job)
        t = time.perf_counter()
        if job in reused:
            hta = reused[job]
        elif os.path.exists(args.hta_python):
            hta = run_hta(args.hta_python, folder, args.timeout)
        else:
            hta = {"error": f"no HTA venv at {args.hta_python}"}
        hta_version = hta_version or hta.get("version")
        try:
            why = whyidle_summary(folder)
        except ImportError as exc:
            why = {"error": f"whyidle metrics not importable: {exc}"}
        raw[job] = {"hta": hta, "whyidle": why}
        print(f"{job}: {time.perf_counter() - t:.1f} s", file=sys.stderr)
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump(raw, f, indent=1)
    text = render(raw, hta_version)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {args.out}")
    return 0


def _rows(raw: dict):
    """(job, rank, hta_default, hta_last, whyidle, notes) per rank, errors included."""
    for job, r in raw.items():
        hta, why = r["hta"], r["whyidle"]
        ranks = set()
        for mode in ("default", "last_step"):
            ranks |= set(hta.get("modes", {}).get(mode, {}).get("ranks", {}))
        ranks |= {k for k in why if k != "error"}
        errs = []
        if "error" in hta:
            errs.append(hta["error"])
        for mode in ("default", "last_step"):
            e = hta.get("modes", {}).get(mode, {}).get("error")
            if e:
                errs.append(f"HTA ({mode}): {e}")
        if "error" in why:
            errs.append(f"whyidle: {why['error']}")
        if not ranks:
            yield job, "–", {}, {}, {}, errs
            continue
        for rank in sorted(ranks, key=int):
            d = hta.get("modes", {}).get("default", {}).get("ranks", {}).get(rank, {})
            last = hta.get("modes", {}).get("last_step", {}).get("ranks", {}).get(rank, {})
            w = why.get(rank, {})
            notes = list(errs)
            for tag, x in (("HTA", d), ("HTA (last step)", last)):
                for k in ("temporal_error", "idle_breakdown_error"):
                    if k in x:
                        notes.append(f"{tag} {k.split('_error')[0].replace('_', ' ')}: {x[k]}")
            if "error" in w:
                notes.append(f"whyidle: {w['error']}")
            yield job, rank, hta_summary(d), hta_summary(last), w, notes


def _why(wa: dict, wh: dict, last: dict, facts: dict, hta_cats: dict) -> list[str]:
    """Short reasons for a difference, from facts measured on the trace: the event-set reasons
    when whyidle and HTA differ on the whole trace (Δ ≠ Δ′), the definition reasons when they
    still differ on HTA's event set (Δ′ ≠ 0)."""
    def diff(x):
        return None if x.get("idle_pct") is None or last.get("idle_pct") is None else x["idle_pct"] - last["idle_pct"]

    d_all, d_set = diff(wa), diff(wh)
    if d_all is None:
        return []
    out = []
    if d_set is not None and abs(d_all - d_set) >= 0.005:
        if facts.get("no_launch_in_trace"):
            out.append(f"HTA drops {facts['no_launch_in_trace']} GPU ops whose launch call is not in the trace "
                       "(queued before profiling started); whyidle keeps them")
        if facts.get("launched_late"):
            out.append(f"HTA drops {facts['launched_late']} GPU ops launched after the last step ended")
        if facts.get("fractional_ts"):
            out.append("ns-resolution timestamps: HTA rounds each start up and each end down to whole µs "
                       "(shorter ops, longer gaps); whyidle keeps them as written")
    if d_set is not None and abs(d_set) >= 0.005:
        extra = {c: n for c, n in hta_cats.items() if c not in GPU_OP_CATS}
        if extra:
            out.append("HTA counts " + ", ".join(f"{n} `{c}` event{'s' if n > 1 else ''}" for c, n in extra.items())
                       + " (host-side records that carry a stream id) as GPU busy time")
        else:
            out.append("unexplained: same events, different result")
    return out or (["same"] if abs(d_all) < 0.005 else [])


GPU_OP_CATS = ("kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset")


def render(raw: dict, hta_version: str | None) -> str:
    lines = [
        "# `whyidle trace` next to Holistic Trace Analysis",
        "",
        (f"Generated by `benchmarks/trace_vs_hta.py` on every job folder of `../shared/traces` "
        f"(HolisticTraceAnalysis {hta_version or '?'} in a side venv; whyidle from this repo). "
        "Shares in percent; Δ in percentage points (whyidle − HTA); **bold** Δ = more than "
        f"{TOLERANCE_PP} points. Regenerate with `python benchmarks/trace_vs_hta.py`."),
        "",
        "Columns:",
        "",
        ("* **HTA default**: `TraceAnalysis(trace_dir=...)` as it loads by default "
        "(`include_last_profiler_step=False`). **HTA**: the same with "
        "`include_last_profiler_step=True`, the closest to whyidle's whole-trace window; Δ is taken "
        "against it."),
        ("* **whyidle**: `whyidle.analysis.trace.rank_metrics` on the whole trace (what `whyidle trace` "
        "reports). **whyidle on HTA's events**: the same code on the trace reduced to the GPU ops HTA "
        "keeps and with HTA's timestamp rounding (see *Definitions*); Δ′ is its difference from HTA, "
        "i.e. the difference left once the event sets agree."),
        "",
        "## GPU idle share (temporal breakdown)",
        "",
        ("HTA: `get_temporal_breakdown()` → `idle_time / kernel_time`; busy = compute + non-compute = "
        "100 − idle. whyidle: `idle_share` / `busy_share` (device used)."),
        "",
        ("| job | rank | HTA default idle | HTA idle | HTA busy | whyidle idle | whyidle busy | Δ idle | "
        "whyidle on HTA's events: idle | Δ′ | why they differ |"),
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    rows = list(_rows(raw))
    for job, rank, d, last, w, notes in rows:
        wa, wh = w.get("all", {}), w.get("hta_set", {})
        hta_cats = (raw[job]["hta"].get("modes", {}).get("last_step", {}).get("ranks", {})
                    .get(rank, {}).get("gpu_rows_by_cat", {}))
        why = list(dict.fromkeys(n.replace("HTA (last step) ", "HTA ") for n in notes))
        why += _why(wa, wh, last, w.get("facts", {}), hta_cats)
        if not why and wa.get("idle_pct") is None and not w.get("error"):
            why = ["no GPU ops in the trace"]
        lines.append(
            f"| `{job}` | {rank} | {_f(d.get('idle_pct'))} | {_f(last.get('idle_pct'))} | {_f(last.get('busy_pct'))} "
            f"| {_f(wa.get('idle_pct'))} | {_f(wa.get('busy_pct'))} | {_d(wa.get('idle_pct'), last.get('idle_pct'))} "
            f"| {_f(wh.get('idle_pct'))} | {_d(wh.get('idle_pct'), last.get('idle_pct'))} | "
            f"{'; '.join(why) if why else 'same'} |")
    lines += [
        "",
        "## Idle time breakdown per stream",
        "",
        ("HTA: `get_idle_time_breakdown()` (default `consecutive_kernel_delay=30`), summed over the "
        "streams of the rank; each category as a share of the summed per-stream idle. whyidle: "
        "`idle_breakdown.per_stream`, summed the same way. Σ idle = summed per-stream idle in ms "
        "(over-counts device idle when streams overlap)."),
        "",
        ("| job | rank | streams | HTA Σ idle ms | HTA host / kernel / other | whyidle Σ idle ms "
        "| whyidle host / kernel / other | Δ host / kernel / other | Δ′ host / kernel / other (HTA's events) |"),
        "| --- | --- | ---: | ---: | --- | ---: | --- | --- | --- |",
    ]
    for job, rank, d, last, w, notes in rows:
        wa, wh = w.get("all", {}), w.get("hta_set", {})

        def trio(x):
            if x.get("host_wait_pct") is None:
                return "–"
            return " / ".join(f"{x[k + '_pct']:.2f}" for k in ("host_wait", "kernel_wait", "other"))

        def dtrio(x, y):
            if x.get("host_wait_pct") is None or y.get("host_wait_pct") is None:
                return "–"
            return " / ".join(_d(x[k + "_pct"], y[k + "_pct"]) for k in ("host_wait", "kernel_wait", "other"))

        lines.append(
            f"| `{job}` | {rank} | {last.get('streams', '–')} | {_f(last.get('stream_idle_ms'), 1)} | {trio(last)} "
            f"| {_f(wa.get('stream_idle_ms'), 1)} | {trio(wa)} | {dtrio(wa, last)} | {dtrio(wh, last)} |")
    lines += [
        "",
        "## whyidle's device-level idle breakdown (no HTA counterpart)",
        "",
        ("Same host-wait / kernel-wait / other rule applied to the gaps of the union of all streams; "
        "the parts add up to the device idle (window − busy), unlike the per-stream sums above."),
        "",
        "| job | rank | device idle ms | host wait | kernel wait | other |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for job, rank, d, last, w, notes in rows:
        dev = w.get("all", {}).get("device")
        if dev:
            lines.append(f"| `{job}` | {rank} | {dev['idle_ms']:.1f} | {dev['host_wait']:.2f} | "
                         f"{dev['kernel_wait']:.2f} | {dev['other']:.2f} |")
    lines += ["", DEFINITIONS]
    return "\n".join(lines) + "\n"


DEFINITIONS = """## Definitions and where they differ

Read from HTA's source (`hta/analyzers/breakdown_analysis.py`, `hta/common/trace.py`,
`hta/common/trace_parser.py`, `hta/common/trace_filter.py`, `hta/common/trace_file.py`).

* **Window, busy, idle.** Both: busy = length of the union of the GPU ops' intervals (touching
  intervals merge), window = first GPU op start to last GPU op end, idle = window − busy.
  HTA's temporal breakdown takes as "GPU ops" every loaded row whose `stream` is not −1; whyidle
  takes kernel, memcpy and memset activities of the device used.
* **Which GPU ops are loaded.** When a trace has two or more `ProfilerStep` names, HTA's loader
  keeps a GPU op only if a host event with the same correlation id began before the start of the
  last step (default) or before its end (`include_last_profiler_step=True`). So HTA drops (a) by
  default, all work of the last step, and (b) always, GPU ops whose launch call is not in the trace
  — typically the ops already queued when profiling started, at the beginning of the window. whyidle
  keeps every GPU op: the device was busy then, and the window is the trace's.
* **Timestamp rounding.** On traces with fractional (ns-resolution) timestamps HTA rounds every
  event's start up and its end down to whole µs (`round_down_time_stamps`, a workaround for
  overlapping events), which shortens each op by up to 1 µs: on traces with many short kernels this
  moves the idle share by a point or more. whyidle keeps the timestamps as written.
* **Host events with a stream id.** HTA treats any row with a stream id and a correlation id as a
  GPU op, so `cuda_sync` events (Kineto's synchronization records, on the host's timeline) and, in
  ROCm traces, runtime calls that carry a `stream` argument count as GPU busy time in its temporal
  breakdown. whyidle counts only device activities.
* **Idle time breakdown (per stream).** Same rule in both: per stream, the GPU ops in start order;
  the gap before each op (but the first) is *host wait* when the op's launch call began after the
  previous op ended, else *kernel wait* when the gap is under 30 (HTA documents its
  `consecutive_kernel_delay=30` as nanoseconds but compares it with µs timestamps, so it acts as
  30 µs; whyidle uses 30 µs), else *other*. HTA sums negative gaps as they are; whyidle clips them at
  0. The differences in the table come from the event sets above, not from the rule.
* **Device-level breakdown** is whyidle's addition: the per-stream sums over-count idle when streams
  overlap (a side stream with a few NCCL kernels is "idle" for nearly the whole window).
* **CPU-only traces**: HTA's temporal breakdown raises `IndexError` and its idle time breakdown
  `ValueError` (no GPU rows); whyidle reports no GPU figures.
* **Ranks**: HTA reads the rank with the regular expression `"rank":\\s+(\\d+)` (a space after the
  colon is required) and falls back to rank 0; its `get_idle_time_breakdown` defaults to rank 0, so
  a folder holding only rank 1 needs `ranks=[1]` (done here).
"""


if __name__ == "__main__":
    sys.exit(main())
