"""Figure builders of the HTML report: plain series in, plotly.js figures out (no page assembly).

Each builder takes the series of :mod:`whyidle.analysis.series` (times in seconds since the run's
origin) and returns a :class:`Plot`: a figure as plotly.js reads it (``{"data": [traces],
"layout": {...}}``, plain dicts and lists, ``layout.template`` plotly's ``plotly_white``), or
``figure=None`` with one sentence (``why``) saying why the data is missing. The figures are plain
data, not ``plotly.graph_objects``: building and validating those costs ~25 MB of memory and a
few tenths of a second for these few traces. Long series are reduced so a trace holds at most
:data:`MAX_POINTS` points (min/max per bin for lines, which keeps spikes; means for stacked CPU, so
the stack still adds up), and per-step bars are binned to at most :data:`MAX_BARS`; a plot says so
in its ``notes``.

Strings that came from the run (device names) are HTML-escaped before they reach plotly, which
interprets a subset of HTML in labels.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pkgutil

import numpy as np

from whyidle.analysis.series import LEFT_OUT_REASONS, PHASE_BARS
from whyidle.report.windows import over_time_lines
from markupsafe import escape

#: Most points one trace of a time series holds: ~5,000 keeps a page with a few long traces at a few
#: MB and plotly's drawing under a second, still finer than a 1920 px wide plot can show.
MAX_POINTS = 5000
#: Most bars of the per-step phase plot (:func:`whyidle.analysis.series.phase_bars`).
MAX_BARS = PHASE_BARS

#: Phase → (label, colour), in the order a step runs them (the terminal report's order).
PHASES = {
    "data_wait": ("data wait", "#d62728"),
    "forward": ("forward", "#2ca02c"),
    "backward": ("backward", "#1f77b4"),
    "optimizer": ("optimizer", "#9467bd"),
    "eval": ("eval", "#17becf"),
    "compute": ("compute (train step)", "#8c564b"),
    "other_host": ("other host", "#ff9f1c"),
}
#: CPU roles of :func:`whyidle.analysis.series.cpu_series` → (label, colour), bottom of the stack first.
CPU_ROLES = {
    "trainer": ("trainer", "#1f77b4"),
    "workers": ("DataLoader workers", "#ff7f0e"),
    "tree_other": ("rest of the command", "#2ca02c"),
    "whyidle": ("whyidle", "#bcbd22"),
    "other": ("other processes", "#7f7f7f"),
}
#: GPU idle causes (``metrics.gpu.idle_s_by_cause``) → (label, colour).
IDLE_CAUSES = {
    "data": ("data (waiting for the next batch)", "#d62728"),
    "sync": ("sync (after a host↔device sync)", "#9467bd"),
    "host": ("host (Python between launches)", "#ff9f1c"),
    "launch": ("launch (host slower than the kernels)", "#1f77b4"),
    "other": ("other", "#7f7f7f"),
}
#: Parts of the command's wall time (``metrics.time.parts``) → (label, colour), in the job's order.
TIME_PARTS = {
    "startup": ("start-up", "#7f7f7f"),
    "training": ("training steps", "#2ca02c"),
    "compile": ("torch.compile recompiling", "#d62728"),
    "evaluation": ("evaluation", "#9467bd"),
    "checkpoint": ("checkpoints", "#8c564b"),
    "logging": ("logging", "#ff9f1c"),
    "epoch_boundary": ("epoch boundaries", "#e377c2"),
    "teardown": ("teardown", "#bbbbbb"),
}
#: Why a step is left out of the metrics → marker colour.
LEFT_OUT = {"warm-up": "#7f7f7f", "boundary": "#e377c2", "profiled": "#17becf", "other": "#bbbbbb"}

_TIME_AXIS = "seconds since the command started"
_LAYOUT = dict(height=340, margin=dict(l=64, r=24, t=36, b=48),
               legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="left", x=0, traceorder="normal"),
               hovermode="x unified", font=dict(size=12))
_TEMPLATE: dict | None = None


def _template() -> dict:
    """plotly's ``plotly_white`` template as the plotly package ships it (read once, shared by all
    figures: never modify it)."""
    global _TEMPLATE
    if _TEMPLATE is None:
        raw = pkgutil.get_data("plotly", "package_data/templates/plotly_white.json")
        if raw is None:  # not a plain package directory: through plotly.io (~10 MB more memory)
            import plotly.io as pio

            _TEMPLATE = pio.templates["plotly_white"].to_plotly_json()
        else:
            _TEMPLATE = json.loads(raw)
    return _TEMPLATE


@dataclasses.dataclass
class Plot:
    """One plot of the report: ``figure`` (a plotly.js figure, ``{"data": [...], "layout": {...}}``)
    or, when the data was not recorded, ``why`` (one sentence). ``notes``: sentences about
    reductions (binning) shown under the plot."""

    key: str
    title: str
    caption: str
    figure: dict | None = None
    why: str | None = None
    notes: list[str] = dataclasses.field(default_factory=list)


class _Figure:
    """A plotly.js figure under construction: traces and layout; with ``row_heights``, a column of
    subplots laid out as ``plotly.subplots.make_subplots(rows=len(row_heights), cols=1, ...)``
    lays them out (row 1 on top; ``shared_xaxes``: the upper rows' x axes match the bottom one's
    and hide their tick labels)."""

    def __init__(self, row_heights: list[float] | None = None, vertical_spacing: float = 0.0,
                 shared_xaxes: bool = False) -> None:
        self.data: list[dict] = []
        self.layout: dict = {}
        self.rows = len(row_heights or [])
        if not row_heights:
            return
        n = self.rows
        total = float(sum(row_heights))
        heights = [(1.0 - vertical_spacing * (n - 1)) * (h / total) for h in row_heights]
        for r in range(1, n + 1):
            below = heights[r:]  # rows under this one
            y0 = sum(below) + len(below) * vertical_spacing
            self.layout[self._axis("x", r)] = {"anchor": self._ref("y", r), "domain": [0.0, 1.0]}
            self.layout[self._axis("y", r)] = {"anchor": self._ref("x", r),
                                               "domain": [min(1.0, y0), min(1.0, y0 + heights[r - 1])]}
        if shared_xaxes:
            for r in range(1, n):
                self.layout[self._axis("x", r)].update(matches=self._ref("x", n), showticklabels=False)

    @staticmethod
    def _ref(letter: str, row: int) -> str:
        return letter if row == 1 else f"{letter}{row}"

    @staticmethod
    def _axis(letter: str, row: int) -> str:
        return f"{letter}axis" if row == 1 else f"{letter}axis{row}"

    def add(self, trace: dict, row: int | None = None) -> None:
        if row is not None and self.rows:
            trace["xaxis"], trace["yaxis"] = self._ref("x", row), self._ref("y", row)
        self.data.append(trace)

    def axis(self, letter: str, row: int = 1, **props) -> None:
        """Sets properties of the x or y axis of ``row`` (1 without subplots)."""
        self.layout.setdefault(self._axis(letter, row), {}).update(props)

    def shade_window(self, window_s) -> None:
        """Shades the analyzed steps' window (the one the metrics cover) on every time axis."""
        if not window_s:
            return
        for r in range(1, max(1, self.rows) + 1):
            self.layout.setdefault("shapes", []).append(
                {"type": "rect", "x0": window_s[0], "x1": window_s[1], "xref": self._ref("x", r), "y0": 0, "y1": 1,
                 "yref": self._ref("y", r) + " domain", "fillcolor": "#4c78a8", "opacity": 0.07,
                 "line": {"width": 0}, "layer": "below"})

    def done(self, **layout) -> dict:
        """The figure: the axes and shapes set so far, :data:`_LAYOUT`, ``layout``, the template."""
        out = dict(self.layout)
        for key, value in {**_LAYOUT, **layout}.items():
            old = out.get(key)
            out[key] = {**old, **value} if isinstance(old, dict) and isinstance(value, dict) else value
        out["template"] = _template()
        return {"data": self.data, "layout": out}


