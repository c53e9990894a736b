"""HTML renderer: one self-contained page per run (``RUN_DIR/report.html``, ``whyidle report --html``).

The page holds the verdict and findings with their fixes first, then the plots of
:mod:`whyidle.report.plots` drawn by plotly.js, which is embedded once, inline: the file opens
offline and fetches nothing (a Content-Security-Policy of ``default-src 'none'`` enforces it).

Escaping: the page is a Jinja2 template with autoescape on, so every string from the run (command,
source lines, notes, finding texts and code) is HTML-escaped. Figure data goes into
``<script type="application/json">`` blocks with ``<``, ``>``, ``&`` and U+2028/2029 written as
``\\uXXXX`` escapes, so no run string can close the block; it is read with ``JSON.parse``, never
evaluated.
"""

from __future__ import annotations

import json
import pkgutil
import re
import secrets
import shlex

import jinja2
import numpy as np
import plotly
from markupsafe import Markup, escape

from whyidle.analysis.series import RunSeries
from whyidle.jsonsafe import finite
from whyidle.report import cell_sites, plots
from whyidle.report.build import framework_text, logged_text, option_gain, steady_line, verdict_line

_ENV = jinja2.Environment(loader=jinja2.PackageLoader("whyidle.report", "templates"),
                          autoescape=True, trim_blocks=False, lstrip_blocks=False,
                          undefined=jinja2.StrictUndefined)
#: Rows of the hotspot / idle-site tables.
MAX_TABLE_ROWS = 12
_PLOTLY_JS: bytes | None = None


def _plotly_js_bytes() -> bytes:
    """plotly.js (minified, UTF-8) from the plotly package, checked once to be safe inside
    ``<script>``. Kept as bytes: as a ``str`` it would take ~10 MB (it holds non-Latin-1 characters)
    and every page built around it as much again."""
    global _PLOTLY_JS
    if _PLOTLY_JS is None:
        js = pkgutil.get_data("plotly", "package_data/plotly.min.js")
        if js is None:  # not a plain package directory: the public accessor
            from plotly.offline import get_plotlyjs

            js = get_plotlyjs().encode("utf-8")
        if re.search(rb"</script", js, re.I):  # never seen; would end the inline block early
            js = re.sub(rb"</(script)", rb"<\\/\1", js, flags=re.I)
        _PLOTLY_JS = js
    return _PLOTLY_JS


def _plotly_js() -> str:
    """:func:`_plotly_js_bytes` as text."""
    return _plotly_js_bytes().decode("utf-8")


def safe_json(obj) -> str:
    """JSON text that can sit inside an HTML ``<script>`` element: ``<``, ``>``, ``&``, U+2028 and
    U+2029 are written as ``\\uXXXX`` escapes (the parsed value is unchanged)."""
    text = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                    ("\u2029", "\\u2029")):
        text = text.replace(ch, esc)
    return text


def inline_code(text) -> Markup:
    """HTML-escapes ``text`` and shows its `backtick` spans as ``<code>`` (finding texts quote code
    that way). Escaping comes first, so nothing of ``text`` can become markup."""
    escaped = str(escape(str(text)))
    return Markup(re.sub(r"`([^`\n]+)`", r"<code>\1</code>", escaped))


_ENV.filters["code"] = inline_code


def _figure_json(fig: dict) -> str:
    """A :mod:`~whyidle.report.plots` figure as JSON for ``JSON.parse`` (numpy values as plain
    numbers; NaN and infinities, which JSON lacks, as null: plotly draws a gap)."""
    try:
        text = json.dumps(fig, separators=(",", ":"), allow_nan=False, default=_plain)
    except ValueError:  # a NaN got past the builders
        text = json.dumps(finite(fig), separators=(",", ":"), allow_nan=False, default=_plain)
    return safe_json(text)


def _plain(obj):
    if isinstance(obj, (np.ndarray, np.generic)):
        return finite(obj.tolist())
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def _pct(x) -> str:
    return "n/a" if x is None else f"{x:.0%}"


