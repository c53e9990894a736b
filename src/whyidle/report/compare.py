"""``whyidle compare``: saved runs → one comparison (``whyidle.compare/1``) with plain statements.

Each run directory is analyzed as ``whyidle report`` would (nothing is re-run); the statistics
and their definitions are in :mod:`whyidle.analysis.compare`. The first usable run is the
baseline A; every other run is compared with it.
"""

from __future__ import annotations

import os

from whyidle.analysis import compare as cmp
from whyidle.analysis.gpu import util_series

SCHEMA = "whyidle.compare/1"
#: GPU utilization over time is summarized as the means of this many equal parts of the analyzed
#: window (first part → last part shows a trend that one mean hides).
GPU_TREND_PARTS = 4


_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


class CompareError(Exception):
    """Nothing can be compared; ``str(err)`` is a one-line explanation (exit 2)."""


def _script(command: list) -> str | None:
    from whyidle.run.session import default_name

    return default_name(list(command)) if command else None


def summarize_run(path: str) -> dict:
    """Loads and analyzes one run directory into the per-run part of a comparison.

    Returns ``{"label", "run_dir", "command", "script", "framework", "device", "batch_size",
    "stats"`` (:func:`whyidle.analysis.compare.run_stats`), ``"data_wait_share"``, ``"verdict"``,
    ``"gpu"`` (``{"util_mean", "util_trend"}`` in percent, or None without a GPU), ``"metrics"``
    (name → last logged value), ``"metrics_n"`` (name → examples behind it, when logged)``}``.
    Errors: :class:`whyidle.record.reader.RunDirError` (missing, older format, corrupt);
    ``ValueError`` when the run has no analyzable steps.
    """
    from whyidle.analysis.run import analyze
    from whyidle.diagnose import diagnose
    from whyidle.record.reader import load_run
    from whyidle.report.build import gpu_metrics_of

    run = load_run(path)
    facts = analyze(run)
    steps = facts.get("analyzed_steps") or []
    if not steps:
        total = (facts.get("steps_info") or {}).get("total", 0)
        raise ValueError(f"{path}: no training steps to compare ({total} step(s) recorded)"
                         if total else f"{path}: no training steps were recorded")
    verdict, _ = diagnose(facts)
    step = facts["step"]
    gpu = gpu_metrics_of(facts)
    trend = [round(v, 1) for _, v in util_series(run.gpu, tuple(step["window"]), max_points=GPU_TREND_PARTS)]
    meta = run.meta
    return {
        "label": meta.get("name") or os.path.basename(os.path.normpath(path)),
        "run_dir": path,
        "command": meta.get("command") or [],
        "script": _script(meta.get("command") or []),
        "framework": facts.get("framework"),
        "device": (facts.get("device") or {}).get("name"),
        "batch_size": step.get("batch_size"),
        "stats": cmp.run_stats([(s["t1"] - s["t0"]) / 1e9 for s in steps], [s.get("samples") for s in steps]),
        "data_wait_share": (step.get("shares") or {}).get("data_wait"),
        "verdict": verdict,
        "gpu": {"util_mean": gpu.get("util_mean"), "util_trend": trend} if gpu else None,
        "metrics": {name: m["last"] for name, m in (facts.get("logged") or {}).items()},
        "metrics_n": {name: m["n"] for name, m in (facts.get("logged") or {}).items() if m.get("n")},
        "problems": list(run.problems),
    }


def _pct(x) -> str:
    return "n/a" if x is None else f"{x:.0%}"


def _metric_value(change: dict, which: str) -> str:
    v = change[which]
    return f"{v * 100:.1f} %" if change["unit"] == "pt" and max(abs(change["a"]), abs(change["b"])) <= 1 else f"{v:.4g}"


def metric_phrase(change: dict) -> str:
    """One phrase for a metric's move, e.g. ``val_accuracy unchanged within 0.4 pt (91.2 % → 90.8 %)``."""
    name, a, b = change["name"], _metric_value(change, "a"), _metric_value(change, "b")
    size = f"{abs(change['change']):.1f} pt" if change["unit"] == "pt" else f"{abs(change['change']):.1%}"
    if change["unchanged"]:
        noise = (f"; differences up to {change['tolerance']:.1f} pt are noise on this many examples"
                 if change["tolerance_from"] == "binomial" else "")
        return f"{name} unchanged within {size} ({a} → {b}{noise})"
    sign = "+" if change["delta"] > 0 else "−"
    verdict = {True: "better", False: "worse", None: "changed"}[change["better"]]
    return f"{name} {verdict}: {a} → {b} ({sign}{size})"


def _who(run: dict) -> str:
    return f"{run['label']} ({run['name']})" if run.get("name") else run["label"]