def _title(text: str) -> dict:
    return {"text": text}


def _clean(values, digits: int) -> list:
    """Floats → rounded Python floats, NaN/None → None (plotly draws a gap)."""
    out = []
    for v in values:
        if v is None:
            out.append(None)
            continue
        v = float(v)
        out.append(None if math.isnan(v) else round(v, digits))
    return out


def _floats(values) -> np.ndarray:
    if isinstance(values, np.ndarray) and values.dtype.kind in "fiub":
        return values.astype(float, copy=False)
    return np.array([np.nan if v is None else v for v in values], dtype=float)


def minmax_indices(y, max_points: int = MAX_POINTS) -> np.ndarray:
    """Indices of ``y`` to draw so at most ``max_points`` remain: per bin of consecutive points its
    minimum and maximum (in order), plus the first and last point. All indices when short enough."""
    y = y if isinstance(y, np.ndarray) and y.dtype.kind in "fiub" else _floats(y)  # a slab at a time below
    n = len(y)
    if n <= max_points:
        return np.arange(n)
    k = math.ceil(n / max(1, (max_points - 2) // 2))  # points per bin
    nb = math.ceil(n / k)
    step = max(1, (1 << 18) // k)  # bins read at once: a few MB whatever the run's length
    idx = [np.array([0, n - 1])]
    for b0 in range(0, nb, step):
        b1 = min(nb, b0 + step)
        part = _floats(y[b0 * k:b1 * k])
        pad = (b1 - b0) * k - len(part)
        lo = np.concatenate([np.where(np.isnan(part), np.inf, part), np.full(pad, np.inf)]).reshape(b1 - b0, k)
        hi = np.concatenate([np.where(np.isnan(part), -np.inf, part), np.full(pad, -np.inf)]).reshape(b1 - b0, k)
        base = np.arange(b0, b1) * k
        idx += [base + lo.argmin(axis=1), base + hi.argmax(axis=1)]
    return np.unique(np.clip(np.concatenate(idx), 0, n - 1))


def bin_reduce(x, columns: dict, max_points: int = MAX_POINTS, how: dict | None = None):
    """Averages consecutive points of equal-length columns into at most ``max_points`` bins.

    Args:
        x: positions (e.g. seconds); each bin is placed at the mean of its ``x``.
        columns: name → values (None = missing).
        how: name → ``"mean"`` (default) or ``"max"``.
    Returns:
        (x, columns, k): the reduced series and the points per bin (1 = unchanged).
    """
    n = len(x)
    if n <= max_points:
        return list(x), {c: list(v) for c, v in columns.items()}, 1
    k = math.ceil(n / max_points)
    nb = n // k  # the last partial bin is averaged on its own below
    def red(values, fn):
        a = _floats(values)
        head = a[: nb * k].reshape(nb, k)
        with np.errstate(all="ignore"):
            out = list(fn(head, axis=1))
            if nb * k < n:
                out.append(fn(a[nb * k:]))
        return out
    xs = red(x, np.nanmean)
    cols = {c: red(v, np.nanmax if (how or {}).get(c) == "max" else np.nanmean) for c, v in columns.items()}
    return xs, cols, k


def gpu_util_plot(devices: list[dict], why: str, window_s=None) -> Plot:
    """GPU activity over time, one trace per device and measure.

    Args:
        devices: :func:`whyidle.analysis.series.gpu_series` (NVML duty-cycle samples in percent,
            GPM windows as fractions).
        why: the sentence shown when there is nothing to draw.
        window_s: (start, end) of the analyzed steps, seconds since the origin, shaded.
    """
    plot = Plot("gpu_util", "GPU utilization",
                "NVML “GPU util” (percent of each driver sample period in which any kernel ran, at the "
                "driver’s sample rate) and, on Hopper and newer, GPM SM activity and tensor-core activity "
                "(percent of the SMs / tensor pipes busy over each GPM window). Shaded: the analyzed steps.")
    fig = _Figure()
    reduced = False
    for d in devices:
        name = str(escape(f"GPU {d.get('index')}" + (f" ({d['name']})" if d.get("name") else "")))
        if d.get("util"):
            pts = np.asarray(d["util"], dtype=float).reshape(-1, 2)
            keep = minmax_indices(pts[:, 1])
            reduced |= len(keep) < len(pts)
            fig.add({"type": "scatter", "x": _clean(pts[keep, 0], 3), "y": _clean(pts[keep, 1], 1), "mode": "lines",
                     "line": {"shape": "vh"}, "name": f"{name} NVML util", "hovertemplate": "%{y:.0f}%"})
        for key, label, dash in (("sm_active", "SM active (GPM)", "solid"), ("tensor_active", "tensor cores (GPM)", "dot")):
            wins = d.get(key) or []
            if not wins:
                continue
            w = np.asarray(wins, dtype=float).reshape(-1, 3)
            xs = w[:, :2].reshape(-1)  # each window as a flat segment: t0, t1, t0, t1, ...
            ys = np.repeat(w[:, 2] * 100, 2)
            keep = minmax_indices(ys)
            reduced |= len(keep) < len(ys)
            fig.add({"type": "scatter", "x": _clean(xs[keep], 3), "y": _clean(ys[keep], 1), "mode": "lines",
                     "line": {"dash": dash}, "name": f"{name} {label}", "hovertemplate": "%{y:.0f}%"})
    if not fig.data:
        plot.why = why if not devices else ("NVML saw the GPU but gave no utilization samples and no GPM windows "
                                            "during the run.")
        return plot
    if reduced:
        plot.notes.append(f"Long series reduced to at most {MAX_POINTS:,} points per trace (minimum and maximum "
                          "of each bin kept, so short dips and spikes stay visible).")
    fig.shade_window(window_s)
    plot.figure = fig.done(xaxis={"title": _title(_TIME_AXIS)}, yaxis={"title": _title("percent"), "range": [0, 105]})
    return plot


def cpu_plot(cpu: dict, window_s=None, interval_s: float | None = None) -> Plot:
    """CPU by role (stacked, in cores) with the machine's core count, and memory below.

    Args:
        cpu: :func:`whyidle.analysis.series.cpu_series`.
        window_s: the analyzed steps' window (seconds since the origin), shaded.
        interval_s: the host sampling period, for the sentence when there are too few samples.
    """
    plot = Plot("cpu", "CPU and memory",
                "CPU-seconds per second (1.0 = one core busy) between consecutive host samples, stacked by "
                "role: the training process, its DataLoader workers, the rest of the observed command, whyidle "
                "itself and every other process of the machine; the dashed line is the number of logical "
                "CPUs, the dotted one the cores the job may use where its affinity or a cgroup quota allows fewer. Below: memory used by the machine and resident memory of the command’s processes (GiB). "
                "Shaded: the analyzed steps.")
    if len(cpu.get("t_s") or []) < 1:
        every = f" every {interval_s:g} s" if interval_s else ""
        plot.why = (f"Fewer than two host samples were recorded (the host is sampled{every}; the command "
                    "ended sooner), so there is no CPU interval to show.")
        return plot
    cols = {role: cpu[role] for role in CPU_ROLES}
    cols["mem_used"] = [None if b is None else b / 2**30 for b in cpu["mem_used_bytes"]]
    cols["rss"] = [None if b is None else b / 2**30 for b in cpu["tree_rss_bytes"]]
    t, cols, k = bin_reduce(cpu["t_s"], cols, how={"mem_used": "max", "rss": "max"})
    if k > 1:
        plot.notes.append(f"{len(cpu['t_s']):,} host intervals averaged in bins of {k} (memory: the maximum of "
                          "each bin).")
    fig = _Figure(row_heights=[0.72, 0.28], vertical_spacing=0.06, shared_xaxes=True)
    tx = _clean(t, 3)
    for role, (label, colour) in CPU_ROLES.items():
        fig.add({"type": "scatter", "x": tx, "y": _clean(cols[role], 3), "mode": "lines", "stackgroup": "cpu",
                 "name": label, "line": {"width": 0.5, "color": colour}, "hovertemplate": "%{y:.2f} cores"}, row=1)
    cores = cpu.get("cores") or 1
    fig.add({"type": "scatter", "x": [tx[0], tx[-1]], "y": [cores, cores], "mode": "lines", "name": f"{cores} cores",
             "line": {"dash": "dash", "color": "black", "width": 1}, "hoverinfo": "skip"}, row=1)
    if cpu.get("cores_limit_by"):  # the job may use fewer (its affinity, a cgroup CPU quota)
        usable = cpu["cores_usable"]
        fig.add({"type": "scatter", "x": [tx[0], tx[-1]], "y": [usable, usable], "mode": "lines",
                 "name": f"{usable:g} usable ({cpu['cores_limit_by']})",
                 "line": {"dash": "dot", "color": "#d62728", "width": 1}, "hoverinfo": "skip"}, row=1)
    fig.add({"type": "scatter", "x": tx, "y": _clean(cols["mem_used"], 3), "mode": "lines",
             "name": "machine memory used", "line": {"color": "#555"}, "hovertemplate": "%{y:.2f} GiB"}, row=2)
    fig.add({"type": "scatter", "x": tx, "y": _clean(cols["rss"], 3), "mode": "lines", "name": "command RSS",
             "line": {"color": "#1f77b4", "dash": "dot"}, "hovertemplate": "%{y:.2f} GiB"}, row=2)
    fig.shade_window(window_s)
    fig.axis("y", 1, title=_title("cores"), rangemode="tozero")
    fig.axis("y", 2, title=_title("GiB"), rangemode="tozero")
    fig.axis("x", 2, title=_title(_TIME_AXIS))
    plot.figure = fig.done(height=440)
    return plot


#: A left-out step (warm-up, epoch boundary) taller than this many times the tallest analyzed step
#: no longer sets the y axis: the first step of a run is often 5–20× a steady step.
LEFT_OUT_AXIS_FACTOR = 1.5


def _y_top(step: np.ndarray, analyzed: np.ndarray, scale: float = 1.0) -> float | None:
    """Top of the y axis (ms) when left-out steps would squash the analyzed ones, else None;
    ``step``: step times in ms, or in s with ``scale`` 1000."""
    if not analyzed.any() or analyzed.all():
        return None
    top = float(np.float64(step[analyzed].max()) * scale)
    return top * 1.15 if float(np.float64(step.max()) * scale) > LEFT_OUT_AXIS_FACTOR * top else None


def _left_out(left_out, n: int) -> np.ndarray:
    """Each step's left-out reason as an int8 index into ``LEFT_OUT_REASONS`` (0: None, an
    analyzed step), from :func:`whyidle.analysis.series.left_out_codes` (an int array) or
    :func:`~whyidle.analysis.series.left_out_steps` (a list)."""
    if isinstance(left_out, np.ndarray) and left_out.dtype.kind in "iu":
        return left_out
    return np.fromiter((LEFT_OUT_REASONS.index(r) if r in LEFT_OUT_REASONS else 4 for r in left_out),
                       dtype=np.int8, count=n)


def step_time_plot(steps: dict, left_out, why: str = "No training steps were recorded.") -> Plot:
    """Step time and data wait per step (ms) over the step index, marking left-out steps.

    Args:
        steps: :func:`whyidle.analysis.series.step_columns` (or ``step_series``) of all the primary
            trainer's steps.
        left_out: per step, why the metrics leave it out (``"warm-up"``, ``"boundary"``,
            ``"profiled"``) or None; or those as :func:`whyidle.analysis.series.left_out_codes`.
        why: the sentence shown when there are no steps.
    """
    plot = Plot("steps", "Step time and data wait per step",
                "Wall time of each training step and the part of it spent waiting for the next batch "
                "(DataLoader or tf.data iterator), in milliseconds. Marked steps are left out of the "
                "metrics: warm-up, steps holding an epoch boundary or evaluation, steps run under a "
                "profiler window (whyidle's TensorFlow window, or a deep trace).")
    n = len(steps.get("i", ()))
    if not n:
        plot.why = why
        return plot
    i = np.asarray(steps["i"])
    codes = _left_out(left_out, n)
    # the points are picked on the seconds as stored (float32 for a long run: x1000 keeps their
    # order); only the drawn ones are made ms (float64), as a whole float64 copy would be made
    step_s = np.asarray(steps["step_s"])

    def ms(values: np.ndarray, sel) -> np.ndarray:
        return np.asarray(values[sel], float) * 1000

    fig = _Figure()
    keep_s = minmax_indices(step_s)
    if len(keep_s) < n:
        plot.notes.append(f"{n:,} steps reduced to at most {MAX_POINTS:,} points per line (minimum and maximum of "
                          "each bin of consecutive steps).")
    fig.add({"type": "scatter", "x": i[keep_s].tolist(), "y": _clean(ms(step_s, keep_s), 3), "mode": "lines",
             "name": "step time", "line": {"color": "#1f77b4"}, "hovertemplate": "%{y:.1f} ms"})
    if "data_wait" in steps.get("has", []):
        wait_s = np.asarray(steps["data_wait"])
        keep_w = minmax_indices(wait_s)
        fig.add({"type": "scatter", "x": i[keep_w].tolist(), "y": _clean(ms(wait_s, keep_w), 3), "mode": "lines",
                 "name": "data wait", "line": {"color": PHASES["data_wait"][1]}, "fill": "tozeroy",
                 "hovertemplate": "%{y:.1f} ms"})
    for reason, colour in LEFT_OUT.items():
        rows = np.flatnonzero(codes == LEFT_OUT_REASONS.index(reason))
        if not len(rows):
            continue
        if len(rows) > MAX_POINTS:
            rows = rows[minmax_indices(step_s[rows])]
        fig.add({"type": "scatter", "x": i[rows].tolist(), "y": _clean(ms(step_s, rows), 3), "mode": "markers",
                 "name": f"left out: {reason}", "marker": {"color": colour, "size": 7, "symbol": "x"},
                 "hovertemplate": "%{y:.1f} ms"})
    yaxis = {"title": _title("ms"), "rangemode": "tozero"}
    top = _y_top(step_s, codes == 0, 1000)
    if top is not None:
        yaxis["range"] = [0, top]
        plot.notes.append("Left-out steps taller than the axis are cut off at the top: double-click the plot to "
                          "see them whole.")
    plot.figure = fig.done(xaxis={"title": _title("step")}, yaxis=yaxis)
    return plot


def phase_plot(steps: dict, left_out, bars: dict | None, shares: dict | None,
               why: str = "No training steps were recorded.") -> Plot:
    """Step time by phase: the overall shares (one 100 % bar) and a stacked bar per step (ms).

    Args:
        steps: :func:`whyidle.analysis.series.step_columns` of all the primary trainer's steps
            (``i`` is read).
        left_out: each step's :func:`whyidle.analysis.series.left_out_codes`.
        bars: :func:`whyidle.analysis.series.phase_bars` of the same steps (a step a bar up to
            :data:`MAX_BARS` steps; longer runs binned into at most that many bars, each the mean
            step of the bin's analyzed steps, all of its steps when none is analyzed).
        shares: ``metrics.shares`` (fractions of summed step time over the analyzed steps).
        why: the sentence shown when there are no steps.
    """
    plot = Plot("phases", "Step time by phase",
                "Top: shares of the summed step time of the analyzed steps (the report’s shares). Below: "
                "each step split into its phases, in milliseconds; “other host” is the rest of the step "
                "(logging, metrics, copies, syncs). Faded bars are steps left out of the metrics.")
    n = len(steps.get("i", ()))
    if not n or not bars:
        plot.why = why
        return plot
    phases = [p for p in PHASES if p in bars["ms"]]
    values = bars["ms"]
    i = np.asarray(steps["i"])
    opacity = [1.0 if kept else 0.35 for kept in bars["analyzed"]]
    k = bars["k"]
    if k == 1:
        x = i.tolist()
        width = None
        hover = [f"step {s}" + (f" (left out: {LEFT_OUT_REASONS[c]})" if c else "")
                 for s, c in zip(x, _left_out(left_out, n).tolist())]
    else:
        first, last = i[bars["start"]], i[np.asarray(bars["stop"]) - 1]
        x = [float(a + b) / 2 for a, b in zip(first.tolist(), last.tolist())]
        hover = [f"steps {a}–{b}: mean of {u} step(s)" for a, b, u in zip(first.tolist(), last.tolist(), bars["used"])]
        width = k * 0.9
        plot.notes.append(f"{n:,} steps binned into {len(x)} bars of {k} steps; each bar is the mean step of its "
                          "analyzed steps.")
    fig = _Figure(row_heights=[0.16, 0.84], vertical_spacing=0.12)
    for p in phases:
        label, colour = PHASES[p]
        share = (shares or {}).get(p)
        if share is not None:
            fig.add({"type": "bar", "y": ["share"], "x": [round(share * 100, 2)], "orientation": "h", "name": label,
                     "legendgroup": p, "showlegend": False, "marker": {"color": colour},
                     "text": [f"{share:.0%}" if share >= 0.04 else ""], "textposition": "inside",
                     "hovertemplate": f"{label}: %{{x:.1f}}%<extra></extra>"}, row=1)
        bars = {"type": "bar", "x": x, "y": _clean(values[p], 3), "name": label, "legendgroup": p,
                "marker": {"color": colour, "opacity": opacity, "line": {"width": 0}}, "customdata": hover,
                "hovertemplate": f"%{{customdata}}<br>{label}: %{{y:.1f}} ms<extra></extra>"}
        if width is not None:
            bars["width"] = width
        fig.add(bars, row=2)
    fig.axis("x", 1, range=[0, 100], title=_title("percent of step time (analyzed steps)"))
    fig.axis("y", 1, showticklabels=False)
    fig.axis("x", 2, title=_title("step"))
    top = _y_top(sum(np.asarray(values[p], float) for p in phases), np.asarray(opacity) == 1.0)
    fig.axis("y", 2, title=_title("ms"), **({"range": [0, top]} if top is not None else {}))
    if top is not None:
        plot.notes.append("Left-out steps taller than the axis are cut off at the top: double-click the plot to "
                          "see them whole.")
    plot.figure = fig.done(height=460, barmode="stack", bargap=0.05, hovermode="closest")
    return plot


def _split_hover(part: dict) -> str:
    """The start-up's split for the hover (``<br>imports 4.2 s · set-up 3.3 s · first step 0.2 s``),
    or ``""`` for other parts and unsampled start-ups."""
    split = part.get("split") or {}
    if not split.get("sampled"):
        return ""
    pieces = ((split["framework_import_s"] + split["imports_s"], "imports"), (split["program_s"], "the program's set-up"),
              (split.get("framework_s", 0.0), "the framework's start"), (split.get("compile_s", 0.0), "torch.compile"),
              (split["first_step_s"], "first step"))
    return "<br>" + " · ".join(f"{label} {s:.1f} s" for s, label in pieces)


def time_plot(time: dict | None, why: str = "The command's wall time was not split (no training process was observed).") -> Plot:
    """The command's wall time by part: one 100 % bar of ``metrics.time.parts`` (seconds and share
    in the hover), so time outside the training steps (evaluation, checkpoints, epoch boundaries,
    start-up) is seen beside the steps."""
    plot = Plot("time", "Wall time by part",
                "Every second of the command in one part: start-up (to the first step), the training steps, "
                "torch.compile's later compilations, evaluation, checkpoint saving, tracker logging, DataLoader "
                "restarts at epoch boundaries and "
                "teardown (after the last step).")
    parts = (time or {}).get("parts") or {}
    if not parts:
        plot.why = why
        return plot
    fig = _Figure()
    for key, (label, colour) in TIME_PARTS.items():
        p = parts.get(key)
        if not p or p["s"] <= 0:
            continue
        fig.add({"type": "bar", "y": ["wall"], "x": [round(p["share"] * 100, 2)], "orientation": "h", "name": label,
                 "marker": {"color": colour}, "text": [f"{p['share']:.0%}" if p["share"] >= 0.04 else ""],
                 "textposition": "inside", "customdata": [[round(p["s"], 2), p["count"]]],
                 "hovertemplate": f"{label}: %{{customdata[0]}} s (%{{x:.1f}}%){_split_hover(p)}<extra></extra>"})
    fig.axis("x", 1, range=[0, 100], title=_title(f"percent of the command's {time['wall_s']:.1f} s"))
    fig.axis("y", 1, showticklabels=False)
    plot.figure = fig.done(height=170, barmode="stack", hovermode="closest")
    return plot


def idle_cause_plot(gpu: dict | None, why: str) -> Plot:
    """Seconds the GPU was starved, by cause (``metrics.gpu.idle_s_by_cause``), as horizontal bars.

    Args:
        gpu: ``metrics.gpu`` of the report (or None).
        why: the sentence shown when idle by cause was not measured.
    """
    plot = Plot("idle", "GPU idle by cause",
                "Seconds of the analyzed steps in which the GPU had no queued work from the training stream "
                "(measured with CUDA events, never a synchronize), by what the host was doing meanwhile.")
    by = (gpu or {}).get("idle_s_by_cause")
    if not by:
        plot.why = why
        return plot
    causes = [c for c in IDLE_CAUSES if by.get(c) is not None]
    shares = (gpu or {}).get("idle_share_by_cause") or {}
    fig = _Figure()
    fig.add({"type": "bar", "y": [IDLE_CAUSES[c][0] for c in causes], "x": [round(by[c], 4) for c in causes],
             "orientation": "h", "marker": {"color": [IDLE_CAUSES[c][1] for c in causes]},
             "text": [f"{by[c]:.2f} s" + (f" ({shares[c]:.0%} of step time)" if shares.get(c) is not None else "")
                      for c in causes], "textposition": "auto", "hovertemplate": "%{x:.3f} s<extra></extra>"})
    plot.figure = fig.done(height=80 + 44 * len(causes), showlegend=False, hovermode="closest",
                           xaxis={"title": _title("seconds starved"), "rangemode": "tozero"},
                           yaxis={"autorange": "reversed"})
    return plot


#: Colours of the verdicts in the windows plot (healthy ones green, the rest by kind).
_VERDICT_COLOURS = {"device_bound": "#54a24b", "small_workload": "#88d27a", "no_steps": "#bab0ac",
                    "input_bound": "#e45756", "host_bound": "#f58518", "sync_bound": "#b279a2",
                    "eval_bound": "#72b7b2", "checkpoint_bound": "#9d755d", "imbalance": "#4c78a8"}


def windows_plot(report: dict) -> Plot:
    """The rolling diagnosis over the job's time (``report.windows``): one bar per window coloured
    by its verdict (top), the data-wait and host shares of step time and the GPU idle share of
    each window (middle, percent) and its samples/s (bottom), so a job that was healthy for hours
    and then went input-bound, or slowed down keeping its verdict, shows when."""
    plot = Plot("windows", "Verdict over time",
                "The job cut into windows (whyidle run --window), each analyzed and diagnosed on its own: its "
                "verdict, and what share of its steps waited for data or ran other host work, and how much of it "
                "the GPU was idle.")
    windows = [w for w in report.get("windows") or [] if w.get("steps")]
    if len(windows) < 2:
        plot.why = ("The run was recorded without windows (whyidle run writes one every --window seconds)."
                    if not windows else "The run fits in one window: the report above is its diagnosis.")
        return plot
    fig = _Figure(row_heights=[1, 3, 2], vertical_spacing=0.06, shared_xaxes=True)
    seen = set()
    for w in windows:
        v = w.get("verdict") or "?"
        fig.add({"type": "bar", "x": [round((w["start_s"] + w["end_s"]) / 2, 2)], "y": [1],
                 "width": [max(0.01, w["end_s"] - w["start_s"])], "name": v, "legendgroup": v,
                 "showlegend": v not in seen, "marker": {"color": _VERDICT_COLOURS.get(v, "#bab0ac")},
                 "hovertemplate": f"{w['start_s']:.0f}–{w['end_s']:.0f} s: {v}"
                                  f"{' — ' + w['title'] if w.get('title') else ''}<extra></extra>"}, row=1)
        seen.add(v)
    mid = [round((w["start_s"] + w["end_s"]) / 2, 2) for w in windows]
    lines = [("data wait", "#e45756", [(w.get("shares") or {}).get("data_wait") for w in windows]),
             ("other host", "#f58518", [(w.get("shares") or {}).get("other_host") for w in windows]),
             ("GPU idle", "#4c78a8", [(w.get("gpu") or {}).get("idle_share") if (w.get("gpu") or {}).get("idle_share")
                                      is not None else (None if (w.get("gpu") or {}).get("util_mean") is None
                                                        else 1 - w["gpu"]["util_mean"] / 100) for w in windows])]
    for name, colour, ys in lines:
        if all(y is None for y in ys):
            continue
        fig.add({"type": "scatter", "mode": "lines+markers", "x": mid,
                 "y": [None if y is None else round(100 * y, 2) for y in ys], "name": name,
                 "line": {"color": colour}, "hovertemplate": f"{name} %{{y:.0f}}%<extra></extra>"}, row=2)
    sps = [w.get("samples_per_s") for w in windows]
    if any(v is not None for v in sps):
        fig.add({"type": "scatter", "mode": "lines+markers", "x": mid, "y": sps, "name": "samples/s",
                 "line": {"color": "#54a24b"}, "hovertemplate": "%{y:,.1f} samples/s<extra></extra>"}, row=3)
    fig.axis("y", 1, showticklabels=False, range=[0, 1])
    fig.axis("y", 2, title=_title("percent"), rangemode="tozero")
    fig.axis("y", 3, title=_title("samples/s"), rangemode="tozero")
    fig.axis("x", 3, title=_title("seconds since the command started"))
    for t in report.get("deep_traces") or []:
        if t.get("start_s") is not None:
            fig.layout.setdefault("shapes", []).append(
                {"type": "line", "x0": t["start_s"], "x1": t["start_s"], "xref": "x2", "y0": 0, "y1": 1,
                 "yref": "y2 domain", "line": {"color": "#444", "dash": "dot", "width": 1}})
    plot.figure = fig.done(height=400, barmode="overlay", bargap=0, hovermode="closest")
    plot.notes = [f"{label} {text}" if label.strip() else f"· {text}" for label, text in over_time_lines(report)]
    return plot


def workers_plot(workers: list[dict], window_s=None) -> Plot:
    """Which DataLoader worker built which batch, when: one row per worker process, one bar per
    batch from the fetch's start to the collated batch (:func:`whyidle.analysis.series.worker_batches`:
    each worker's last batches). A worker whose bars are long while the others' rows stay empty is
    holding the loop back (a few slow samples: head-of-line blocking)."""
    plot = Plot("workers", "DataLoader workers: which worker built which batch, when",
                "Each row is a DataLoader worker process, each bar a batch it built (from fetching its first "
                "sample to the collated batch), measured inside the workers. Gaps are the worker waiting for "
                "the next index: the loop hands out at most prefetch_factor × num_workers at once.")
    if not workers:
        plot.why = "No DataLoader worker recorded a batch (no workers, or a framework other than PyTorch)."
        return plot
    fig = _Figure()
    labels = [f"worker {w['worker']} ({w['pid']})" for w in workers]
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]
    for k, (w, label) in enumerate(zip(workers, labels)):
        dur_ms = _clean(np.asarray(w["dur_s"], dtype=np.float64) * 1e3, 3)
        fig.add({"type": "bar", "orientation": "h", "name": label, "y": [label] * len(dur_ms),
                 "base": _clean(w["start_s"], 4), "x": _clean(w["dur_s"], 6),
                 "customdata": [[int(i), int(n), d] for i, n, d in zip(w["i"], w["samples"], dur_ms)],
                 "marker": {"color": palette[k % len(palette)]}, "showlegend": False,
                 "hovertemplate": "batch %{customdata[0]}: %{customdata[1]} samples, %{customdata[2]} ms"
                                  "<extra>" + str(escape(label)) + "</extra>"})
    if any(len(w["i"]) and int(w["i"][0]) > 0 for w in workers):
        plot.notes.append("Each worker's last batches are drawn; the report's metrics.loader_workers covers all of "
                          "them.")
    fig.shade_window(window_s)
    layout = {"xaxis": {"title": _title(_TIME_AXIS)}, "yaxis": {"autorange": "reversed"},
              "bargap": 0.3, "hovermode": "closest", "showlegend": False}
    plot.figure = fig.done(height=90 + 36 * len(workers), **layout)
    return plot


def queue_plot(queue: dict | None, window_s=None) -> Plot:
    """How far ahead the DataLoader was when the loop asked for a batch, over time
    (:func:`whyidle.analysis.series.queue_depth`): the batches ready (mean per flush) against the
    most it may hold; the hover gives the fetches' mean wait and the share of it spent behind a slow
    batch (head-of-line blocking)."""
    plot = Plot("queue", "DataLoader queue: batches ready when the loop asked",
                "Batches received or waiting in the queue at the training loop's timed fetches (mean over each "
                "half second), against prefetch_factor × num_workers, the most the loader may hold. At zero the "
                "loop waits on the workers; at the cap the loader is ahead and the time is elsewhere.")
    if not queue:
        plot.why = "No multi-worker DataLoader fetch was sampled."
        return plot
    fig = _Figure()
    x = _clean(queue["t_s"], 3)
    wait = np.asarray(queue["wait_ms"], dtype=np.float64)
    behind = np.asarray(queue["behind"], dtype=np.float64) * 100
    custom = [[None if np.isnan(w) else round(float(w), 2), None if np.isnan(b) else round(float(b), 0)]
              for w, b in zip(wait, behind)]
    fig.add({"type": "scatter", "mode": "lines", "name": "batches ready", "x": x, "y": _clean(queue["ready"], 2),
             "line": {"color": "#1f77b4"}, "customdata": custom,
             "hovertemplate": "%{y} ready · wait %{customdata[0]} ms, %{customdata[1]} % of it behind a slow batch"
                              "<extra></extra>"})
    fig.add({"type": "scatter", "mode": "lines", "name": "prefetch_factor × num_workers", "x": [x[0], x[-1]],
             "y": [queue["cap"], queue["cap"]], "line": {"color": "#7f7f7f", "dash": "dash"}, "hoverinfo": "skip"})
    fig.shade_window(window_s)
    layout = {"xaxis": {"title": _title(_TIME_AXIS)}, "yaxis": {"title": _title("batches"), "rangemode": "tozero"},
              "hovermode": "closest"}
    plot.figure = fig.done(height=300, **layout)
    return plot
