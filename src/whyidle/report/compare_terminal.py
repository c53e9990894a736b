"""Terminal rendering of a ``whyidle compare`` result (rich): one column per run, then statements."""

from __future__ import annotations

import shlex
from typing import IO

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from whyidle.analysis.compare import metric_kind


def _ms(x) -> str:
    return "n/a" if x is None else f"{x * 1000:.1f} ms"


def _ci(ci, fmt) -> str:
    return f" [{fmt(ci[0])}–{fmt(ci[1])}]" if ci else ""


def _metric(name: str, v) -> str:
    """A logged metric's value: accuracy-like fractions as percent."""
    if v is None:
        return "—"
    return f"{v:.1%}" if metric_kind(name) == "higher" and 0 <= v <= 1 else f"{v:.4g}"


def comparison_table(result: dict) -> Table:
    """The table: a row per measure, a column per run (A first); intervals in brackets."""
    runs = result["runs"]
    level = round(result.get("ci_level", 0.95) * 100)
    table = Table(title="whyidle compare", title_justify="left", caption_justify="left",
                  caption=f"in brackets: {level} % bootstrap CI · n.s.: not a measurable change")
    table.add_column("")
    for r in runs:
        table.add_column(escape(f"{r['label']} · {r['name']}"), justify="right")
    by_run = {c["run"]: c for c in result["comparisons"]}

    def row(label, fn):
        table.add_row(label, *[fn(r) for r in runs])

    row("batch size", lambda r: "unknown" if r["batch_size"] is None else f"{r['batch_size']:g}")
    row("training steps", lambda r: str(r["stats"]["steps"])
        + (f" ({r['stats']['runs']} runs)" if r["stats"]["runs"] > 1 else ""))
    row("samples/s", lambda r: "n/a" if r["stats"]["samples_per_s"] is None else
        f"{r['stats']['samples_per_s']:.1f}" + _ci(r["stats"]["ci"]["samples_per_s"], lambda x: f"{x:.1f}"))
    row("step time p50", lambda r: _ms(r["stats"]["p50_s"]) + _ci(r["stats"]["ci"]["p50_s"], lambda x: f"{x * 1000:.1f}"))
    row("step time p90", lambda r: _ms(r["stats"]["p90_s"]) + _ci(r["stats"]["ci"]["p90_s"], lambda x: f"{x * 1000:.1f}"))
    row("data-wait share", lambda r: "n/a" if r["data_wait_share"] is None else f"{r['data_wait_share']:.0%}")
    row("GPU util mean", lambda r: "no GPU" if not r["gpu"] or r["gpu"]["util_mean"] is None
        else f"{r['gpu']['util_mean']:.0f} %")
    if any(r["gpu"] and r["gpu"]["util_trend"] for r in runs):
        row("GPU util over time", lambda r: " → ".join(f"{v:.0f}" for v in (r["gpu"] or {}).get("util_trend") or [])
            + (" %" if r["gpu"] and r["gpu"]["util_trend"] else "—"))
    row("verdict", lambda r: r["verdict"])
    for name in sorted({n for r in runs for n in r["metrics"]}):
        row(escape(name), lambda r, n=name: _metric(n, r["metrics"].get(n)))

    def speed(r):
        c = by_run.get(r["label"])
        if c is None:
            return "baseline"
        sp = c["speedup"]
        if sp["ratio"] is None:
            return "not comparable"
        per = " /sample" if c["basis"] == "sample" else ""
        mark = "" if sp["claim"] != "none" else " (n.s.)"
        return f"{sp['ratio']:.2f}×{per}" + _ci(sp["ci"], lambda x: f"{x:.2f}") + mark

    row(f"speed-up vs {runs[0]['label']}", speed)
    return table


def render(result: dict, file: IO | None = None) -> None:
    """Prints the table, one statement per compared run, and the problems."""
    console = Console(file=file, highlight=False, soft_wrap=False)
    console.print(comparison_table(result))
    for r in result["runs"]:
        console.print(f"[dim]{r['label']}: {escape(shlex.join(r['command']))}  ({escape(', '.join(r['run_dirs']))})[/]")
    for c in result["comparisons"]:
        if c["basis"] == "sample":
            console.print(f"[dim]{escape(c['run'])}: {escape(c['basis_reason'])}.[/]")
        console.print(f"[bold]{escape(c['statement'])}[/]")
    for p in result.get("problems") or []:
        console.print(f"[yellow]note:[/] {escape(p)}")
