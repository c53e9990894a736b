"""The rolling diagnosis's records and views: one window's verdict and shares, reduced from the
window's report (docs/run-format.md ``windows.jsonl``; docs/report.md ``windows``), and the
changes of verdict over a job (the terminal's "over time" lines).

Goodput follows the taxonomy of Google's ml-goodput-measurement and Meta's effective-training-time
report: *productive* time is step time not spent waiting for data; the rest of the wall time is
*lost* by kind — ``startup`` (interpreter, imports, set-up before the first step), ``compile``,
``data_wait`` (steps waiting for their batch), ``evaluation``, ``checkpoint``, and ``idle`` (the
rest: logging regions, epoch boundaries, teardown, time between steps).
"""

from __future__ import annotations

from whyidle.diagnose.departure import HEALTHY
from whyidle.diagnose.departure import MIN_WINDOW_STEPS as MIN_STEPS

#: The lost-time kinds of :func:`goodput`, in the order shown.
LOST_KINDS = ("startup", "compile", "data_wait", "evaluation", "checkpoint", "idle")


def goodput(metrics: dict, first: bool = True) -> dict | None:
    """Goodput of a report's ``metrics`` (a run's or a window's): ``{ratio, wall_s, productive_s,
    lost_s: {kind: seconds}}``, ratio = productive ÷ wall time (fraction); None without a time
    accounting (``metrics.time``). ``first``: the time holds the job's start; a later window's
    "start-up" part is the end of a step begun in the window before, counted as training."""
    time = metrics.get("time") or {}
    parts = time.get("parts") or {}
    wall = time.get("wall_s") or 0.0
    if wall <= 0 or not parts:
        return None
    seconds = {name: (p or {}).get("s") or 0.0 for name, p in parts.items()}
    wait = (metrics.get("shares") or {}).get("data_wait") or 0.0
    training = seconds.get("training", 0.0) + (0.0 if first else seconds.get("startup", 0.0))
    lost = {"startup": seconds.get("startup", 0.0) if first else 0.0, "compile": seconds.get("compile", 0.0),
            "data_wait": training * wait, "evaluation": seconds.get("evaluation", 0.0),
            "checkpoint": seconds.get("checkpoint", 0.0)}
    productive = training * (1.0 - wait)
    lost["idle"] = max(0.0, wall - productive - sum(lost.values()))
    return {"ratio": round(min(1.0, productive / wall), 4), "wall_s": round(wall, 3),
            "productive_s": round(productive, 3), "lost_s": {k: round(lost[k], 3) for k in LOST_KINDS}}


def window_record(report: dict, i: int, t0: int, t1: int, start_t: int | None) -> dict:
    """The ``window`` record of one window's report (:func:`whyidle.report.build.build_report` of
    the window's records): verdict, the verdict finding's title and bound, steps, samples/s, step
    time, shares of step time (fractions), GPU utilization and idle share, goodput, and for a
    distributed job the collective wait and the culprit rank. ``t0``/``t1``: the window (monotonic
    ns); ``start_s``/``end_s`` are seconds from ``start_t`` (the command's start)."""
    m = report.get("metrics") or {}
    top = next((f for f in report.get("findings") or [] if f.get("id") == report.get("verdict")), None)
    gpu = m.get("gpu") or None
    step_s = m.get("step_time_s") or None
    shares = m.get("shares") or None
    base = start_t if isinstance(start_t, int) else t0
    imbalance = next((f for f in report.get("findings") or [] if f.get("id") == "imbalance"), None)
    ev = (imbalance or {}).get("evidence") or {}
    rec = {
        "k": "window", "i": i, "t0": t0, "t1": t1,
        "start_s": round((t0 - base) / 1e9, 3), "end_s": round((t1 - base) / 1e9, 3),
        "steps": m.get("steps_analyzed") or 0, "samples_per_s": m.get("samples_per_s"),
        "step_s": {k: step_s.get(k) for k in ("p50", "p90", "mean")} if step_s else None,
        "shares": shares,
        "host_ratio": shares.get("other_host") if shares else None,
        "gpu": {"util_mean": gpu.get("util_mean"), "idle_share": gpu.get("idle_share")} if gpu else None,
        "verdict": report.get("verdict"), "title": top.get("title") if top else None,
        "bound": top.get("bound") if top else None,
        "goodput": goodput(m, first=i == 0),
        "collective": {"wait_s_per_step": _most(ev.get("wait_s_per_step")), "culprit_rank": ev.get("culprit_rank")}
        if imbalance else None,
    }
    return rec


def _most(wait) -> float | None:
    """The longest wait per step of the ranks that wait (``imbalance`` evidence: rank → seconds)."""
    if isinstance(wait, dict):
        vals = [v for v in wait.values() if isinstance(v, (int, float))]
        return max(vals) if vals else None
    return wait if isinstance(wait, (int, float)) else None