def _ms(x) -> str:
    return "n/a" if x is None else f"{x * 1000:.1f} ms"


def _duration(s) -> str:
    if s is None:
        return "n/a"
    if s < 120:
        return f"{s:.1f} s"
    h, rest = divmod(int(round(s)), 3600)
    m, sec = divmod(rest, 60)
    return (f"{h} h " if h else "") + f"{m} min {sec} s"


def _verdict(report: dict) -> tuple[str, str | None, bool]:
    text, gain, ok = verdict_line(report)
    return text, f"{gain:.2f}×" if gain else None, ok


def _header(report: dict) -> list[tuple[str, str, bool]]:
    m = report.get("metrics") or {}
    run = report.get("run") or {}
    device = report.get("device") or {}
    rows = [("command", shlex.join(report.get("command") or []) or "(no command)", True)]
    dev = str(device.get("name") or device.get("kind") or "unknown")
    if device.get("kind"):
        dev += f" ({device['kind']}" + (f", compute capability {device['compute_capability']}"
                                         if device.get("compute_capability") else "") + ")"
    rows += [("framework", framework_text(report), False), ("device", dev, False)]
    status = "ended by signal %s" % run["signal"] if run.get("signal") else (
        f"exit code {run['exit_code']}" if run.get("exit_code") is not None else "")
    rows.append(("duration", _duration(m.get("wall_s")) + (f" ({status})" if status else ""), False))
    rows.append(("started", str(run.get("started_utc") or "n/a"), False))
    rows.append(("steps", f"{m.get('steps', 0)} ({m.get('steps_analyzed', 0)} analyzed)", False))
    sps = m.get("samples_per_s")
    rows.append(("samples/s", f"{sps:,.1f}" + (f" (batch {m['batch_size']:g})" if m.get("batch_size") else "")
                 if sps else "n/a", False))
    st = m.get("step_time_s") or {}
    rows.append(("step time", f"p50 {_ms(st.get('p50'))} · p90 {_ms(st.get('p90'))}" if st else "n/a", False))
    rows.append(("shares", " · ".join(f"{plots.PHASES[k][0]} {v:.0%}" for k, v in (m.get("shares") or {}).items()
                                       if k in plots.PHASES and (v or 0) >= 0.005) or "n/a", False))
    logged = logged_text(report)
    if logged:
        rows.append(("logged", logged, True))
    if run.get("run_dir"):
        rows.append(("run dir", str(run["run_dir"]), True))
    return rows


def _site_lines(f: dict) -> list[dict]:
    ev = f.get("evidence") or {}
    out = []
    for s in (ev.get("sites") or [])[:MAX_TABLE_ROWS] if isinstance(ev.get("sites"), list) else []:
        if not isinstance(s, dict):
            continue
        suffix = (f" ({s['op']})" if s.get("op") else "") + (
            f"  {s['per_step']:.1f}/step" if isinstance(s.get("per_step"), (int, float)) else "") + (
            f"  idle {s['share']:.0%}" if isinstance(s.get("share"), (int, float)) else "")
        out.append({"prefix": "", "where": str(s.get("site") or s.get("leaf")), "suffix": suffix})
    for h in (ev.get("hotspots") or [])[:MAX_TABLE_ROWS] if isinstance(ev.get("hotspots"), list) else []:
        if not isinstance(h, dict):
            continue
        prefix = f"{h['share']:.0%} " if isinstance(h.get("share"), (int, float)) else ""
        suffix = (f"   {h['code']}" if h.get("code") else "") + (
            f"  → {h['leaf']}" if h.get("leaf") and h["leaf"] != h.get("site") else "")
        where = h.get("function") if h.get("framework") else (h.get("site") or h.get("function"))
        out.append({"prefix": prefix, "where": str(where), "suffix": suffix})
    return out