def statement(base: dict, other: dict, comp: dict) -> str:
    """The plain sentence for one comparison, e.g. "B is 2.3× faster (95 % CI 2.1–2.5), data wait
    61 % → 4 %, val_accuracy unchanged within 0.2 pt (…)"."""
    sp = comp["speedup"]
    who, ref = _who(other), _who(base)
    if sp["ratio"] is None:
        head = f"{who} cannot be compared with {ref}: {comp['basis_reason']}"
    else:
        r, ci = sp["ratio"], sp["ci"]
        ci_text = f" (95 % CI {ci[0]:.2f}–{ci[1]:.2f})" if ci else " (too few steps for an interval)"
        per = " per sample" if comp["basis"] == "sample" else ""
        if ci and ci[0] <= 1 <= ci[1]:
            head = f"{who} is not measurably faster or slower than {ref}{per}: {r:.2f}×{ci_text}"
        elif r >= 1:
            head = f"{who} is {r:.2f}× faster{per} than {ref}{ci_text}"
        else:
            inv = f" (95 % CI {1 / ci[1]:.2f}–{1 / ci[0]:.2f})" if ci else ""
            head = f"{who} is {1 / r:.2f}× slower{per} than {ref}{inv}"
    parts = [head]
    if base["data_wait_share"] is not None and other["data_wait_share"] is not None:
        parts.append(f"data wait {_pct(base['data_wait_share'])} → {_pct(other['data_wait_share'])}")
    primary = next((c for c in comp["metrics"] if c["name"] == comp.get("primary_metric")), None)
    if primary:
        parts.append(metric_phrase(primary))
    return ", ".join(parts) + "."


def compare_runs(paths: list[str]) -> dict:
    """Compares saved runs; the first usable one is the baseline.

    Returns the ``whyidle.compare/1`` dict: ``runs`` (per run: :func:`summarize_run` without
    bootstrap internals; ``label`` is its letter A, B, ... and ``name`` the run's name),
    ``comparable`` (False when no run could be compared with A), ``comparisons`` (per other run: ``{"run", "basis"`` (``"step"``,
    ``"sample"`` or None), ``"basis_reason"``, ``"speedup"`` ({ratio, ci, metric}),
    ``"metrics"`` (:func:`whyidle.analysis.compare.metric_change` of each metric both runs
    logged), ``"primary_metric"``, ``"statement"``}), ``problems`` (one line per run left out
    or metric not comparable).
    Errors: :class:`CompareError` when fewer than two runs are usable (26 at most).
    """
    from whyidle.record.reader import RunDirError

    runs, problems = [], []
    for path in paths[:len(_LETTERS)]:
        try:
            runs.append(summarize_run(path))
        except (RunDirError, ValueError) as exc:
            problems.append(f"{exc}; left out")
    if len(runs) < 2:
        raise CompareError("nothing to compare: " + ("; ".join(problems) if problems else "give at least two run directories")
                           + (f" ({len(runs)} usable run)" if runs else ""))
    for letter, r in zip(_LETTERS, runs):
        r["name"], r["label"] = r["label"], letter
    base = runs[0]
    comparisons = []
    for other in runs[1:]:
        basis, reason = cmp.comparison_basis(base, other)
        sp = cmp.speedup(base["stats"], other["stats"], basis) if basis else {"ratio": None, "ci": None, "metric": None}
        common = sorted(set(base["metrics"]) & set(other["metrics"]))
        for name in sorted(set(base["metrics"]) ^ set(other["metrics"])):
            where = other["label"] if name in other["metrics"] else base["label"]
            problems.append(f"metric {name!r} was logged in {where} only; not compared")
        changes = [c for c in (cmp.metric_change(n, base["metrics"][n], other["metrics"][n], base["metrics_n"].get(n),
                                                 other["metrics_n"].get(n)) for n in common) if c]
        comp = {"run": other["label"], "basis": basis, "basis_reason": reason, "speedup": sp, "metrics": changes,
                "primary_metric": cmp.primary_metric([c["name"] for c in changes])}
        comp["statement"] = statement(base, other, comp)
        comparisons.append(comp)
    for r in runs:
        r["stats"] = {k: v for k, v in r["stats"].items() if not k.startswith("_")}
        problems += [f"{r['label']}: {p}" for p in r.pop("problems")]
    return {"schema": SCHEMA, "baseline": base["label"], "runs": runs, "comparisons": comparisons,
            "comparable": any(c["speedup"]["ratio"] is not None for c in comparisons),
            "ci_level": cmp.CI_LEVEL, "bootstrap_resamples": cmp.BOOTSTRAP_RESAMPLES, "problems": problems}