def changes(windows: list[dict]) -> list[dict]:
    """The windows where the verdict changed (the first window included), in time order: each
    ``{start_s, end_s, verdict, title, windows}`` holding a run of windows with one verdict
    (``end_s`` the last one's end; ``windows`` how many). Windows with fewer than
    :data:`MIN_STEPS` analyzed steps, or without a verdict, are passed over: a job's last second
    is no change of regime."""
    runs: list[dict] = []
    for w in sorted(windows, key=lambda w: w.get("t0", 0)):
        if (w.get("steps") or 0) < MIN_STEPS or w.get("verdict") in (None, "unknown", "no_steps"):
            continue
        if runs and runs[-1]["verdict"] == w.get("verdict"):
            runs[-1]["end_s"] = w.get("end_s")
            runs[-1]["windows"] += 1
            continue
        runs.append({"start_s": w.get("start_s"), "end_s": w.get("end_s"), "verdict": w.get("verdict"),
                     "title": w.get("title"), "windows": 1})
    return runs


def departures_started(windows: list[dict]) -> list[dict]:
    """The windows where the job departed from its baseline after a window that did not (the first
    of each run of departed windows), time order: slowdowns that keep the verdict
    (``input_bound`` at 1,800 and then at 370 samples/s) show here."""
    out, before = [], False
    for w in sorted(windows, key=lambda w: w.get("t0", 0)):
        now = bool(w.get("departed"))
        if now and not before:
            out.append(w)
        before = now
    return out


def clock(seconds: float | None) -> str:
    """``seconds`` from the job's start as ``42 s``, ``12m05s`` or ``30h02m``."""
    if seconds is None:
        return "?"
    s = int(round(seconds))
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _utc(report: dict, seconds: float | None) -> str | None:
    """The wall-clock time (UTC) ``seconds`` after the run's start, or None when unknown."""
    import datetime as dt

    started = (report.get("run") or {}).get("started_utc")
    if not started or seconds is None:
        return None
    try:
        t = dt.datetime.fromisoformat(started) + dt.timedelta(seconds=seconds)
    except ValueError:
        return None
    return t.strftime("%Y-%m-%d %H:%M:%S UTC")


def over_time_lines(report: dict) -> list[tuple[str, str]]:
    """``(label, text)`` lines of the rolling diagnosis for the terminal: the verdict's changes over
    the job's windows (when it changed), each deep trace with its analysis, and the run's goodput."""
    lines = []
    runs = report.get("over_time") or []
    windows = report.get("windows") or []
    if len(runs) >= 2:
        parts = []
        for n, r in enumerate(runs):
            what = r["verdict"] + (f" ({r['title']})" if r.get("title") and r["verdict"] not in HEALTHY else "")
            if n == 0:
                parts.append(f"{clock(r['start_s'])}–{clock(r['end_s'])} {what}")
            else:
                when = _utc(report, r["start_s"])
                parts.append(f"from {clock(r['start_s'])}{f' ({when})' if when else ''} {what}"
                             + (" to the end" if n == len(runs) - 1 else f" to {clock(r['end_s'])}"))
        width = windows[1]["end_s"] - windows[1]["start_s"] if len(windows) > 1 else None
        lines.append(("over time", f"({len(windows)} windows" + (f" of {clock(width)}" if width else "") + "): "
                      + " · ".join(parts)))
    for w in departures_started(windows):
        lines.append(("went slow", f"at {clock(w.get('start_s'))}" + (f" ({_utc(report, w.get('start_s'))})"
                                                                        if _utc(report, w.get("start_s")) else "")
                      + f", window {w.get('i')}: " + "; ".join((w.get("departed") or [])[:3])))
    traces: dict[str, list[dict]] = {}
    for t in report.get("deep_traces") or []:
        traces.setdefault(str(t.get("id")), []).append(t)
    for tid, recs in traces.items():
        first = recs[0]
        lines.append(("deep trace", f"{tid} at {clock(first.get('start_s'))}, {first.get('steps')} steps"
                      + (f"; why: {first['reason']}" if first.get("reason") else "")))
        for t in sorted(recs, key=lambda t: (bool(t.get("job")), t.get("rank") or 0)):
            who = (f"ranks {', '.join(map(str, t.get('ranks') or []))} as one job" if t.get("job") else
                   f"rank {t['rank']}" if t.get("rank") is not None else f"pid {t.get('pid')}")
            if t.get("error"):
                lines.append(("  ", f"{who}: {t['error']}"))
                continue
            cost = (t.get("cost") or {}).get("ratio")
            lines.append(("  ", f"{who}: " + (f"{t['verdict']} ({t['title']})" if t.get("title") else
                                              "no finding of its own")
                          + (f"; rank {t['culprit_rank']} is the one the others wait for"
                             if t.get("culprit_rank") is not None else "")
                          + (f"; traced steps {cost:.2f}× the others" if cost else "") + f" → {t.get('file')}"))
    g = (report.get("metrics") or {}).get("goodput")
    if g and (len(runs) >= 2 or report.get("deep_traces")):
        lost = sorted(((k, v) for k, v in (g.get("lost_s") or {}).items() if v >= 0.05), key=lambda kv: -kv[1])
        lines.append(("goodput", f"{g['ratio']:.0%} of {clock(g['wall_s'])} was productive step time"
                      + ("; lost: " + ", ".join(f"{k.replace('_', ' ')} {clock(v) if v >= 120 else f'{v:.1f} s'}"
                                                for k, v in lost) if lost else "")))
    return lines