def _findings(report: dict) -> list[dict]:
    out = []
    for f in report.get("findings") or []:
        fix = f.get("fix") or {}
        options = [o for o in fix.get("options") or [] if isinstance(o, dict)]
        docs = [str(u) for u in fix.get("docs") or [] if str(u).startswith(("https://", "http://"))]
        out.append({
            "id": str(f.get("id")), "severity": f.get("severity") if f.get("severity") in ("critical", "warning", "info")
            else "info", "title": str(f.get("title") or f.get("id")), "summary": str(f.get("summary") or ""),
            "est": f"{f['est_speedup']:.2f}×" if isinstance(f.get("est_speedup"), (int, float)) else None,
            "holds": f"{f['bound']:.0%}" if isinstance(f.get("bound"), (int, float)) and f.get("id") != "device_bound"
            else None,
            "grows": (options[0].get("condition") if options else None),
            "options": [{"text": str(o.get("text") or ""), "gain": option_gain(o),
                         "code": o["code"] if isinstance(o.get("code"), str) else None} for o in options[1:]],
            "sites": _site_lines(f), "fix_text": fix.get("text"), "fix_code": fix.get("code"), "docs": docs,
            "evidence": json.dumps(f.get("evidence"), indent=1, default=str, ensure_ascii=False)
            if f.get("evidence") else None,
        })
    return out


def _no_gpu_reason(msgs: list[str]) -> str:
    return "No GPU was observed" + (f": {'; '.join(msgs)}." if msgs else " (NVML found no NVIDIA GPU).")


def _idle_table(gpu: dict | None, report: dict) -> dict | None:
    """The top idle source lines (CUDA runs), else the host hotspots of the findings."""
    sites = (gpu or {}).get("idle_sites") or []
    if sites:
        return {"title": "Where the GPU waited (top source lines)",
                "caption": "Each stack sample's share of the starved time, by the user's source line and the "
                           "innermost Python frame under it.",
                "head": ["source line", "innermost frame", "phase", "seconds", "share of idle"],
                "numeric": ("seconds", "share of idle"), "code": ("source line", "innermost frame"),
                "rows": [[str(s.get("site") or ""), str(s.get("leaf") or ""), str(s.get("phase") or ""),
                          f"{s['seconds']:.3f}" if s.get("seconds") is not None else "",
                          _pct(s.get("share"))] for s in sites[:MAX_TABLE_ROWS]]}
    rows = []
    for f in report.get("findings") or []:
        for h in (f.get("evidence") or {}).get("hotspots") or []:
            if isinstance(h, dict):
                rows.append([str(f.get("id")), str(h.get("site") or h.get("function") or ""), str(h.get("leaf") or ""),
                             f"{h['seconds']:.3f}" if isinstance(h.get("seconds"), (int, float)) else "",
                             _pct(h.get("share")) if isinstance(h.get("share"), (int, float)) else ""])
    if not rows:
        return None
    return {"title": "Host hotspots (from the findings)",
            "caption": "Source lines of the training thread's stack samples that hold the step, as the findings "
                       "cite them; share = fraction of the summed step time.",
            "head": ["finding", "source line", "innermost frame", "seconds", "share of step time"],
            "numeric": ("seconds", "share of step time"), "code": ("source line", "innermost frame"),
            "rows": rows[:MAX_TABLE_ROWS]}


