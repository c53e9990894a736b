"""``tune.html``: one self-contained page for a ``whyidle.tune/1`` result: the winner's code change,
a bar chart of every trial's throughput ratio with its interval (inline SVG, no script) and the
ranked table. Jinja2 with autoescape on: every string from the run is HTML-escaped."""

from __future__ import annotations

import shlex

import jinja2

_ENV = jinja2.Environment(loader=jinja2.PackageLoader("whyidle.report", "templates"), autoescape=True,
                          undefined=jinja2.StrictUndefined)
#: Chart geometry, pixels.
LABEL_W, BAR_W, ROW_H = 330, 520, 24
#: Characters of a trial's label in the chart (~6.5 px each at 12 px), the rest cut to "…".
LABEL_CHARS = 46


def _chart(trials: list[dict]) -> dict:
    """Bars of the measured trials: width ∝ ratio (the axis spans 0 to the largest interval end)."""
    shown = [t for t in trials if t["ratio"] is not None]
    top = max([1.0] + [t["ratio"] for t in shown] + [t["ratio_ci"][1] for t in shown if t["ratio_ci"]]) * 1.05
    scale = BAR_W / top
    bars = []
    for i, t in enumerate(shown):
        lo, hi = t["ratio_ci"] or (None, None)
        text = t["label"] if len(t["label"]) <= LABEL_CHARS else t["label"][:LABEL_CHARS - 1] + "…"
        bars.append({"y": i * ROW_H, "label": text, "w": round(t["ratio"] * scale, 1),
                     "color": {"faster": "#2f9e55", "slower": "#d0513d"}.get(t["claim"], "#9aa4b2"),
                     "lo": None if lo is None else round(LABEL_W + lo * scale, 1),
                     "hi": None if hi is None else round(LABEL_W + hi * scale, 1),
                     "text": f"{t['ratio']:.2f}×",
                     "text_x": round(max(t["ratio"], hi or 0) * scale + LABEL_W + 6, 1)})
    return {"bars": bars, "width": LABEL_W + BAR_W + 80, "height": max(ROW_H, ROW_H * len(bars)),
            "label_w": LABEL_W, "one": round(LABEL_W + scale, 1)}


def render_html(res: dict) -> str:
    """The page for ``res`` (``whyidle.tune/1``) as text."""
    helpers = {
        "x": lambda v: "—" if v is None else f"{v:.2f}×",
        "ci": lambda c, d=2: f" [{c[0]:.{d}f}–{c[1]:.{d}f}]" if c else "",
        "rate": lambda v: "—" if v is None else f"{v:.1f}",
        "pct": lambda v: "—" if v is None else f"{v:.0%}",
    }
    return _ENV.get_template("tune.html.j2").render(
        res=res, chart=_chart(res["trials"]), command=shlex.join(res["command"]),
        title=res.get("name") or "", **helpers)