def build_plots(report: dict, series: RunSeries) -> list[plots.Plot]:
    """The report's plots, in page order (see :mod:`whyidle.report.plots`), from the report and the
    run's time series (:func:`whyidle.analysis.series.run_series`)."""
    window_s, steps, left_out, devices, cpu = series.window_s, series.steps, series.left_out, series.gpus, series.cpu
    framework = report.get("framework")
    no_steps = ("No training steps were recorded: no process of the command imported PyTorch, Keras or TensorFlow."
                if framework in (None, "none") else
                f"No training steps were recorded ({framework} was imported, but no optimizer step, DataLoader "
                "batch or Keras batch was seen).")
    gpu = (report.get("metrics") or {}).get("gpu")
    no_gpu = _no_gpu_reason(series.gpu_notices)
    if gpu is None and not devices:
        idle_why = no_gpu + " GPU idle per cause needs a GPU."
    elif gpu and gpu.get("idle_method") is None and not gpu.get("idle_s_by_cause"):
        idle_why = ("GPU idle per cause was not measured: the model's parameters never reached CUDA (or the CUDA "
                    "timeline was off), so only NVML's utilization is shown.")
    else:
        idle_why = "GPU idle per cause was not measured."
    builders = [
        ("time", "Wall time by part", lambda: plots.time_plot((report.get("metrics") or {}).get("time"))),
        *([("windows", "Verdict over time", lambda: plots.windows_plot(report))]
          if len(report.get("over_time") or []) >= 2 or len(report.get("windows") or []) >= 4 else []),
        ("gpu_util", "GPU utilization", lambda: plots.gpu_util_plot(devices, no_gpu, window_s)),
        ("cpu", "CPU and memory", lambda: plots.cpu_plot(cpu, window_s, series.interval_s)),
        ("steps", "Step time and data wait per step", lambda: plots.step_time_plot(steps, left_out, no_steps)),
        ("phases", "Step time by phase",
         lambda: plots.phase_plot(steps, left_out, series.phase_bars, (report.get("metrics") or {}).get("shares"),
                                  no_steps)),
        ("idle", "GPU idle by cause", lambda: plots.idle_cause_plot(gpu, idle_why)),
        *([("workers", "DataLoader workers", lambda: plots.workers_plot(series.worker_batches, window_s))]
          if series.worker_batches else []),
        *([("queue", "DataLoader queue", lambda: plots.queue_plot(series.queue_depth, window_s))]
          if series.queue_depth else []),
    ]
    out = []
    for key, title, build in builders:
        try:
            out.append(build())
        except Exception as exc:  # a plot must never cost the rest of the report
            out.append(plots.Plot(key, title, "", why=f"This plot could not be drawn ({type(exc).__name__}: {exc})."))
    return out


def render_html(report: dict, series: RunSeries) -> str:
    """The report as one self-contained HTML page (str, UTF-8 text, a few MB: plotly.js is inline).

    Args:
        report: the ``whyidle.report/1`` dict (:func:`whyidle.report.build.build_report`).
        series: the run's time series (:func:`whyidle.analysis.series.run_series`).
    """
    return b"".join(render_parts(report, series)).decode("utf-8")


def render_parts(report: dict, series: RunSeries) -> tuple[bytes, bytes, bytes]:
    """The page of :func:`render_html` as UTF-8 parts (text before plotly.js, plotly.js, text after
    it), so a writer never holds the whole page as one string."""
    report = cell_sites.for_display(report)  # notebook sites read "cell 5, line 28"
    figures, views = [], []
    for n, p in enumerate(build_plots(report, series)):
        view = {"key": p.key, "title": p.title, "caption": p.caption, "why": p.why, "notes": p.notes,
                "fig_id": None, "table": None}
        if p.figure is not None:
            view["fig_id"] = f"fig-{n}-{p.key}"
            figures.append({"id": view["fig_id"], "json": Markup(_figure_json(p.figure))})
            p.figure = None
        if p.key == "idle":
            view["table"] = _idle_table((report.get("metrics") or {}).get("gpu"), report)
        views.append(view)
    text, gain, ok = _verdict(report)
    mark = f"plotly.js-{secrets.token_hex(16)}"  # a placeholder no run string can hold
    page = _ENV.get_template("report.html.j2").render(
        name=report.get("name"), verdict_text=text, verdict_gain=gain, verdict_ok=ok,
        verdict_steady=steady_line(report), header=_header(report),
        notes=[str(n) for n in report.get("notes") or []], findings=_findings(report), plots=views,
        figures=figures, plotlyjs=Markup(mark), plotly_version=plotly.__version__,
        tool_version=report.get("tool_version"), schema=report.get("schema"))
    head, tail = page.split(mark)
    return head.encode("utf-8"), _plotly_js_bytes(), tail.encode("utf-8")
